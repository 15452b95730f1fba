"""Row-reduction prologues: a softmax (or a narrow layer norm) stitched into the GEMM reading it.

Scope decisions on small Relax graphs, the tile plan, CPU numerics of the fused graph against
the baseline, and the CUDA of the scheduled kernel (one kernel, the operand rows in shared
memory, compiled by nvcc for sm_80 and sm_90a-class targets).
"""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_ext.tir as ttir
from tvm_ext.graph import OpGraph
from tvm_ext.hardware import load_device
from tvm_ext.driver import graph_passes, preset_pipeline
from tvm_ext.select import SelectionContext, boundary_bytes
from tvm_ext.stitch import StitchGenerator
from tvm_ext.toolchain import compile_cuda_source, nvcc_available
from tvm_ext.stitch.prologue import row_operand_read
from tvm_ext.stitch.prologue_schedule import PrologueTiles, build_prologue_schedule, plan_prologue_tiles
from tvm_ext.stitch.schedule import StitchScheduleError
from tvm_ext.stitch.scope import stitch_scope
from tvm_ext.testing.oracle import run_cpu
from tvm_ext.checks.thread_serial import call_inputs, compare_scheduled

from test_stitch_kernels import _module, _scheduled, _stitch_rules

TARGETS = ["tvm_ext/a100", "tvm_ext/h100"]


def attention(heads=4, seq=128, dim=64, axis=-1, also_return_probs=False, swap=False, dtype="float32"):
    """scores = q @ k^T * 0.125, p = softmax(scores, axis), out = p @ v (or v^T @ p with ``swap``)."""
    t = relax.TensorType
    q, k, v = (relax.Var(n, t((1, heads, seq, dim), dtype)) for n in "qkv")

    def body(q, k, v):
        scores = relax.op.multiply(relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2])),
                                   relax.const(0.125, dtype))
        p = relax.op.nn.softmax(scores, axis=axis)
        out = relax.op.matmul(relax.op.permute_dims(v, [0, 1, 3, 2]), p) if swap else relax.op.matmul(p, v)
        return relax.Tuple([out, p]) if also_return_probs else out
    return _module([q, k, v], body)


def norm_then_gemm(rows=197, hidden=384, columns=64, dtype="float32"):
    t = relax.TensorType
    x, g, b, w = relax.Var("x", t((1, rows, hidden), dtype)), relax.Var("g", t((hidden,), dtype)), \
        relax.Var("b", t((hidden,), dtype)), relax.Var("w", t((hidden, columns), dtype))
    return _module([x, g, b, w], lambda x, g, b, w: relax.op.matmul(relax.op.nn.layer_norm(x, g, b, axes=[-1]), w))


def narrow_mlp(rows=197, hidden=384, columns=128, dtype="float32"):
    """layer_norm -> matmul -> bias add -> GELU: a transformer MLP whose first layer is narrow."""
    t = relax.TensorType
    x, g, b = relax.Var("x", t((1, rows, hidden), dtype)), relax.Var("g", t((hidden,), dtype)), \
        relax.Var("b", t((hidden,), dtype))
    w, bias = relax.Var("w", t((hidden, columns), dtype)), relax.Var("bias", t((columns,), dtype))
    return _module([x, g, b, w, bias], lambda x, g, b, w, bias: relax.op.nn.gelu(
        relax.op.add(relax.op.matmul(relax.op.nn.layer_norm(x, g, b, axes=[-1]), w), bias)))


def _legalized(mod):
    target = tvm.target.Target("tvm_ext/h100")
    passes = []
    from tvm.relax.backend.cuda import pipeline as cuda
    for p in cuda.library_dispatch_passes(target) + cuda.legalize_passes(target):
        if p.info.name == "FuseOps":
            break
        passes.append(p)
    with target:
        return tvm.transform.Sequential(passes)(mod)


def _kinds(mod) -> list[tuple[str, list[str]]]:
    graph = OpGraph.from_module(_legalized(mod))
    scope = stitch_scope(graph)
    return [(g.kind, [graph.nodes[i].func_name for i in g.nodes]) for g in scope.groups]


def test_softmax_joins_the_gemm_that_reads_its_rows():
    kinds = _kinds(attention())
    prologue = [names for kind, names in kinds if kind == "prologue"]
    assert len(prologue) == 1 and any("softmax" in n for n in prologue[0]) and \
        sum("matmul" in n for n in prologue[0]) == 1
    assert not any(kind == "single" and any("softmax" in n for n in names) for kind, names in kinds)


@pytest.mark.parametrize("case", [dict(also_return_probs=True), dict(axis=-2), dict(swap=True), dict(dim=512)],
                         ids=["probs-escape", "softmax-over-rows", "column-operand", "too-wide"])
