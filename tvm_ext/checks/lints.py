"""Static checks of a kernel as built: reductions lowered to allreduces, spills, co-residency.

* Every reduction whose reduction loop is bound to a thread axis must become an allreduce
  (shuffles and shared staging). TVM's ``LowerCrossThreadReduction`` leaves a block it does not
  recognise (non-affine bindings, a loop extent that depends on ``blockIdx``) as it is, and it
  reaches CUDA as a read-modify-write that every thread runs at once.
* ptxas's report of the compiled kernel (:func:`~tvm_ext.toolchain.resource_usage`): bytes
  spilled per thread are a finding (and a price: local memory traffic).
* A kernel with a grid barrier needs every block resident: its grid must not exceed the blocks per
  SM that its real registers and shared memory allow, times the SMs.

Example
-------
>>> unlowered_thread_reductions(scheduled, target)
[]
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

from ..hardware import device_from_target, occupancy
from ..tir.thread_reductions import thread_bound_reductions
from ..toolchain import KernelUsage
from .memory import Finding
from .tir_stmt import thread_extents


def unlowered_thread_reductions(func: tirx.PrimFunc, target: tvm.target.Target) -> list[str]:
    """Blocks of scheduled ``func`` that reduce over a thread-bound loop and that TVM's
    ``LowerCrossThreadReduction`` leaves as they are (each would be a racy read-modify-write)."""
    if not thread_bound_reductions(func.body):
        return []
    mod = tirx.transform.BindTarget(target)(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}))
    with target:
        lowered = tvm.s_tir.transform.LowerCrossThreadReduction()(mod)["main"]
    return [block.name_hint for block in thread_bound_reductions(lowered.body)]


def _dynamic_shared_bytes(kernel: tirx.PrimFunc) -> int:
    total = [0]

    def on_alloc(a) -> None:
        buf = a.buffer
        if str(buf.ty.storage_scope) == "shared.dyn":
            count = 1
            for d in buf.ty.shape:
                count *= int(d)
            total[0] += count * tvm.DataType(str(buf.ty.dtype)).bits // 8 * tvm.DataType(str(buf.ty.dtype)).lanes

    tvm_ffi.structural_walk(kernel.body, (tirx.AllocBuffer, on_alloc))
    return total[0]


def usage_findings(kernel: tirx.PrimFunc, usage: KernelUsage, target: tvm.target.Target,
                   cooperative: bool) -> list[Finding]:
    """Spills, and for a kernel with a grid barrier a grid over the co-resident limit."""
    found: list[Finding] = []
    if usage.spill_stores or usage.spill_loads:
        found.append(Finding("spill", f"ptxas spills {usage.spill_stores} bytes per thread to local memory "
                                      f"({usage.spill_loads} bytes of spill loads, {usage.registers} registers)"))
    if cooperative:
        extents = thread_extents(kernel)
        grid = extents.get("blockIdx.x", 1) * extents.get("blockIdx.y", 1) * extents.get("blockIdx.z", 1)
        threads = extents.get("threadIdx.x", 1) * extents.get("threadIdx.y", 1) * extents.get("threadIdx.z", 1)
        shared = usage.shared_bytes + _dynamic_shared_bytes(kernel)
        spec = device_from_target(target)
        resident = occupancy(spec, threads, usage.registers, shared).blocks_per_sm * spec.sm_count
        if grid > resident:
            found.append(Finding("co_residency", f"a grid barrier needs all {grid} blocks resident; with "
                                                 f"{usage.registers} registers and {shared} B of shared memory "
                                                 f"per block only {resident} fit"))
    return found


__all__ = ["unlowered_thread_reductions", "usage_findings"]
