"""The analytic cost model: seconds of one kernel call from its work, traffic and launch shape.

For a kernel (a :class:`~tvm_ext.select.candidate.Candidate`, or any object with the same
``flops``, ``global_bytes``, ``unique_bytes``, ``launch``, ``code_path`` and ``dtype``) on a
:class:`~tvm_ext.hardware.DeviceSpec` (constants in its ``cost_model``, each sourced)::

    time   = launches x launch overhead + max(compute, memory) + grid barriers x grid_sync
           (a multi-stage kernel: sum over its stages of max(compute, memory) instead)
    compute = flops / (peak(path, dtype) x efficiency(path)) x wave quantization
    memory  = max(DRAM bytes / achievable DRAM bandwidth, global bytes / L2 bandwidth)

* **peak(path, dtype)**: the tensor-core peak of the dtype for ``wmma`` (TVM's tensorized
  schedules) / ``mma_sync`` / ``wgmma`` (CUTLASS 2.x / 3.x) and
  tile kernels' WMMA stages (``wmma_tile``, at a measured, much lower efficiency) (TF32 for
  float32 where the device has it), the CUDA-core peak (``simt_peak_flops``) for SIMT
  and thread-per-output contractions (``simt_contraction``, at a measured, much lower efficiency);
* **wave quantization** (compute): blocks run in waves over the SMs; an SM that holds
  ``ceil(grid / SMs)`` blocks while others hold fewer sets the time, so the ideal time is scaled
  by ``ceil(grid / SMs) / (grid / SMs)`` (>= 1, and ``SMs / grid`` for grids smaller than the GPU);
* **DRAM bytes**: what the kernel's description says its tiling reads from DRAM
  (``dram_bytes``, when the generator knows its tiling, as CUTLASS's does: see
  :func:`~tvm_ext.cutlass.pricing.describe`), else its distinct bytes (``unique_bytes``) when they
  fit in L2 (:func:`fits_l2`: re-reads then hit L2), else everything it moves (``global_bytes``);
* **achievable DRAM bandwidth**: ``min(datasheet x dram_efficiency, bytes in flight / latency)``
  (a SIMT kernel's at ``simt_dram_efficiency`` where the device file gives one: fitted to TVM's
  SIMT kernels, which stream far below a copy benchmark)
  (Little's law), where bytes in flight = resident blocks (one wave, from the occupancy
  calculator) x per block ``threads x bytes_in_flight_per_thread`` -- or, for tensor-core kernels,
  whose pipelined copies (cp.async stages, TMA) keep their staged shared memory in flight, the
  larger of that and the block's shared memory: a small grid cannot saturate HBM.

Example
-------
>>> model = AnalyticCostModel()
>>> est = model.cost(candidate, load_device("h100"))
>>> est.source, sorted(est.parts)
('analytic', ['compute_s', 'launch_s', 'memory_s', 'sync_s'])
"""
from __future__ import annotations

import math
from typing import Protocol

from ..hardware import DeviceSpec, occupancy
from .candidate import CodePath, LaunchShape
from .cost import CostEstimate

#: Registers per thread assumed when a kernel's count is unknown (*assumed*: a lightly unrolled
#: kernel; the stitch planner plans its launches with the same number).
ASSUMED_REGISTERS = 32


class Priced(Protocol):
    """What the cost model reads of a kernel (a Candidate has all of it)."""

    flops: int
    global_bytes: int
    launch: LaunchShape
    code_path: CodePath
    dtype: str

    @property
    def unique_bytes(self) -> int:
        """Distinct bytes the kernel touches in global memory."""


def fits_l2(nbytes: int, device: DeviceSpec) -> bool:
    """Whether ``nbytes`` of data stay in ``device``'s L2 between re-reads (the one L2 rule)."""
    return nbytes <= device.l2_cache_bytes


def dram_bytes(kernel: Priced, device: DeviceSpec) -> int:
    """Bytes one call of ``kernel`` moves to and from DRAM (see the module docstring)."""
    known = int(getattr(kernel, "dram_bytes", 0))
    if known:
        return known
    return kernel.unique_bytes if fits_l2(kernel.unique_bytes, device) else kernel.global_bytes


def peak_flops(device: DeviceSpec, code_path: CodePath, dtype: str) -> float:
    """The peak rate of ``code_path`` for ``dtype`` on ``device`` (before efficiency)."""
    simt = device.cost.simt_peak_flops
    if code_path in (CodePath.SIMT, CodePath.SIMT_CONTRACTION):
        return simt.get(dtype, simt["float32"])
    if dtype == "float32":
        return device.peak_flops.get("tfloat32", simt["float32"])
    return device.peak_flops.get(dtype, device.peak_flops["float16"])


