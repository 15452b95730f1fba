"""Tile kernels that store more than one output (Welder's kernels store every tensor their tile
graph exports): a residual sum its layer norm also reads, sibling outputs, outputs of another
shape refused by name.

The builder is pinned on a small residual + layer norm (Before/Expected TVMScript); every kernel
is checked thread-serialized on the CPU against its unscheduled function, and compiled by nvcc.
"""
from __future__ import annotations

import pytest
import tvm
from tvm import relax
from tvm.script import tirx as T

from tvm_ext.select.analytic import AnalyticCostModel
from tvm_ext.checks.thread_serial import compare_scheduled
from tvm_ext.tilegraph import TilePlan, build_tile_schedule, connect_graph, plan_group, tile_work
from tvm_ext.toolchain import nvcc_available

from test_tilegraph_kernels import TARGETS, _context, compile_one_kernel


def residual_norm(rows: int = 8, width: int = 64, dtype: str = "float32") -> tvm.IRModule:
    """``s = x + r`` and ``layer_norm(s)``, both outputs (a transformer's residual stream)."""
    bb = relax.BlockBuilder()
    t = relax.TensorType
    x, r = relax.Var("x", t((rows, width), dtype)), relax.Var("r", t((rows, width), dtype))
    g, b = relax.Var("g", t((width,), dtype)), relax.Var("b", t((width,), dtype))
    with bb.function("main", [x, r, g, b]):
        with bb.dataflow():
            s = bb.emit(relax.op.add(x, r))
            y = bb.emit(relax.op.nn.layer_norm(s, g, b, axes=[-1]))
            out = bb.emit_output(relax.Tuple([s, y]))
        bb.emit_func_output(out)
    return bb.get()


