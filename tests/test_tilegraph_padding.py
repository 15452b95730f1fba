"""Fragment padding (:mod:`tvm_ext.tilegraph.padding`): contractions whose extents are no multiples
of the WMMA fragment run on tensor cores, padded: ViT's 197-token attention core, a GEMM whose
output rows are cut by the tile.

The padding itself is pinned by a Before/Expected TVMScript function; the planned kernels are
checked thread-serialized on the CPU and compiled by nvcc for sm_80 and sm_90.
"""
from __future__ import annotations

import pytest
import tvm
from tvm import relax
from tvm.script import tirx as T

from tvm_ext.checks.thread_serial import compare_scheduled
from tvm_ext.tilegraph import TilePlan, build_tile_schedule, plan_group, tile_work
from tvm_ext.tilegraph.padding import PaddingError, fragment_padding, pad_to_fragments
from tvm_ext.tilegraph.schedule import CUT_TILE
from tvm_ext.toolchain import nvcc_available

from test_tilegraph_kernels import TARGETS, _context, _whole, attention, compile_one_kernel
from test_tilegraph_tensor_core import gemm_softmax


@T.prim_func(private=True, s_tir=True)
def gemm_softmax_padded(x: T.Buffer((T.int64(20), T.int64(24)), "float16"), w: T.Buffer((T.int64(24), T.int64(40)), "float16"), T_softmax_norm_intermediate: T.Buffer((T.int64(20), T.int64(40)), "float16")):
    T.func_attr({"tirx.noalias": True})
    # with T.sblock("root"):
    T_softmax_maxelem = T.sblock_alloc_buffer((T.int64(20),), "float16")
    T_softmax_exp = T.sblock_alloc_buffer((T.int64(20), T.int64(40)), "float16")
    T_softmax_expsum = T.sblock_alloc_buffer((T.int64(20),), "float16")
    x_pad = T.sblock_alloc_buffer((T.int64(64), T.int64(64)), "float16")
    w_pad = T.sblock_alloc_buffer((T.int64(64), T.int64(64)), "float16")
    matmul_intermediate_pad = T.sblock_alloc_buffer((T.int64(64), T.int64(64)), "float16")
    for i0, i1 in T.grid(T.int64(64), T.int64(64)):
        with T.sblock("x_pad"):
            v0, v1 = T.axis.remap("SS", [i0, i1])
            T.reads(x[v0, v1])
            T.writes(x_pad[v0, v1])
            x_pad[v0, v1] = T.if_then_else(v0 < T.int64(20) and v1 < T.int64(24), x[v0, v1], T.float16(0.0))
    for i0, i1 in T.grid(T.int64(64), T.int64(64)):
        with T.sblock("w_pad"):
            v0, v1 = T.axis.remap("SS", [i0, i1])
            T.reads(w[v0, v1])
            T.writes(w_pad[v0, v1])
            w_pad[v0, v1] = T.if_then_else(v0 < T.int64(24) and v1 < T.int64(40), w[v0, v1], T.float16(0.0))
    for i0, i1, k in T.grid(T.int64(64), T.int64(64), T.int64(64)):
        with T.sblock("matmul"):
            v_i0, v_i1, v_k = T.axis.remap("SSR", [i0, i1, k])
            T.reads(x_pad[v_i0, v_k], w_pad[v_k, v_i1])
            T.writes(matmul_intermediate_pad[v_i0, v_i1])
            with T.init():
                matmul_intermediate_pad[v_i0, v_i1] = T.float16(0.0)
            matmul_intermediate_pad[v_i0, v_i1] = matmul_intermediate_pad[v_i0, v_i1] + x_pad[v_i0, v_k] * w_pad[v_k, v_i1]
    for i0, k in T.grid(T.int64(20), T.int64(40)):
        with T.sblock("T_softmax_maxelem"):
            v_i0, v_k = T.axis.remap("SR", [i0, k])
            T.reads(matmul_intermediate_pad[v_i0, v_k])
            T.writes(T_softmax_maxelem[v_i0])
            with T.init():
                T_softmax_maxelem[v_i0] = T.float16(-65504.0)
            T_softmax_maxelem[v_i0] = T.max(T_softmax_maxelem[v_i0], matmul_intermediate_pad[v_i0, v_k])
    for i0, i1 in T.grid(T.int64(20), T.int64(40)):
        with T.sblock("T_softmax_exp"):
            v_i0, v_i1 = T.axis.remap("SS", [i0, i1])
            T.reads(matmul_intermediate_pad[v_i0, v_i1], T_softmax_maxelem[v_i0])
            T.writes(T_softmax_exp[v_i0, v_i1])
            T_softmax_exp[v_i0, v_i1] = T.exp(matmul_intermediate_pad[v_i0, v_i1] - T_softmax_maxelem[v_i0])
    for i0, k in T.grid(T.int64(20), T.int64(40)):
        with T.sblock("T_softmax_expsum"):
            v_i0, v_k = T.axis.remap("SR", [i0, k])
            T.reads(T_softmax_exp[v_i0, v_k])
            T.writes(T_softmax_expsum[v_i0])
            with T.init():
                T_softmax_expsum[v_i0] = T.float16(0.0)
            T_softmax_expsum[v_i0] = T_softmax_expsum[v_i0] + T_softmax_exp[v_i0, v_k]
    for i0, i1 in T.grid(T.int64(20), T.int64(40)):
        with T.sblock("T_softmax_norm"):
            v_i0, v_i1 = T.axis.remap("SS", [i0, i1])
            T.reads(T_softmax_exp[v_i0, v_i1], T_softmax_expsum[v_i0])
            T.writes(T_softmax_norm_intermediate[v_i0, v_i1])
            T.sblock_attr({"axis": 1})
            T_softmax_norm_intermediate[v_i0, v_i1] = T_softmax_exp[v_i0, v_i1] / T_softmax_expsum[v_i0]


