"""Tile kernels of reductions that compute one output element per tile (a global pooling)."""
from __future__ import annotations

import pytest
import tvm
from tvm import relax
from tvm.script import tirx as T

from tvm_ext.tilegraph import TilePlan, build_tile_schedule, gcd_threads, plan_group, tile_work
from tvm_ext.checks.thread_serial import compare_scheduled
from tvm_ext.toolchain import nvcc_available

from test_tilegraph_kernels import TARGETS, _context, compile_one_kernel


def global_pool(channels: int, size: int) -> tvm.IRModule:
    """NAFNet's channel attention pooling: the float32 mean of a float16 image over its pixels."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.mean(relax.op.astype(x, "float32"), axis=[2, 3], keepdims=True))
        bb.emit_func_output(out)
    return bb.get()


@T.prim_func(private=True, s_tir=True)
def pool_scheduled(x: T.Buffer((T.int64(1), T.int64(8), T.int64(16), T.int64(16)), "float16"), T_divide_intermediate: T.Buffer((T.int64(1), T.int64(8), T.int64(1), T.int64(1)), "float32")):
    T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
    lv_red_shared = T.sblock_alloc_buffer((T.int64(1), T.int64(8), T.int64(1), T.int64(1)), scope="shared")
    for ax0_0_ax1_0_ax2_0_ax3_0_fused in T.thread_binding(T.int64(8), thread="blockIdx.x"):
        for u, ax0_ax1_fused_0 in T.grid(1, T.int64(1)):
            for ax0_ax1_fused_1 in T.thread_binding(T.int64(8), thread="threadIdx.y"):
                for ax0_ax1_fused_2 in T.thread_binding(T.int64(32), thread="threadIdx.x"):
                    with T.sblock("lv_red"):
                        v_ax0 = T.axis.spatial(T.int64(1), T.int64(0))
                        v_ax1 = T.axis.spatial(T.int64(8), ax0_0_ax1_0_ax2_0_ax3_0_fused)
                        v_ax2 = T.axis.spatial(T.int64(1), T.int64(0))
                        v_ax3 = T.axis.spatial(T.int64(1), T.int64(0))
                        v_k2 = T.axis.reduce(T.int64(16), ax0_ax1_fused_1 * T.int64(2) + ax0_ax1_fused_2 // T.int64(16))
                        v_k3 = T.axis.reduce(T.int64(16), ax0_ax1_fused_2 % T.int64(16))
                        T.reads(x[T.int64(0), v_ax1, v_k2, v_k3])
                        T.writes(lv_red_shared[T.int64(0), v_ax1, T.int64(0), T.int64(0)])
                        with T.init():
                            lv_red_shared[T.int64(0), v_ax1, T.int64(0), T.int64(0)] = T.float32(0.0)
                        lv_red_shared[T.int64(0), v_ax1, T.int64(0), T.int64(0)] = lv_red_shared[T.int64(0), v_ax1, T.int64(0), T.int64(0)] + T.Cast("float32", x[T.int64(0), v_ax1, v_k2, v_k3])
        for ax0_1_ax1_1_ax2_1_ax3_1_fused_0 in range(T.int64(1)):
            for ax0_1_ax1_1_ax2_1_ax3_1_fused_1 in T.thread_binding(T.int64(8), thread="threadIdx.y"):
                for ax0_1_ax1_1_ax2_1_ax3_1_fused_2 in T.thread_binding(T.int64(32), thread="threadIdx.x"):
                    with T.sblock("T_divide"):
                        v_ax0 = T.axis.spatial(T.int64(1), T.int64(0))
                        v_ax1 = T.axis.spatial(T.int64(8), ax0_0_ax1_0_ax2_0_ax3_0_fused)
                        v_ax2 = T.axis.spatial(T.int64(1), T.int64(0))
                        v_ax3 = T.axis.spatial(T.int64(1), T.int64(0))
                        T.where(ax0_1_ax1_1_ax2_1_ax3_1_fused_1 * T.int64(32) + ax0_1_ax1_1_ax2_1_ax3_1_fused_2 < T.int64(1))
                        T.reads(lv_red_shared[T.int64(0), v_ax1, T.int64(0), T.int64(0)])
                        T.writes(T_divide_intermediate[T.int64(0), v_ax1, T.int64(0), T.int64(0)])
                        T_divide_intermediate[T.int64(0), v_ax1, T.int64(0), T.int64(0)] = lv_red_shared[T.int64(0), v_ax1, T.int64(0), T.int64(0)] / T.float32(256.0)


def test_one_channel_per_tile_spreads_the_pooling_over_every_thread():
    """A tile of one output element leaves the reduction no spatial loop under the tile: it gets a
    unit loop, and the block's threads (y and x) reduce its channel's 256 pixels, one each: the gcd
    rule sizes the block by the row (the final division, one output, is predicated at any size)."""
    ctx = _context(global_pool(8, 16))
    nodes = tuple(ctx.call_nodes())
    plan = plan_group(ctx, nodes)
    assert isinstance(plan, TilePlan) and plan.output_tile == (1, 1, 1, 1) and plan.threads == 256
    func = ctx.fused_function(nodes)
    scheduled = build_tile_schedule(func, plan)
    tvm.ir.assert_structural_equal(scheduled, pool_scheduled)
    assert compare_scheduled(func, scheduled).ok


def test_a_one_output_tile_sizes_the_block_by_its_row():
    """NAFNet's pooling at 256x256: the row of 65536 pixels fills 1024 threads; the division (one
    output per tile) does not count. With 128 threads the cost model priced the kernel 4x dlight's
    pooling (fewer threads in flight), which then kept the float32 copy it reads."""
    ctx = _context(global_pool(32, 256))
    nodes = tuple(ctx.call_nodes())
    plan = plan_group(ctx, nodes)
    work = tile_work(ctx.fused_function(nodes), plan.output_tile, plan.inline)
    assert [(w.row_reduction, w.outputs, w.work) for w in work] == [(True, 1, 65536), (False, 1, 1)]
    assert gcd_threads(work) == plan.threads == 1024


@pytest.mark.parametrize("channels, size", [(32, 64), (512, 16), (3, 7)])
def test_poolings_of_other_shapes_compute_what_the_graph_computes(channels, size):
    ctx = _context(global_pool(channels, size))
    nodes = tuple(ctx.call_nodes())
    plan = plan_group(ctx, nodes)
    assert isinstance(plan, TilePlan), plan
    func = ctx.fused_function(nodes)
    assert compare_scheduled(func, build_tile_schedule(func, plan)).ok


@pytest.mark.skipif(not nvcc_available(), reason="nvcc / CUDA toolkit not found")
@pytest.mark.parametrize("target_name", TARGETS)
def test_the_pooling_kernel_compiles_with_nvcc(target_name):
    """The reduction over threadIdx.y and threadIdx.x lowers to one kernel that nvcc compiles."""
    ctx = _context(global_pool(32, 64))
    nodes = tuple(ctx.call_nodes())
    compile_one_kernel(build_tile_schedule(ctx.fused_function(nodes), plan_group(ctx, nodes)),
                       tvm.target.Target(target_name))
