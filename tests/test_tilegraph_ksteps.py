"""Tensor-core stages that stage their operands in reduction steps (``TilePlan.kstep``).

A tile whose whole operands exceed shared memory (a layer norm feeding a 768-wide GEMM in one
16 x 768 tile) stages ``kstep`` reduction rows at a time; each warp keeps its neighbouring output
fragments in accumulators across the steps. Pinned on a small GEMM (Before/Expected), planned on
a layer norm -> GEMM, checked thread-serialized on the CPU and compiled by nvcc.
"""
from __future__ import annotations

import pytest
import tvm
from tvm import relax
from tvm.script import tirx as T

from tvm_ext.checks.thread_serial import compare_scheduled
from tvm_ext.select.analytic import AnalyticCostModel
from tvm_ext.tilegraph import TilePlan, build_tile_schedule, plan_group, tile_candidate, tile_work, whole_reduction_plan
from tvm_ext.tilegraph.enumerate import _Search, enumerate_tiles
from tvm_ext.tilegraph.tensor_core import stepped_reduction
from tvm_ext.tilegraph.tile_graph import TileGraph
from tvm_ext.tilegraph.connect import _Pricer
from tvm_ext.tilegraph.planning import _overlap, edge_level
from tvm_ext.toolchain import nvcc_available

from test_tilegraph_kernels import TARGETS, _context, _legal, compile_one_kernel