def test_softmax_stays_alone_without_row_locality(case):
    kinds = _kinds(attention(**case))
    assert all(kind != "prologue" for kind, _ in kinds), kinds


def test_narrow_layer_norm_joins_its_gemm_and_a_wide_one_does_not():
    assert any(kind == "prologue" for kind, _ in _kinds(norm_then_gemm(columns=64)))
    assert all(kind != "prologue" for kind, _ in _kinds(norm_then_gemm(columns=3072)))


@pytest.mark.parametrize("columns,joins", [(256, True), (264, False)])
def test_column_cap_at_its_boundary(columns, joins):
    """The block multiplies whole output rows of at most MAX_COLUMNS = 256 columns."""
    assert any(kind == "prologue" for kind, _ in _kinds(norm_then_gemm(columns=columns))) == joins


@pytest.mark.parametrize("dtype,hidden,joins", [("float32", 2048, True), ("float32", 2056, False),
                                                ("float16", 4096, True), ("float16", 4112, False)])
def test_shared_memory_budget_at_its_boundary(dtype, hidden, joins):
    """BM_MIN = 4 rows of the operand must fit 32 KiB of shared memory: 4 x 2048 x 4 B, 4 x 4096 x 2 B."""
    assert any(kind == "prologue" for kind, _ in _kinds(norm_then_gemm(hidden=hidden, dtype=dtype))) == joins


@pytest.mark.parametrize("make", [lambda: narrow_mlp(), lambda: narrow_mlp(rows=77, hidden=192, columns=256),
                                  lambda: attention(heads=8, seq=197, dim=128),
                                  lambda: attention(heads=6, seq=77, dim=128, dtype="float16"),
                                  lambda: narrow_mlp(rows=50, hidden=320, columns=96, dtype="float16")],
                         ids=["mlp-gelu", "mlp-256", "head128", "head128-fp16", "mlp-gelu-fp16"])
def test_prologue_kernel_builds_and_matches_serialized(make):
    """The kernel lowers (a GELU epilogue reads its input twice) and, run thread-serialized on the
    CPU, computes what its unscheduled function computes."""
    target = tvm.target.Target("tvm_ext/h100")
    with target:
        fused = graph_passes("stitch", target)(make())
    scheduled = _scheduled(make(), target)
    rules = _stitch_rules(scheduled)
    names = [n for n, r in rules.items() if r == "stitched+gemm_prologue"]
    assert names and not [r for r in rules.values() if r == "fallback"], rules
    for name in names:
        check = compare_scheduled(fused[name], scheduled[name], inputs=call_inputs(fused, name))
        assert check.ok, (name, check)


def test_row_operand_read_on_a_batch_matmul():
    legal = _legalized(attention())
    funcs = [f for gv, f in legal.functions_items() if gv.name_hint.startswith("matmul")
             and isinstance(f, tvm.tirx.PrimFunc)]
    reads = [(row_operand_read(f, 0), row_operand_read(f, 1)) for f in funcs]
    # q @ k^T reads q as rows of 64, p @ v reads p as rows of 128; the second operands are column operands
    assert sorted((a.rows, a.row_length, a.columns) for a, _ in reads) == [(512, 64, 128), (512, 128, 64)]
    assert all(b is None for _, b in reads)


def _context(mod) -> SelectionContext:
    legal = _legalized(mod)
    return SelectionContext(legal, "main", OpGraph.from_module(legal), load_device("h100"),
                            tvm.target.Target("tvm_ext/h100"))


def _prologue_func(mod):
    ctx = _context(mod)
    (cand,) = [c for c in StitchGenerator().candidates(ctx) if c.plan.group == "prologue"]
    return ctx.fused_function(cand.nodes)


def test_tile_plan_fills_the_gpu_and_fits_shared_memory():
    func = _prologue_func(attention(heads=12, seq=128))
    tiles = plan_prologue_tiles(func, load_device("h100"))
    # 12 x 128 rows: 16-row tiles give 96 blocks < 132 SMs, 8-row tiles 192
    assert (tiles.rows_per_block, tiles.grid, tiles.shared_bytes) == (8, 192, 8 * 128 * 4)
    assert tiles.threads_x == 32 and tiles.threads_y * tiles.threads_x <= 1024


def test_builder_refuses_a_plain_gemm():
    t = relax.TensorType
    mod = _legalized(_module([relax.Var("a", t((64, 64), "float32")), relax.Var("b", t((64, 64), "float32"))],
                             lambda a, b: relax.op.matmul(a, b)))
    func = next(f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc))
    with pytest.raises(StitchScheduleError, match="row operand"):
        plan_prologue_tiles(func, load_device("h100"))
    with pytest.raises(StitchScheduleError, match="row operand"):
        build_prologue_schedule(func, PrologueTiles(8, 4, 32, 8, 8 * 64 * 4))


