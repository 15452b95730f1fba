"""Gathers in tile graphs: an embedding lookup joins the sum and layer norm that read it.

A ``take`` reads the table rows its indices name, which only data decides. A tile of the
lookup's output still reads one row per index, so it is priced and fitted on that (the analysis
layer's representative tile), not on the whole table: the lookup connects to its readers as one
kernel, as ``stitch`` fuses it.
"""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ext.inspect import inspect
from tvm_ext.select.analytic import AnalyticCostModel
from tvm_ext.testing.oracle import run_cpu
from tvm_ext.checks.thread_serial import compare_scheduled
from tvm_ext.tilegraph import TilePlan, build_tile_schedule, connect_graph, plan_group
from tvm_ext.toolchain import nvcc_available

from test_tilegraph_kernels import TARGETS, _context, compile_one_kernel


def embedding(vocab: int = 1000, seq: int = 32, width: int = 64, dtype: str = "float32") -> tvm.IRModule:
    """``layer_norm(table[ids] + pos)``: a transformer's embedding."""
    bb = relax.BlockBuilder()
    t = relax.TensorType
    ids, table = relax.Var("ids", t((1, seq), "int64")), relax.Var("table", t((vocab, width), dtype))
    pos, g, b = (relax.Var("pos", t((1, seq, width), dtype)), relax.Var("g", t((width,), dtype)),
                 relax.Var("b", t((width,), dtype)))
    with bb.function("main", [ids, table, pos, g, b]):
        with bb.dataflow():
            x = bb.emit(relax.op.add(relax.op.take(table, ids, axis=0), pos))
            out = bb.emit_output(relax.op.nn.layer_norm(x, g, b, axes=[-1]))
        bb.emit_func_output(out)
    return bb.get()


def _inputs(mod, vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    inputs = {p.name: rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32")
              for p in mod["main"].params if p.name != "ids"}
    seq = int(mod["main"].params[0].ty.shape[1])
    inputs["ids"] = rng.integers(0, vocab, (1, seq)).astype("int64")
    return inputs


def test_the_lookup_is_priced_one_row_per_index_and_joins_its_readers():
    ctx = _context(embedding())
    members = tuple(ctx.call_nodes())
    plan = plan_group(ctx, members)
    assert isinstance(plan, TilePlan), plan
    assert plan.output_tile == (1, 1, 64)
    # hand count, 32 tiles of one row: its index (int64), the table row it names, the position
    # row, gamma and beta, and the output row; the 1000-row table is never read whole
    assert plan.traffic_bytes == 32 * (8 + 5 * 64 * 4)
    assert [g.nodes for g in connect_graph(ctx, AnalyticCostModel())] == [members]


def test_the_lookup_kernel_computes_what_the_graph_computes():
    mod = embedding()
    ctx = _context(mod)
    members = tuple(ctx.call_nodes())
    func = ctx.fused_function(members)
    plan = plan_group(ctx, members)
    assert isinstance(plan, TilePlan), plan
    check = compare_scheduled(func, build_tile_schedule(func, plan))
    assert check.ok, check
    inputs = _inputs(mod, 1000)
    np.testing.assert_allclose(run_cpu(mod, inputs, preset="tilegraph")[0],
                               run_cpu(mod, inputs, preset="baseline")[0], rtol=1e-4, atol=1e-4)


def test_tilegraph_writes_no_gathered_rows_out():
    """One kernel, as ``stitch`` has it: the gathered rows are not stored and read back."""
    mod = embedding(vocab=30522, seq=128, width=768)
    tile, stitch = inspect(mod, preset="tilegraph"), inspect(mod, preset="stitch")
    assert tile.kernels == stitch.kernels == 1
    assert tile.traffic_bytes == stitch.traffic_bytes


@pytest.mark.skipif(not nvcc_available(), reason="nvcc / CUDA toolkit not found")
@pytest.mark.parametrize("target_name", TARGETS)
def test_the_lookup_kernel_compiles_with_nvcc(target_name):
    ctx = _context(embedding(vocab=30522, seq=128, width=768, dtype="float16"))
    members = tuple(ctx.call_nodes())
    plan = plan_group(ctx, members)
    assert isinstance(plan, TilePlan), plan
    compile_one_kernel(build_tile_schedule(ctx.fused_function(members), plan), tvm.target.Target(target_name))