def efficiency(device: DeviceSpec, code_path: CodePath) -> float:
    """The fraction of its peak ``code_path`` sustains on ``device`` (``wgmma`` or ``wmma`` where the
    device file gives none is priced as ``mma_sync``)."""
    eff = device.cost.efficiency
    return eff.get(code_path.value, eff["mma_sync"])


def resident_blocks(device: DeviceSpec, launch: LaunchShape) -> int:
    """Blocks of ``launch`` resident at once (one wave), from the occupancy calculator."""
    try:
        occ = occupancy(device, max(1, launch.threads), launch.registers or ASSUMED_REGISTERS, launch.shared_bytes)
    except ValueError:  # a launch the device cannot run at all: one block at a time per SM
        return device.sm_count
    return occ.blocks_per_sm * device.sm_count


def wave_factor(device: DeviceSpec, grid: int) -> float:
    """``ceil(grid / SMs) / (grid / SMs)``: how much longer than ideal the SM with the most blocks takes."""
    if grid <= 0:
        return 1.0
    per_sm = grid / device.sm_count
    return math.ceil(per_sm) / per_sm


class AnalyticCostModel:
    """The analytic model (see the module docstring).

    Parameters
    ----------
    cuda_graph : bool
        Price launches as CUDA-graph replays (``launch_overhead_graph_s``).
    """

    source = "analytic"

    def __init__(self, cuda_graph: bool = False):
        self.cuda_graph = cuda_graph

    def parts(self, kernel: Priced, device: DeviceSpec) -> dict[str, float]:
        """The terms of the model: ``launch_s``, ``compute_s``, ``memory_s``, ``sync_s``; a
        multi-stage kernel (``stages``) adds ``stages_s``, the sum of its stages' max(compute, memory)
        (stages run one after another, separated by barriers), and its compute and memory terms
        are the sums over its stages."""
        c = device.cost
        launch = kernel.launch
        if launch.kernels == 0:  # a view (reshape lowered to nothing): no launch, no work
            return {"launch_s": 0.0, "compute_s": 0.0, "memory_s": 0.0, "sync_s": 0.0}
        per_launch = c.launch_overhead_graph_s if self.cuda_graph else c.launch_overhead_s
        stages = getattr(kernel, "stages", ())
        if stages:
            each = [self._work(s, device) for s in stages]
            return {"launch_s": launch.kernels * per_launch, "compute_s": sum(w[0] for w in each),
                    "memory_s": sum(w[1] for w in each), "sync_s": launch.grid_syncs * c.grid_sync_s,
                    "stages_s": sum(max(w) for w in each)}
        compute, memory = self._work(kernel, device)
        return {"launch_s": launch.kernels * per_launch, "compute_s": compute, "memory_s": memory,
                "sync_s": launch.grid_syncs * c.grid_sync_s}

    def _work(self, kernel: Priced, device: DeviceSpec) -> tuple[float, float]:
        """Compute and memory seconds of one kernel (or stage)."""
        c = device.cost
        launch = kernel.launch
        compute = 0.0
        if kernel.flops > 0:
            rate = peak_flops(device, kernel.code_path, kernel.dtype) * efficiency(device, kernel.code_path)
            compute = kernel.flops / rate * wave_factor(device, launch.grid)
        per_block = launch.threads * c.bytes_in_flight_per_thread
        if kernel.code_path not in (CodePath.SIMT, CodePath.SIMT_CONTRACTION):   # pipelined copies keep
            # the staged tiles in flight
            per_block = max(per_block, launch.shared_bytes)
        in_flight = min(launch.grid, resident_blocks(device, launch)) * per_block
        simt = kernel.code_path in (CodePath.SIMT, CodePath.SIMT_CONTRACTION)
        fraction = c.simt_dram_efficiency if simt and c.simt_dram_efficiency else c.dram_efficiency
        dram_bw = min(device.dram_bandwidth_bytes_per_s * fraction, in_flight / c.dram_latency_s)
        l2_bw = device.level("l2").bandwidth_bytes_per_s
        memory = max(dram_bytes(kernel, device) / dram_bw, kernel.global_bytes / l2_bw) if kernel.global_bytes else 0.0
        return compute, memory

    def cost(self, kernel: Priced, device: DeviceSpec) -> CostEstimate:
        """Seconds of one call of ``kernel`` on ``device``."""
        p = self.parts(kernel, device)
        work = p["stages_s"] if "stages_s" in p else max(p["compute_s"], p["memory_s"])
        seconds = p["launch_s"] + work + p["sync_s"]
        return CostEstimate(seconds, self.source, p)


__all__ = ["ASSUMED_REGISTERS", "AnalyticCostModel", "Priced", "efficiency", "peak_flops", "resident_blocks",
           "dram_bytes", "fits_l2", "wave_factor"]
