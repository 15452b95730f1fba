"""Barriers after shared-memory values written by some threads and read by others at the same index
(TVM's ThreadSync takes the same index for the same thread and puts none there): a layer norm's row
sums in a tile-graph kernel raced on the GPU's semantics (`tvm-ext verify` on Segformer-B0)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import tvm
from tvm import relax
from tvm.script import tirx as T

from tvm_ext.checks.kernel import emulate_function, run_device_kernel
from tvm_ext.checks.lowered import lowered_module
from tvm_ext.driver import load_module
from tvm_ext.graph import OpGraph
from tvm_ext.hardware import load_device
from tvm_ext.select.context import SelectionContext
from tvm_ext.tilegraph.planning import plan_group
from tvm_ext.tilegraph.schedule import build_tile_schedule
from tvm_ext.tir import is_device_kernel, sync_shared_broadcasts

sys.path.insert(0, str(Path(__file__).parent))
from test_tilegraph_lowering import H100, _norm_to_image


# fmt: off
@T.prim_func(private=True, s_tir=True)
def _row_sum_before(x: T.Buffer((4, 32), "float32"), y: T.Buffer((4, 32), "float32")):
    T.func_attr({"tirx.is_scheduled": True})
    s = T.sblock_alloc_buffer((4,), scope="shared")
    for ty in T.thread_binding(4, thread="threadIdx.y"):
        for tx in T.thread_binding(32, thread="threadIdx.x"):
            with T.sblock("sum"):
                vi = T.axis.spatial(4, ty)
                vk = T.axis.reduce(32, tx)
                with T.init():
                    s[vi] = T.float32(0)
                s[vi] = s[vi] + x[vi, vk]
    for ty in T.thread_binding(4, thread="threadIdx.y"):
        for tx in T.thread_binding(32, thread="threadIdx.x"):
            with T.sblock("out"):
                vi, vj = T.axis.remap("SS", [ty, tx])
                y[vi, vj] = x[vi, vj] - s[vi]


@T.prim_func(private=True, s_tir=True)
def _row_sum_expected(x: T.Buffer((4, 32), "float32"), y: T.Buffer((4, 32), "float32")):
    T.func_attr({"tirx.is_scheduled": True})
    s = T.sblock_alloc_buffer((4,), scope="shared")
    for ty in T.thread_binding(4, thread="threadIdx.y"):
        for tx in T.thread_binding(32, thread="threadIdx.x"):
            with T.sblock("sum"):
                vi = T.axis.spatial(4, ty)
                vk = T.axis.reduce(32, tx)
                with T.init():
                    s[vi] = T.float32(0)
                s[vi] = s[vi] + x[vi, vk]
    T.evaluate(T.call_intrin("void", "tirx.tvm_storage_sync", "shared"))
    for ty in T.thread_binding(4, thread="threadIdx.y"):
        for tx in T.thread_binding(32, thread="threadIdx.x"):
            with T.sblock("out"):
                vi, vj = T.axis.remap("SS", [ty, tx])
                y[vi, vj] = x[vi, vj] - s[vi]


@T.prim_func(private=True, s_tir=True)
def _one_thread_per_row(x: T.Buffer((4, 32), "float32"), y: T.Buffer((4, 32), "float32")):
    T.func_attr({"tirx.is_scheduled": True})
    s = T.sblock_alloc_buffer((4,), scope="shared")
    for ty in T.thread_binding(4, thread="threadIdx.y"):
        for tx in T.thread_binding(32, thread="threadIdx.x"):
            with T.sblock("gate"):
                vi = T.axis.spatial(4, ty)
                T.where(tx < 1)
                s[vi] = x[vi, 0] * T.float32(2)
            with T.sblock("out"):
                vi, vj = T.axis.remap("SS", [ty, tx])
                y[vi, vj] = x[vi, vj] * s[vi]


@T.prim_func(private=True, s_tir=True)
def _every_thread_its_own(x: T.Buffer((4, 32), "float32"), y: T.Buffer((4, 32), "float32")):
    T.func_attr({"tirx.is_scheduled": True})
    s = T.sblock_alloc_buffer((4, 32), scope="shared")
    for ty in T.thread_binding(4, thread="threadIdx.y"):
        for tx in T.thread_binding(32, thread="threadIdx.x"):
            with T.sblock("copy"):
                vi, vj = T.axis.remap("SS", [ty, tx])
                s[vi, vj] = x[vi, vj]
    for ty in T.thread_binding(4, thread="threadIdx.y"):
        for tx in T.thread_binding(32, thread="threadIdx.x"):
            with T.sblock("out"):
                vi, vj = T.axis.remap("SS", [ty, tx])
                y[vi, vj] = s[vi, 31 - vj]
# fmt: on


def _syncs(func) -> int:
    return func.script().count("tvm_storage_sync")


def test_a_row_reduction_into_shared_memory_gets_a_barrier_before_its_readers():
    tvm.ir.assert_structural_equal(sync_shared_broadcasts(_row_sum_before), _row_sum_expected)
    assert sync_shared_broadcasts(_row_sum_expected).same_as(_row_sum_expected)    # idempotent


def test_a_one_thread_write_gets_its_barrier_outside_the_writers_predicate():
    synced = sync_shared_broadcasts(_one_thread_per_row)
    assert _syncs(synced) == 1
    text = synced.script()
    assert text.index("tvm_storage_sync") > text.index('sblock("gate")')
    assert text.index("tvm_storage_sync") < text.index('sblock("out")')


def test_writes_indexed_by_every_thread_are_left_to_thread_sync():
    assert sync_shared_broadcasts(_every_thread_its_own).same_as(_every_thread_its_own)


def _norm_kernel():
    legal = relax.transform.LegalizeOps()(load_module(_norm_to_image(64, 64, 32, [64, 64, 32]), fp16=True))
    target = tvm.target.Target(H100)
    ctx = SelectionContext(legal, "main", OpGraph.from_module(legal), load_device("h100"), target)
    members = tuple(ctx.call_nodes())
    fused = ctx.fused_function(members)
    return fused, build_tile_schedule(fused, plan_group(ctx, members)), target


def test_a_tile_kernels_layer_norm_races_under_thread_sync_alone_and_not_in_our_pipeline():
    fused, kernel, target = _norm_kernel()
    assert _syncs(sync_shared_broadcasts(kernel)) == _syncs(kernel) + 2     # the mean's and the variance's sums
    (bare,) = [f for f in lowered_module(tvm.IRModule({"k": kernel.with_attr("global_symbol", "k")}), target,
                                         pipeline="s_tir").functions.values() if is_device_kernel(f)]
    rng = np.random.default_rng(0)
    names = [str(p.name) for p in bare.params]
    args = [rng.standard_normal(64 * 64 * 32).astype("float16") if "x" == n else
            rng.standard_normal(32).astype("float16") if n.startswith("param") else
            np.zeros(64 * 64 * 32, "float16") for n in names]
    result, _ = run_device_kernel(bare, args, poisoned={len(args) - 1})
    assert "race" in {f.kind for f in result.findings}        # TVM's ThreadSync alone: lanes read the sum unsynced
    verdict = emulate_function(fused, kernel, target, name="k", inputs=3)
    assert verdict.ok, verdict.findings