def gemm(rows: int = 32, depth: int = 64, cols: int = 64) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, depth), "float16"))
    w = relax.Var("w", relax.TensorType((depth, cols), "float16"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(out)
    return bb.get()


def norm_gemm(rows: int = 128, width: int = 768, cols: int = 768) -> tvm.IRModule:
    """``layer_norm(x) @ w`` in float16 (a transformer's QKV or FFN-up projection)."""
    bb = relax.BlockBuilder()
    t = relax.TensorType
    x, g, b = relax.Var("x", t((rows, width), "float16")), relax.Var("g", t((width,), "float16")), \
        relax.Var("b", t((width,), "float16"))
    w = relax.Var("w", t((width, cols), "float16"))
    with bb.function("main", [x, g, b, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(relax.op.nn.layer_norm(x, g, b, axes=[-1]), w))
        bb.emit_func_output(out)
    return bb.get()


# 2 warps, 4 fragments of one 16 x 64 tile: each warp accumulates its two neighbouring fragments over
# two steps of 32; each step all 64 threads copy x's 16 x 32 and w's 32 x 64 into shared memory.
@T.prim_func(private=True, s_tir=True)
def gemm_stepped(x: T.Buffer((T.int64(32), T.int64(64)), "float16"), w: T.Buffer((T.int64(64), T.int64(64)), "float16"), matmul: T.Buffer((T.int64(32), T.int64(64)), "float16")):
    T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
    x_shared = T.sblock_alloc_buffer((T.int64(32), T.int64(64)), "float16", scope="shared")
    w_shared = T.sblock_alloc_buffer((T.int64(64), T.int64(64)), "float16", scope="shared")
    x_shared_wmma_matrix_a = T.sblock_alloc_buffer((T.int64(32), T.int64(64)), "float16", scope="wmma.matrix_a")
    w_shared_wmma_matrix_b = T.sblock_alloc_buffer((T.int64(64), T.int64(64)), "float16", scope="wmma.matrix_b")
    matmul_wmma_accumulator = T.sblock_alloc_buffer((T.int64(32), T.int64(64)), "float16", scope="wmma.accumulator")
    for i0_0_i1_0_fused in T.thread_binding(T.int64(2), thread="blockIdx.x"):
        for i0_1_0_i1_1_0_fused_0 in T.thread_binding(T.int64(2), thread="threadIdx.y"):
            for i0_1_0_i1_1_0_fused_1_init in range(T.int64(2)):
                with T.sblock("matmul_init_o"):
                    v_i0_o = T.axis.spatial(T.int64(2), i0_0_i1_0_fused)
                    v_i1_o = T.axis.spatial(T.int64(4), i0_1_0_i1_1_0_fused_0 * T.int64(2) + i0_1_0_i1_1_0_fused_1_init)
                    T.reads()
                    T.writes(matmul_wmma_accumulator[v_i0_o * T.int64(16):v_i0_o * T.int64(16) + T.int64(16), v_i1_o * T.int64(16):v_i1_o * T.int64(16) + T.int64(16)])
                    C = T.match_buffer(matmul_wmma_accumulator[v_i0_o * T.int64(16):v_i0_o * T.int64(16) + T.int64(16), v_i1_o * T.int64(16):v_i1_o * T.int64(16) + T.int64(16)], (T.int64(16), T.int64(16)), "float16", strides=("d1", "d0"), scope="wmma.accumulator", offset_factor=16)
                    T.tvm_fill_fragment(C.data, 16, 16, 16, C.elem_offset % C.strides[0] // T.int64(16) + C.elem_offset // C.strides[0] // T.int64(16) * (C.strides[0] // T.int64(16)), T.float32(0.0))
            for k_0_0 in range(T.int64(2)):
                for ax0_ax1_fused_0 in range(T.int64(8)):
                    for ax0_ax1_fused_1 in T.thread_binding(T.int64(2), thread="threadIdx.y"):
                        for ax0_ax1_fused_2 in T.thread_binding(T.int64(32), thread="threadIdx.x"):
                            with T.sblock("x_shared"):
                                v0 = T.axis.spatial(T.int64(32), i0_0_i1_0_fused * T.int64(16) + ax0_ax1_fused_0 * T.int64(2) + ax0_ax1_fused_1)
                                v1 = T.axis.spatial(T.int64(64), k_0_0 * T.int64(32) + ax0_ax1_fused_2)
                                T.reads(x[v0, v1])
                                T.writes(x_shared[v0, v1])
                                x_shared[v0, v1] = x[v0, v1]
                for ax0_ax1_fused_0 in range(T.int64(32)):
                    for ax0_ax1_fused_1 in T.thread_binding(T.int64(2), thread="threadIdx.y"):
                        for ax0_ax1_fused_2 in T.thread_binding(T.int64(32), thread="threadIdx.x"):
                            with T.sblock("w_shared"):
                                v0 = T.axis.spatial(T.int64(64), k_0_0 * T.int64(32) + ax0_ax1_fused_0)
                                v1 = T.axis.spatial(T.int64(64), ax0_ax1_fused_1 * T.int64(32) + ax0_ax1_fused_2)
                                T.reads(w[v0, v1])
                                T.writes(w_shared[v0, v1])
                                w_shared[v0, v1] = w[v0, v1]
                for i0_1_0_i1_1_0_fused_1, k_0_1 in T.grid(T.int64(2), T.int64(2)):
                    with T.sblock("x_shared_wmma.matrix_a_o"):
                        v0_o = T.axis.spatial(T.int64(2), i0_0_i1_0_fused)
                        v1_o = T.axis.spatial(T.int64(4), k_0_0 * T.int64(2) + k_0_1)
                        T.reads(x_shared[v0_o * T.int64(16):v0_o * T.int64(16) + T.int64(16), v1_o * T.int64(16):v1_o * T.int64(16) + T.int64(16)])
                        T.writes(x_shared_wmma_matrix_a[v0_o * T.int64(16):v0_o * T.int64(16) + T.int64(16), v1_o * T.int64(16):v1_o * T.int64(16) + T.int64(16)])
                        A = T.match_buffer(x_shared[v0_o * T.int64(16):v0_o * T.int64(16) + T.int64(16), v1_o * T.int64(16):v1_o * T.int64(16) + T.int64(16)], (T.int64(16), T.int64(16)), "float16", strides=("s1", "s0"), scope="shared", offset_factor=16)
                        C = T.match_buffer(x_shared_wmma_matrix_a[v0_o * T.int64(16):v0_o * T.int64(16) + T.int64(16), v1_o * T.int64(16):v1_o * T.int64(16) + T.int64(16)], (T.int64(16), T.int64(16)), "float16", strides=("d1", "d0"), scope="wmma.matrix_a", offset_factor=16)
                        T.tvm_load_matrix_sync(C.data, 16, 16, 16, C.elem_offset % C.strides[0] // T.int64(16) + C.elem_offset // C.strides[0] // T.int64(16) * (C.strides[0] // T.int64(16)), T.tvm_access_ptr(T.type_annotation("float16"), A.data, A.elem_offset, A.strides[0] * T.int64(16), 1), A.strides[0], "row_major")
                    with T.sblock("w_shared_wmma.matrix_b_o"):
                        v0_o = T.axis.spatial(T.int64(4), k_0_0 * T.int64(2) + k_0_1)
                        v1_o = T.axis.spatial(T.int64(4), i0_1_0_i1_1_0_fused_0 * T.int64(2) + i0_1_0_i1_1_0_fused_1)
                        T.reads(w_shared[v0_o * T.int64(16):v0_o * T.int64(16) + T.int64(16), v1_o * T.int64(16):v1_o * T.int64(16) + T.int64(16)])
                        T.writes(w_shared_wmma_matrix_b[v0_o * T.int64(16):v0_o * T.int64(16) + T.int64(16), v1_o * T.int64(16):v1_o * T.int64(16) + T.int64(16)])
                        A = T.match_buffer(w_shared[v0_o * T.int64(16):v0_o * T.int64(16) + T.int64(16), v1_o * T.int64(16):v1_o * T.int64(16) + T.int64(16)], (T.int64(16), T.int64(16)), "float16", strides=("s1", "s0"), scope="shared", offset_factor=16)
                        C = T.match_buffer(w_shared_wmma_matrix_b[v0_o * T.int64(16):v0_o * T.int64(16) + T.int64(16), v1_o * T.int64(16):v1_o * T.int64(16) + T.int64(16)], (T.int64(16), T.int64(16)), "float16", strides=("d1", "d0"), scope="wmma.matrix_b", offset_factor=16)
                        T.tvm_load_matrix_sync(C.data, 16, 16, 16, C.elem_offset % C.strides[0] // T.int64(16) + C.elem_offset // C.strides[0] // T.int64(16) * (C.strides[0] // T.int64(16)), T.tvm_access_ptr(T.type_annotation("float16"), A.data, A.elem_offset, A.strides[0] * T.int64(16), 1), A.strides[0], "row_major")
                    with T.sblock("matmul_update_o"):
                        v_i0_o = T.axis.spatial(T.int64(2), i0_0_i1_0_fused)
                        v_i1_o = T.axis.spatial(T.int64(4), i0_1_0_i1_1_0_fused_0 * T.int64(2) + i0_1_0_i1_1_0_fused_1)
                        v_k_o = T.axis.reduce(T.int64(4), k_0_0 * T.int64(2) + k_0_1)
                        T.reads(matmul_wmma_accumulator[v_i0_o * T.int64(16):v_i0_o * T.int64(16) + T.int64(16), v_i1_o * T.int64(16):v_i1_o * T.int64(16) + T.int64(16)], x_shared_wmma_matrix_a[v_i0_o * T.int64(16):v_i0_o * T.int64(16) + T.int64(16), v_k_o * T.int64(16):v_k_o * T.int64(16) + T.int64(16)], w_shared_wmma_matrix_b[v_k_o * T.int64(16):v_k_o * T.int64(16) + T.int64(16), v_i1_o * T.int64(16):v_i1_o * T.int64(16) + T.int64(16)])
                        T.writes(matmul_wmma_accumulator[v_i0_o * T.int64(16):v_i0_o * T.int64(16) + T.int64(16), v_i1_o * T.int64(16):v_i1_o * T.int64(16) + T.int64(16)])
                        A = T.match_buffer(x_shared_wmma_matrix_a[v_i0_o * T.int64(16):v_i0_o * T.int64(16) + T.int64(16), v_k_o * T.int64(16):v_k_o * T.int64(16) + T.int64(16)], (T.int64(16), T.int64(16)), "float16", strides=("a1", "a0"), scope="wmma.matrix_a", offset_factor=16)
                        B = T.match_buffer(w_shared_wmma_matrix_b[v_k_o * T.int64(16):v_k_o * T.int64(16) + T.int64(16), v_i1_o * T.int64(16):v_i1_o * T.int64(16) + T.int64(16)], (T.int64(16), T.int64(16)), "float16", strides=("b1", "b0"), scope="wmma.matrix_b", offset_factor=16)
                        C = T.match_buffer(matmul_wmma_accumulator[v_i0_o * T.int64(16):v_i0_o * T.int64(16) + T.int64(16), v_i1_o * T.int64(16):v_i1_o * T.int64(16) + T.int64(16)], (T.int64(16), T.int64(16)), "float16", strides=("c1", "c0"), scope="wmma.accumulator", offset_factor=16)
                        T.tvm_mma_sync(C.data, C.elem_offset % C.strides[0] // T.int64(16) + C.elem_offset // C.strides[0] // T.int64(16) * (C.strides[0] // T.int64(16)), A.data, A.elem_offset % A.strides[0] // T.int64(16) + A.elem_offset // A.strides[0] // T.int64(16) * (A.strides[0] // T.int64(16)), B.data, B.elem_offset % B.strides[0] // T.int64(16) + B.elem_offset // B.strides[0] // T.int64(16) * (B.strides[0] // T.int64(16)), C.data, C.elem_offset % C.strides[0] // T.int64(16) + C.elem_offset // C.strides[0] // T.int64(16) * (C.strides[0] // T.int64(16)))
            for ax0_0, ax1_0 in T.grid(T.int64(1), T.int64(2)):
                with T.sblock("matmul_wmma.accumulator_o"):
                    v0_o = T.axis.spatial(T.int64(2), i0_0_i1_0_fused)
                    v1_o = T.axis.spatial(T.int64(4), i0_1_0_i1_1_0_fused_0 * T.int64(2) + ax1_0)
                    T.reads(matmul_wmma_accumulator[v0_o * T.int64(16):v0_o * T.int64(16) + T.int64(16), v1_o * T.int64(16):v1_o * T.int64(16) + T.int64(16)])
                    T.writes(matmul[v0_o * T.int64(16):v0_o * T.int64(16) + T.int64(16), v1_o * T.int64(16):v1_o * T.int64(16) + T.int64(16)])
                    A = T.match_buffer(matmul_wmma_accumulator[v0_o * T.int64(16):v0_o * T.int64(16) + T.int64(16), v1_o * T.int64(16):v1_o * T.int64(16) + T.int64(16)], (T.int64(16), T.int64(16)), "float16", strides=("d1", "d0"), scope="wmma.accumulator", offset_factor=16)
                    C = T.match_buffer(matmul[v0_o * T.int64(16):v0_o * T.int64(16) + T.int64(16), v1_o * T.int64(16):v1_o * T.int64(16) + T.int64(16)], (T.int64(16), T.int64(16)), "float16", strides=("s1", "s0"), offset_factor=16)
                    T.tvm_store_matrix_sync(A.data, 16, 16, 16, A.elem_offset % A.strides[0] // T.int64(16) + A.elem_offset // A.strides[0] // T.int64(16) * (A.strides[0] // T.int64(16)), T.tvm_access_ptr(T.type_annotation("float16"), C.data, C.elem_offset, C.strides[0] * T.int64(16), 2), C.strides[0], "row_major")


def _planned(ctx):
    members = tuple(ctx.call_nodes())
    plan = plan_group(ctx, members)
    assert isinstance(plan, TilePlan), plan
    return ctx.fused_function(members), plan


def _planned_whole(ctx):
    """The plan that computes every reduction once: :func:`whole_reduction_plan`, or the ranked
    plan where that is it already."""
    members = tuple(ctx.call_nodes())
    plan = whole_reduction_plan(ctx, members) or plan_group(ctx, members)
    assert isinstance(plan, TilePlan), plan
    return ctx.fused_function(members), plan


def test_stepped_stage_pins_the_kernel():
    func = _legal(gemm())["matmul"]
    plan = TilePlan((16, 64), 64, tensor_core=("matmul",), kstep=32)
    tvm.ir.assert_structural_equal(build_tile_schedule(func, plan), gemm_stepped)
    assert compare_scheduled(func, build_tile_schedule(func, plan, tensorize=False)).ok


def test_block_work_of_a_stepped_stage():
    func = _legal(gemm())["matmul"]
    (whole,) = tile_work(func, (16, 64))
    (stepped,) = tile_work(func, (16, 64), kstep=32)
    assert whole.wmma.kstep == 0 and whole.wmma.staged_bytes == (16 * 64 + 64 * 64) * 2
    assert stepped.wmma.kstep == 32 and stepped.wmma.staged_bytes == (16 * 32 + 32 * 64) * 2
    assert stepped.wmma.depth == 64 and stepped.work == whole.work
    # a step that does not divide the reduction, or covers it, stages whole
    assert stepped_reduction(48, 64) == stepped_reduction(64, 64) == stepped_reduction(32, 64, lead=2) == 0


@pytest.mark.parametrize("rows, width, cols", [(128, 768, 768), (197, 768, 768)])
def test_a_layer_norm_feeds_a_768_wide_gemm_in_one_kernel_on_tensor_cores(rows, width, cols):
    """One 16 x 768 tile per block computes each row's norm once (no recomputation); staging all
    of w's 768 x 768 would take 1.1 MiB of shared memory, so it is staged in reduction steps. At
    ViT's 197 tokens the border tile is padded to whole fragments."""
    ctx = _context(norm_gemm(rows, width, cols))
    func, plan = _planned_whole(ctx)
    assert plan.output_tile == (16, cols) and plan.code_path == "wmma_tile" and plan.kstep
    assert plan.shared_bytes <= ctx.device.max_shared_memory_per_block_optin
    work = tile_work(func, plan.output_tile, plan.inline, plan.padded, plan.kstep)
    (stage,) = [w for w in work if w.tensor_core]
    assert stage.wmma.staged_bytes == plan.kstep * cols * 2          # w's step; the norm is in shared
    assert _overlap(work) == 1.0           # no block recomputes anything but its border tile's padding
    check = compare_scheduled(func, build_tile_schedule(func, plan, tensorize=False))
    assert check.ok, check


@pytest.mark.parametrize("rows, width, cols, kstep", [(77, 512, 2048, 32), (256, 320, 1280, 80), (384, 1024, 4096, 16)])
def test_a_layer_norm_feeds_a_gemm_of_other_widths_in_one_tile_row(rows, width, cols, kstep):
    """Welder's score ranks the whole-width tile (a few blocks) below 20 that recompute the norm;
    enumeration offers it anyway, also where Welder's footprint (every tile in shared memory: 324
    KiB for 16 x 4096) exceeds the capacity the builder's buffers (160 KiB) fit in."""
    ctx = _context(norm_gemm(rows, width, cols))
    _, plan = _planned_whole(ctx)
    assert (plan.output_tile, plan.code_path, plan.kstep) == ((16, cols), "wmma_tile", kstep)
    assert plan.shared_bytes <= ctx.device.max_shared_memory_per_block_optin


def test_a_gemm_too_wide_for_a_tensor_core_step_takes_one_output_per_thread():
    """16 rows of an 8192-wide w take 256 KiB, more than a block's shared memory: the norm still
    feeds the GEMM in one kernel, each thread computing its outputs from the norm in shared memory."""
    ctx = _context(norm_gemm(8, 64, 8192))
    func, plan = _planned_whole(ctx)
    assert (plan.output_tile, plan.code_path, plan.tensor_core) == ((8, 8192), "simt_contraction", ())
    check = compare_scheduled(func, build_tile_schedule(func, plan, tensorize=False))
    assert check.ok, check


def test_connecting_prices_the_ranked_and_the_whole_reduction_plan_and_keeps_the_cheaper():
    """At 77 x 512 -> 2048 every ranked tile recomputes the norm more than twice (no ranked plan);
    the 16 x 2048 tile is the group's kernel. At 384 x 1024 -> 4096 both exist: the ranked 16 x 2048
    (the norm computed twice) and the whole 16 x 4096; the cheaper by the cost model is kept."""
    cost = AnalyticCostModel()
    for shape in [(77, 512, 2048), (384, 1024, 4096)]:
        ctx = _context(norm_gemm(*shape))
        members = tuple(ctx.call_nodes())
        ranked, whole = plan_group(ctx, members), whole_reduction_plan(ctx, members)
        assert whole is not None and whole.output_tile == (16, shape[2])
        priced = {p: cost.cost(tile_candidate(ctx, members, p, "t"), ctx.device).seconds
                  for p in (ranked, whole) if isinstance(p, TilePlan)}
        assert _Pricer(ctx, cost).tile(members) == min(priced.items(), key=lambda kv: kv[1])
    assert isinstance(ranked, TilePlan) and ranked.output_tile == (16, 2048)


def _norm_gemm_search(module: tvm.IRModule) -> _Search:
    ctx = _context(module)
    tg = TileGraph(ctx.graph, tuple(ctx.call_nodes()))
    tg.set_connects({e: edge_level(ctx, e.producer, e.consumer) for e in tg.edges})
    return _Search(tg, ctx.device, ctx.device.max_shared_memory_per_block_optin, 32)


def test_the_dimensions_a_reduction_does_not_depend_on():
    """A layer norm's row statistics do not depend on the GEMM's columns; a GEMM alone reduces
    nothing its output does not depend on."""
    search = _norm_gemm_search(norm_gemm(197))
    assert search.whole_reduction_dims() == (1,)
    assert search.whole_reduction_seed((1,)) == (16, 768)
    assert _norm_gemm_search(gemm()).whole_reduction_dims() == ()


def test_enumeration_offers_the_whole_width_tile_outside_the_top_k():
    ctx = _context(norm_gemm(197))
    tg = TileGraph(ctx.graph, tuple(ctx.call_nodes()))
    tg.set_connects({e: edge_level(ctx, e.producer, e.consumer) for e in tg.edges})
    ranked = enumerate_tiles(tg, ctx.device, top_k=5, shared_capacity=ctx.device.max_shared_memory_per_block_optin)
    tiles = [c.output_tile for c in ranked]
    assert (16, 768) in tiles[5:] and all(t[1] == 768 for t in tiles[5:])
    assert [c.offered for c in ranked] == [False] * 5 + [True] * (len(ranked) - 5)
    assert all(c.score < ranked[tiles.index((16, 768))].score for c in ranked[:5])


def test_tile_growth_reaches_a_width_past_one_that_cuts_it():
    """512 of 768 columns cuts a border tile, which costs more than 256 columns; growth, which never
    adds traffic, also tries the next size that divides the dimension."""
    assert _norm_gemm_search(norm_gemm()).grow((16, 256)) == [(32, 256), (16, 512), (16, 768)]


def test_a_plan_keeps_its_step_through_json():
    plan = TilePlan((16, 768), 512, tensor_core=("matmul",), kstep=128)
    assert TilePlan.from_json(plan.to_json()) == plan
    assert plan.measured_config()["kstep"] == 128 and "128 reduction rows" in plan.summary()


@pytest.mark.skipif(not nvcc_available(), reason="nvcc / CUDA toolkit not found")
@pytest.mark.parametrize("target_name", TARGETS)
@pytest.mark.parametrize("shape", [(128, 768, 768), (197, 768, 768), (8, 64, 8192)])
def test_the_stepped_kernel_compiles_with_nvcc(target_name, shape):
    func, plan = _planned_whole(_context(norm_gemm(*shape)))
    compile_one_kernel(build_tile_schedule(func, plan), tvm.target.Target(target_name))