def test_padding_pins_the_padded_function():
    """20x24 @ 24x40: every extent padded to 64 (4 fragments), the operands read through pad
    blocks, the softmax reads the padded product (its crop inlined)."""
    func = _whole(gemm_softmax(rows=20, depth=24, cols=40))
    sch = tvm.s_tir.Schedule(func)
    assert pad_to_fragments(sch, "matmul", list(func.params)) == ("w_pad", "x_pad")
    tvm.ir.assert_structural_equal(sch.mod["main"], gemm_softmax_padded)


def test_aligned_contractions_are_left_alone_and_others_refused_by_name():
    func = _whole(gemm_softmax(rows=64, depth=32, cols=64))
    sch = tvm.s_tir.Schedule(func)
    assert fragment_padding(sch.get(sch.get_sblock("matmul"))) is None
    assert pad_to_fragments(sch, "matmul", list(func.params)) == ()
    with pytest.raises(PaddingError, match="T_softmax_maxelem"):
        pad_to_fragments(sch, "T_softmax_maxelem", list(func.params))


def _vit_attention(heads: int):
    ctx = _context(attention(heads=heads, seq=197, dim=64, dtype="float16"))
    members = tuple(ctx.call_nodes())
    return ctx.fused_function(members), plan_group(ctx, members)


def test_vit_attention_core_is_one_tensor_core_kernel_with_padded_gemms():
    """197 tokens: no tile has whole fragments (unpadded, both GEMMs stay SIMT); padded, QK and PV
    run on tensor cores in one kernel that computes what the graph computes."""
    func, plan = _vit_attention(heads=2)
    unpadded = {w.name: w.wmma for w in tile_work(func, plan.output_tile, plan.inline)}
    assert unpadded["matmul"] == CUT_TILE and unpadded["matmul1"] == CUT_TILE
    assert plan.tensor_core == ("matmul", "matmul1") and plan.padded == ("matmul", "matmul1")
    assert plan.code_path == "wmma_tile" and plan.output_tile == (1, 1, 16, 64)
    # 13 row tiles per head compute 208 rows: QK 256 columns deep 64, PV 64 columns deep 256
    tiles, original = 2 * 13, 2 * 2 * 197 * 197 * 64
    assert plan.padding_flops == 2 * (2 * tiles * 16 * 256 * 64 - original)
    check = compare_scheduled(func, build_tile_schedule(func, plan, tensorize=False))
    assert check.ok, check


def test_report_prices_a_padded_kernel_as_the_selection_did():
    """The padding's flops travel with the plan: the built kernel's description is priced as its
    candidate was."""
    from tvm_ext.select.analytic import AnalyticCostModel
    from tvm_ext.select.describe import describe_scheduled
    from tvm_ext.select.plan import with_plan
    from tvm_ext.tilegraph.connect import tile_candidate

    ctx = _context(attention(heads=2, seq=197, dim=64, dtype="float16"))
    members = tuple(ctx.call_nodes())
    plan = plan_group(ctx, members)
    cand = tile_candidate(ctx, members, plan, "test")
    func = with_plan(ctx.fused_function(members), plan)
    kernel = describe_scheduled(func, build_tile_schedule(func, plan, tensorize=False))
    assert kernel.flops == cand.flops == sum(ctx.graph.nodes[n].flops for n in members) + plan.padding_flops
    model = AnalyticCostModel()
    assert model.cost(kernel, ctx.device).seconds == pytest.approx(model.cost(cand, ctx.device).seconds)


@pytest.mark.skipif(not nvcc_available(), reason="nvcc not on PATH")
@pytest.mark.parametrize("target_name", TARGETS)
def test_vit_attention_kernel_compiles_with_wmma(target_name):
    func, plan = _vit_attention(heads=12)
    assert plan.padded == ("matmul", "matmul1") and plan.dynamic_shared
    compile_one_kernel(build_tile_schedule(func, plan), tvm.target.Target(target_name))


def relu_gemm(rows: int = 50) -> tvm.IRModule:
    """``relu(x) @ w``: a GEMM writing the kernel's output, ``rows`` cut by a 16-row tile."""
    bb = relax.BlockBuilder()
    t = relax.TensorType
    x, w = relax.Var("x", t((rows, 32), "float16")), relax.Var("w", t((32, 64), "float16"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(relax.op.nn.relu(x), w))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("target_name", TARGETS)
def test_a_gemm_whose_output_tile_is_cut_runs_on_tensor_cores(target_name):
    """The padded GEMM computes its border tile whole; the crop block stores the 50 rows."""
    func = _whole(relu_gemm())
    plan = TilePlan((16, 64), 128, tensor_core=("matmul",), padded=("matmul",))
    assert tile_work(func, (16, 64))[-1].wmma == CUT_TILE
    check = compare_scheduled(func, build_tile_schedule(func, plan, tensorize=False))
    assert check.ok, check
    if nvcc_available():
        compile_one_kernel(build_tile_schedule(func, plan), tvm.target.Target(target_name))


def test_padded_plans_round_trip_and_keep_unpadded_measurement_keys():
    plan = TilePlan((1, 1, 16, 64), 128, ("T_softmax_exp",), tensor_core=("matmul",), padded=("matmul",),
                    padding_flops=1024)
    assert TilePlan.from_json(plan.to_json()) == plan
    assert plan.measured_config()["padded"] == ["matmul"]
    assert "padded" not in TilePlan((16, 64), 128).measured_config()
    assert "(1 padded to whole fragments)" in plan.summary()