@pytest.mark.parametrize("make", [lambda: attention(), lambda: norm_then_gemm()], ids=["attention", "norm-gemm"])
def test_fused_graph_matches_baseline_on_cpu(make):
    mod = make()
    rng = np.random.default_rng(0)
    inputs = {p.name: rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32")
              for p in mod["main"].params}
    base = run_cpu(mod, inputs, preset="baseline")
    ours = run_cpu(mod, inputs, preset="stitch")
    np.testing.assert_allclose(ours[0], base[0], rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not nvcc_available(), reason="nvcc / CUDA toolkit not found")
@pytest.mark.parametrize("make", [lambda: attention(heads=12, seq=197), lambda: norm_then_gemm()],
                         ids=["attention-197", "norm-gemm"])
@pytest.mark.parametrize("target_name", TARGETS)
def test_prologue_kernel_is_one_kernel_with_shared_rows(make, target_name):
    target = tvm.target.Target(target_name)
    mod = make()
    scheduled = _scheduled(mod, target)
    with target:
        ex = tvm.compile(mod, target, relax_pipeline=preset_pipeline("stitch", target), tir_pipeline=ttir.PIPELINE_NAME)
    assert "stitched+gemm_prologue" in _stitch_rules(scheduled).values()
    src = ex.mod.imports[0].imports[0].inspect_source()
    fused = [line for line in src.splitlines() if "__global__" in line and "{" in line and "matmul" in line
             and ("softmax" in line or "layer_norm" in line)]
    assert len(fused) == 1
    body = src[src.index(fused[0]):]
    body = body[:body.index("\n}\n")]
    assert "__shared__" in body and "__syncthreads()" in body and "__shfl_down_sync" in body
    compile_cuda_source(src, target)


def test_candidates_offer_the_softmax_alone_and_inside_the_gemm():
    ctx = _context(attention(heads=12))
    kinds = {c.plan.group: c for c in StitchGenerator().candidates(ctx)}
    assert set(kinds) == {"single", "prologue"}
    alone, inside = kinds["single"], kinds["prologue"]
    assert set(alone.nodes) < set(inside.nodes)
    gemm = set(inside.nodes) - set(alone.nodes)               # P @ V with its layout epilogue
    separate = alone.global_bytes + boundary_bytes(ctx.graph, gemm)
    assert separate - inside.global_bytes == 2 * 12 * 128 * 128 * 4      # the probabilities' round trip
    assert isinstance(inside.plan.tiles, PrologueTiles) and inside.plan.tiles.rows_per_block == 8
    assert inside.launch.grid == inside.plan.tiles.grid


def test_a_refused_prologue_is_reported_and_still_builds(monkeypatch):
    """If the builder refuses a prologue group, dlight schedules it as separate kernels and the
    report says so; the module still compiles."""
    from tvm_ext.inspect import inspect
    from tvm_ext.stitch import generator

    def refuse(func, tiles):
        raise StitchScheduleError("refused for the test")

    monkeypatch.setattr(generator, "build_prologue_schedule", refuse)
    report = inspect(attention(), "tvm_ext/h100", "stitch")
    found = [f for f in report.fallback_ops if f.kind == "marked"]
    assert len(found) == 1 and "refused for the test" in found[0].reason and "softmax" in found[0].op
    assert report.schedule_rules[found[0].op] == "Fallback"
    assert report.kernels > 3                       # the group's blocks run as several kernels


def test_remote_stitching_leaves_the_prologue_alone():
    """An independent layer norm could be remote-stitched with the softmax; the softmax goes
    into its GEMM instead and the norm stays its own group."""
    t = relax.TensorType
    q, k, v = (relax.Var(n, t((1, 4, 128, 64), "float32")) for n in "qkv")
    x, g, b = relax.Var("x", t((128, 256), "float32")), relax.Var("g", t((256,), "float32")), \
        relax.Var("b", t((256,), "float32"))

    def body(q, k, v, x, g, b):
        p = relax.op.nn.softmax(relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2])), axis=-1)
        return relax.Tuple([relax.op.matmul(p, v), relax.op.nn.layer_norm(x, g, b, axes=[-1])])

    kinds = _kinds(_module([q, k, v, x, g, b], body))
    assert [names for kind, names in kinds if kind == "prologue"]
    assert ("single", ["layer_norm"]) in kinds
    assert stitch_scope(OpGraph.from_module(_legalized(_module([q, k, v, x, g, b], body))),
                        gemm_prologues=False).stitched            # without prologues the two are remote-stitched
