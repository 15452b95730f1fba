"""Seeded faults in lowered device kernels, each caught by the emulator; each correct twin passes.

The kernels are written as TVM's lowering leaves them (``T.launch_thread``, flattened buffers,
``tvm_storage_sync``, warp shuffles), the failure classes compute-sanitizer's racecheck,
synccheck and initcheck report on a GPU.
"""
from __future__ import annotations

import numpy as np
import pytest
from tvm.script import tirx as T

from tvm_ext.checks.kernel import run_device_kernel


def _kinds(result) -> set[str]:
    return {f.kind for f in result.findings}


# -- a missing __syncthreads between a shared write and another thread's read ---------------------

def _gate(with_sync: bool):
    @T.prim_func(s_tir=True)
    def gate(x_ptr: T.handle("float32", "global"), y_ptr: T.handle("float32", "global")):
        x = T.decl_buffer((256,), data=x_ptr)
        y = T.decl_buffer((256,), data=y_ptr)
        with T.launch_thread("blockIdx.x", 2) as blockIdx_x:
            g = T.alloc_shared((4,))
            with T.launch_thread("threadIdx.x", 32) as threadIdx_x:
                threadIdx_y = T.launch_thread("threadIdx.y", 4)
                if threadIdx_x < 1:
                    g[threadIdx_y] = T.sigmoid(x[blockIdx_x * 128 + threadIdx_y * 32])
                if with_sync:
                    T.tvm_storage_sync("shared")
                y[blockIdx_x * 128 + threadIdx_y * 32 + threadIdx_x] = (
                    x[blockIdx_x * 128 + threadIdx_y * 32 + threadIdx_x] * g[threadIdx_y])
    return gate


@pytest.mark.parametrize("with_sync", [False, True], ids=["missing_sync", "synced"])
def test_a_shared_write_read_by_other_threads_needs_a_barrier(with_sync):
    x = np.random.default_rng(0).standard_normal(256).astype("float32")
    result, (_, y) = run_device_kernel(_gate(with_sync), [x, np.zeros(256, "float32")], poisoned={1})
    if with_sync:
        assert result.findings == []
        gate = 1 / (1 + np.exp(-x.reshape(8, 32)[:, :1]))
        np.testing.assert_allclose(y, (x.reshape(8, 32) * gate).reshape(-1), rtol=1e-6)
    else:
        assert _kinds(result) == {"race"}
        assert "'g[" in result.findings[0].message and "g[threadIdx_y] = T.sigmoid" in result.findings[0].message


# -- a cross-thread reduction lowered to a plain read-modify-write ---------------------------------

def _block_sum(plain_rmw: bool):
    @T.prim_func(s_tir=True)
    def block_sum(x_ptr: T.handle("float32", "global"), y_ptr: T.handle("float32", "global")):
        x = T.decl_buffer((128,), data=x_ptr)
        y = T.decl_buffer((2,), data=y_ptr)
        with T.launch_thread("blockIdx.x", 2) as blockIdx_x:
            acc = T.alloc_shared((1,))
            with T.launch_thread("threadIdx.x", 64) as threadIdx_x:
                if threadIdx_x == 0:
                    acc[0] = T.float32(0)
                T.tvm_storage_sync("shared")
                if plain_rmw:
                    acc[0] = acc[0] + x[blockIdx_x * 64 + threadIdx_x]
                elif threadIdx_x == 0:
                    for i in range(64):
                        acc[0] = acc[0] + x[blockIdx_x * 64 + i]
                T.tvm_storage_sync("shared")
                if threadIdx_x == 0:
                    y[blockIdx_x] = acc[0]
    return block_sum


@pytest.mark.parametrize("plain_rmw", [True, False], ids=["plain_rmw", "one_thread"])
def test_a_cross_thread_reduction_as_a_plain_read_modify_write_is_a_race(plain_rmw):
    x = np.arange(128, dtype="float32") / 64
    result, (_, y) = run_device_kernel(_block_sum(plain_rmw), [x, np.zeros(2, "float32")], poisoned={1})
    if plain_rmw:
        assert "race" in _kinds(result)
        assert any("acc[0] = acc[0] + x[" in f.message for f in result.findings)
    else:
        assert result.findings == []
        np.testing.assert_allclose(y, x.reshape(2, 64).sum(axis=1), rtol=1e-6)