def two_readers(rows: int = 64, width: int = 96, reduce: bool = False) -> tvm.IRModule:
    """``h = exp(x)`` read by two outputs: ``h + 1`` and ``softmax(h)`` (or ``sum(h, axis=1)``,
    an output of another shape, with ``reduce``)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, width), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.exp(x))
            a = bb.emit(relax.op.add(h, relax.const(1.0, "float32")))
            s = bb.emit(relax.op.sum(h, axis=[1]) if reduce else relax.op.nn.softmax(h, axis=-1))
            out = bb.emit_output(relax.Tuple([a, s]))
        bb.emit_func_output(out)
    return bb.get()


@T.prim_func(private=True, s_tir=True)
def residual_norm_scheduled(x: T.Buffer((T.int64(8), T.int64(64)), "float32"), r: T.Buffer((T.int64(8), T.int64(64)), "float32"), g: T.Buffer((T.int64(64),), "float32"), b: T.Buffer((T.int64(64),), "float32"), T_add_intermediate: T.Buffer((T.int64(8), T.int64(64)), "float32"), T_layer_norm_intermediate: T.Buffer((T.int64(8), T.int64(64)), "float32")):
    T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
    lv_sum_shared = T.sblock_alloc_buffer((T.int64(8),), scope="shared")
    lv_var_sum_shared = T.sblock_alloc_buffer((T.int64(8),), scope="shared")
    T_add_intermediate_shared = T.sblock_alloc_buffer((T.int64(8), T.int64(64)), scope="shared")
    for ax0_0_ax1_0_fused_m in T.thread_binding(T.int64(4), thread="blockIdx.x"):
        for ax0_ax1_fused_0 in range(T.int64(2)):
            for ax0_ax1_fused_1 in T.thread_binding(T.int64(2), thread="threadIdx.y"):
                for ax0_ax1_fused_2 in T.thread_binding(T.int64(32), thread="threadIdx.x"):
                    with T.sblock("T_add"):
                        v_ax0 = T.axis.spatial(T.int64(8), ax0_0_ax1_0_fused_m * T.int64(2) + ax0_ax1_fused_0)
                        v_ax1 = T.axis.spatial(T.int64(64), ax0_ax1_fused_1 * T.int64(32) + ax0_ax1_fused_2)
                        T.reads(x[v_ax0, v_ax1], r[v_ax0, v_ax1])
                        T.writes(T_add_intermediate_shared[v_ax0, v_ax1])
                        T_add_intermediate_shared[v_ax0, v_ax1] = x[v_ax0, v_ax1] + r[v_ax0, v_ax1]
        for ax0_0 in range(T.int64(1)):
            for ax0_1 in T.thread_binding(T.int64(2), thread="threadIdx.y"):
                for ax1_0 in range(T.int64(2)):
                    for ax1_1 in T.thread_binding(T.int64(32), thread="threadIdx.x"):
                        with T.sblock("lv_sum"):
                            v_ax0 = T.axis.spatial(T.int64(8), ax0_0_ax1_0_fused_m * T.int64(2) + ax0_1)
                            v_k1 = T.axis.reduce(T.int64(64), ax1_0 * T.int64(32) + ax1_1)
                            T.reads(T_add_intermediate_shared[v_ax0, v_k1])
                            T.writes(lv_sum_shared[v_ax0])
                            with T.init():
                                lv_sum_shared[v_ax0] = T.float32(0.0)
                            lv_sum_shared[v_ax0] = lv_sum_shared[v_ax0] + T_add_intermediate_shared[v_ax0, v_k1]
        for ax0_0 in range(T.int64(1)):
            for ax0_1 in T.thread_binding(T.int64(2), thread="threadIdx.y"):
                for ax1_0 in range(T.int64(2)):
                    for ax1_1 in T.thread_binding(T.int64(32), thread="threadIdx.x"):
                        with T.sblock("lv_var_sum"):
                            v_ax0 = T.axis.spatial(T.int64(8), ax0_0_ax1_0_fused_m * T.int64(2) + ax0_1)
                            v_k1 = T.axis.reduce(T.int64(64), ax1_0 * T.int64(32) + ax1_1)
                            T.reads(T_add_intermediate_shared[v_ax0, v_k1], lv_sum_shared[v_ax0])
                            T.writes(lv_var_sum_shared[v_ax0])
                            with T.init():
                                lv_var_sum_shared[v_ax0] = T.float32(0.0)
                            lv_var_sum_shared[v_ax0] = lv_var_sum_shared[v_ax0] + (T_add_intermediate_shared[v_ax0, v_k1] - lv_sum_shared[v_ax0] / T.float32(64.0)) * (T_add_intermediate_shared[v_ax0, v_k1] - lv_sum_shared[v_ax0] / T.float32(64.0))
        for ax0_1_ax1_1_fused_0 in range(T.int64(2)):
            for ax0_1_ax1_1_fused_1 in T.thread_binding(T.int64(2), thread="threadIdx.y"):
                for ax0_1_ax1_1_fused_2 in T.thread_binding(T.int64(32), thread="threadIdx.x"):
                    with T.sblock("T_layer_norm"):
                        v_ax0 = T.axis.spatial(T.int64(8), ax0_0_ax1_0_fused_m * T.int64(2) + ax0_1_ax1_1_fused_0)
                        v_ax1 = T.axis.spatial(T.int64(64), ax0_1_ax1_1_fused_1 * T.int64(32) + ax0_1_ax1_1_fused_2)
                        T.reads(T_add_intermediate_shared[v_ax0, v_ax1], lv_sum_shared[v_ax0], lv_var_sum_shared[v_ax0], g[v_ax1], b[v_ax1])
                        T.writes(T_layer_norm_intermediate[v_ax0, v_ax1])
                        T_layer_norm_intermediate[v_ax0, v_ax1] = (T_add_intermediate_shared[v_ax0, v_ax1] - lv_sum_shared[v_ax0] / T.float32(64.0)) * T.rsqrt(lv_var_sum_shared[v_ax0] / T.float32(64.0) + T.float32(1.0000000000000001e-05)) * g[v_ax1] + b[v_ax1]
        for ax0_1_ax1_1_fused_0 in range(T.int64(2)):
            for ax0_1_ax1_1_fused_1 in T.thread_binding(T.int64(2), thread="threadIdx.y"):
                for ax0_1_ax1_1_fused_2 in T.thread_binding(T.int64(32), thread="threadIdx.x"):
                    with T.sblock("T_add_intermediate_shared"):
                        v0 = T.axis.spatial(T.int64(8), ax0_0_ax1_0_fused_m * T.int64(2) + ax0_1_ax1_1_fused_0)
                        v1 = T.axis.spatial(T.int64(64), ax0_1_ax1_1_fused_1 * T.int64(32) + ax0_1_ax1_1_fused_2)
                        T.reads(T_add_intermediate_shared[v0, v1])
                        T.writes(T_add_intermediate[v0, v1])
                        T_add_intermediate[v0, v1] = T_add_intermediate_shared[v0, v1]


def _whole(ctx):
    members = tuple(ctx.call_nodes())
    return members, ctx.fused_function(members)


def test_a_stored_output_its_tile_also_reads_is_staged_and_copied():
    ctx = _context(residual_norm())
    members, func = _whole(ctx)
    plan = plan_group(ctx, members)
    assert isinstance(plan, TilePlan), plan
    # one row per tile: 8 tiles (Welder's ranking prefers more tiles than SMs to fewer bytes)
    assert plan.output_tile == (1, 64) and plan.inline == ("lv_mean",)
    # hand count, 8 tiles of 1 row: x and r read once, g and b once per tile, both outputs stored once
    assert plan.traffic_bytes == (2 * 8 * 64 + 2 * 8 * 64 + 2 * 8 * 64) * 4
    # the 2-row tile, pinned
    scheduled = build_tile_schedule(func, TilePlan((2, 64), 64, plan.inline))
    tvm.ir.assert_structural_equal(scheduled, residual_norm_scheduled)
    check = compare_scheduled(func, scheduled, inputs=4)
    assert check.ok and check.outputs == 2, check
    work = {w.name: w for w in tile_work(func, (2, 64), plan.inline)}
    assert work["T_add_intermediate_shared"].stores and work["T_layer_norm"].stores
    assert not work["T_add"].stores and work["T_add"].shared_bytes() == 2 * 64 * 4
    assert all(w.recompute == 1.0 for w in work.values())


def test_graph_connecting_joins_a_residual_sum_and_its_norm():
    ctx = _context(residual_norm(rows=128, width=768))
    groups = connect_graph(ctx, AnalyticCostModel())
    assert [g.nodes for g in groups] == [tuple(ctx.call_nodes())]


def test_sibling_outputs_share_the_tile():
    ctx = _context(two_readers())
    members, func = _whole(ctx)
    plan = plan_group(ctx, members)
    assert isinstance(plan, TilePlan), plan
    check = compare_scheduled(func, build_tile_schedule(func, plan), inputs=1)
    assert check.ok and check.outputs == 2, check
    # a tile that cuts the rows makes the softmax's row reduction recompute: refused, not built wrong
    work = {w.name: w for w in tile_work(func, (64, 32), plan.inline)}
    assert max(w.recompute for w in work.values()) == pytest.approx(3.0)


def test_outputs_of_another_shape_are_refused_by_name():
    ctx = _context(two_readers(reduce=True))
    members, func = _whole(ctx)
    reason = plan_group(ctx, members)
    assert isinstance(reason, str) and "share one tile" in reason and "(64,)" in reason


@pytest.mark.skipif(not nvcc_available(), reason="nvcc / CUDA toolkit not found")
@pytest.mark.parametrize("target_name", TARGETS)
def test_a_two_output_kernel_compiles_with_nvcc(target_name):
    ctx = _context(residual_norm(rows=128, width=768, dtype="float16"))
    members, func = _whole(ctx)
    plan = plan_group(ctx, members)
    assert isinstance(plan, TilePlan), plan
    compile_one_kernel(build_tile_schedule(func, plan), tvm.target.Target(target_name))