# -- a grid-stage dependency with no grid barrier -------------------------------------------------

def _neighbour(grid_barrier: bool):
    @T.prim_func(s_tir=True)
    def neighbour(x_ptr: T.handle("float32", "global"), tmp_ptr: T.handle("float32", "global"),
                  y_ptr: T.handle("float32", "global")):
        x = T.decl_buffer((128,), data=x_ptr)
        tmp = T.decl_buffer((128,), data=tmp_ptr)
        y = T.decl_buffer((128,), data=y_ptr)
        with T.launch_thread("blockIdx.x", 4) as blockIdx_x:  # noqa: SIM117 (TVMScript: one launch per with)
            with T.launch_thread("threadIdx.x", 32) as threadIdx_x:
                tmp[blockIdx_x * 32 + threadIdx_x] = x[blockIdx_x * 32 + threadIdx_x] * T.float32(2)
                if grid_barrier:
                    T.cuda.grid_sync()
                y[blockIdx_x * 32 + threadIdx_x] = tmp[(blockIdx_x + 3) % 4 * 32 + threadIdx_x]
    return neighbour


@pytest.mark.parametrize("grid_barrier", [False, True], ids=["no_grid_barrier", "grid_barrier"])
def test_reading_a_lower_numbered_blocks_output_needs_a_grid_barrier(grid_barrier):
    x = np.arange(128, dtype="float32")
    args = [x, np.zeros(128, "float32"), np.zeros(128, "float32")]
    result, (_, _, y) = run_device_kernel(_neighbour(grid_barrier), args, poisoned={1, 2})
    if grid_barrier:
        assert result.findings == []
        np.testing.assert_array_equal(y, np.roll(x * 2, 32))
    else:   # reversed block order: block 3 reads block 2's rows before block 2 ran
        assert {"race", "uninitialised"} <= _kinds(result)
        assert any(f.kind == "race" and "blocks" in f.message and "'tmp[" in f.message for f in result.findings)


# -- an uninitialised shared or workspace read ----------------------------------------------------

def _half_staged(all_write: bool):
    @T.prim_func(s_tir=True)
    def half_staged(x_ptr: T.handle("float32", "global"), y_ptr: T.handle("float32", "global")):
        x = T.decl_buffer((32,), data=x_ptr)
        y = T.decl_buffer((32,), data=y_ptr)
        with T.launch_thread("blockIdx.x", 1) as blockIdx_x:
            s = T.alloc_shared((32,))
            with T.launch_thread("threadIdx.x", 32) as threadIdx_x:
                if all_write or threadIdx_x < 16:
                    s[threadIdx_x] = x[threadIdx_x]
                T.tvm_storage_sync("shared")
                y[threadIdx_x] = s[31 - threadIdx_x] + T.Cast("float32", blockIdx_x)
    return half_staged


@pytest.mark.parametrize("all_write", [False, True], ids=["half_written", "written"])
def test_a_shared_read_of_what_no_thread_wrote_is_uninitialised(all_write):
    x = np.arange(32, dtype="float32")
    result, (_, y) = run_device_kernel(_half_staged(all_write), [x, np.zeros(32, "float32")], poisoned={1})
    if all_write:
        assert result.findings == [] and (y == x[::-1]).all()
    else:
        assert _kinds(result) == {"uninitialised"}
        assert "'s[" in result.findings[0].message


@T.prim_func(s_tir=True)
def _workspace_reader(ws_ptr: T.handle("float32", "global"), y_ptr: T.handle("float32", "global")):
    ws = T.decl_buffer((32,), data=ws_ptr)
    y = T.decl_buffer((32,), data=y_ptr)
    with T.launch_thread("blockIdx.x", 1):  # noqa: SIM117 (TVMScript: one launch per with)
        with T.launch_thread("threadIdx.x", 32) as threadIdx_x:
            y[threadIdx_x] = ws[threadIdx_x]


def test_a_workspace_read_before_any_write_is_uninitialised():
    ws = np.ones(32, "float32")
    poisoned, _ = run_device_kernel(_workspace_reader, [ws, np.zeros(32, "float32")], poisoned={0, 1})
    given, (_, y) = run_device_kernel(_workspace_reader, [ws, np.zeros(32, "float32")], poisoned={1})
    assert {f.kind for f in poisoned.findings} == {"uninitialised"} and "'ws[" in poisoned.findings[0].message
    assert given.findings == [] and (y == 1).all()


# -- a shuffle with a lane that does not take part -------------------------------------------------

def _half_warp_sum(variant: str):
    @T.prim_func(s_tir=True)
    def half_warp_sum(x_ptr: T.handle("float32", "global"), y_ptr: T.handle("float32", "global")):
        x = T.decl_buffer((32,), data=x_ptr)
        y = T.decl_buffer((32,), data=y_ptr)
        with T.launch_thread("blockIdx.x", 1):
            v = T.alloc_local((1,))
            mask = T.alloc_local((1,), "uint32")
            with T.launch_thread("threadIdx.x", 32) as threadIdx_x:
                v[0] = x[threadIdx_x]
                if threadIdx_x < 16:
                    mask[0] = T.tvm_warp_activemask()
                    if variant == "full_mask":      # names lanes 16-31, which do not execute it
                        v[0] = v[0] + T.tvm_warp_shuffle_down(T.uint32(4294967295), v[0], 8, 32, 32)
                    elif variant == "reads_absent":  # lane 8 reads lane 16, which does not take part
                        v[0] = v[0] + T.tvm_warp_shuffle_down(mask[0], v[0], 8, 32, 32)
                    else:                            # 16-lane segments: every source lane takes part
                        v[0] = v[0] + T.tvm_warp_shuffle_down(mask[0], v[0], 8, 16, 32)
                y[threadIdx_x] = v[0]
    return half_warp_sum


@pytest.mark.parametrize("variant", ["full_mask", "reads_absent", "segmented"])
def test_a_shuffle_needs_every_lane_it_names_and_reads(variant):
    x = np.arange(32, dtype="float32")
    result, (_, y) = run_device_kernel(_half_warp_sum(variant), [x, np.zeros(32, "float32")], poisoned={1})
    if variant == "segmented":
        assert result.findings == []
        np.testing.assert_array_equal(y[:8], x[:8] + x[8:16])
        np.testing.assert_array_equal(y[8:], np.r_[2 * x[8:16], x[16:]])
    elif variant == "full_mask":   # synccheck: the mask names lanes 16-31, which do not execute it
        assert {f.kind for f in result.findings} == {"shuffle"}
        assert "do not execute" in result.findings[0].message
    else:   # lanes 8-15 read lanes 16-23, which do not take part: undefined, poison in the output
        assert result.findings == []
        assert np.isnan(y[8:16]).all() and not np.isnan(y[:8]).any()


# -- barriers -------------------------------------------------------------------------------------

@T.prim_func(s_tir=True)
def _divergent_barrier(x_ptr: T.handle("float32", "global"), y_ptr: T.handle("float32", "global")):
    x = T.decl_buffer((64,), data=x_ptr)
    y = T.decl_buffer((64,), data=y_ptr)
    with T.launch_thread("blockIdx.x", 1):
        s = T.alloc_shared((64,))
        with T.launch_thread("threadIdx.x", 64) as threadIdx_x:
            s[threadIdx_x] = x[threadIdx_x]
            if threadIdx_x < 32:
                T.tvm_storage_sync("shared")
            y[threadIdx_x] = s[63 - threadIdx_x]


def test_a_barrier_under_a_divergent_branch_is_a_finding():
    x = np.arange(64, dtype="float32")
    result, _ = run_device_kernel(_divergent_barrier, [x, np.zeros(64, "float32")], poisoned={1})
    assert "barrier" in _kinds(result)
    assert any("32 of 64 threads" in f.message for f in result.findings)
