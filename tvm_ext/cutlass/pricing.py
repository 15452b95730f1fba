"""CUTLASS kernels through the one cost interface: what a configuration does, and the cheapest one.

:func:`describe` turns a workload and a :class:`~tvm_ext.cutlass.config.KernelConfig` into the
kernel description the cost model prices (a :class:`~tvm_ext.select.describe.KernelDescription`):

* **flops** of the padded tile grid (``ceil(M / tbM) x tbM x ceil(N / tbN) x tbN x K x 2`` per
  batch entry): a tile computes all of its rows and columns even past the problem's edge;
* **grid**: output tiles x batch x split-K slices (stream-K: one CTA per SM, at most one per
  K step); **block**: the configuration's warps (3.x: three warp groups); **shared memory**: the
  pipeline stages of A and B tiles;
* **global bytes** as the tiling reads them: every CTA reads its ``tbM x K`` rows of A and
  ``K x tbN`` columns of B, so A is read ``ceil(N / tbN)`` times and B ``ceil(M / tbM)`` times;
  the output (and an epilogue source) once; serial split-K reads and writes the output once more
  per extra slice, stream-K an fp32 partial tile per extra CTA of a tile. The distinct bytes are
  the operands and the output once each;
* **DRAM bytes**: the distinct bytes when they fit in L2; else per *wave* of CTAs (the resident
  CTAs, from the occupancy calculator): CUTLASS rasterizes tiles in swizzled bands, so a wave's
  output tiles form a near-square ``a x b`` patch reading ``a`` row bands of A and ``b`` column
  bands of B (the whole K). The wave's CTAs start together and walk K in step, so a band they
  share is read from DRAM once per wave and re-read from L2 (assumed: the swizzled launch order
  keeps them in step); no reuse across waves is assumed. A 4096^3 fp16 GEMM moves 1.6 GB through
  L2 but about 140 MB through DRAM;
* **code path**: ``wgmma`` for 3.x configurations, ``mma_sync`` for 2.x; **dtype**: what the
  tensor cores compute in (:func:`~tvm_ext.cutlass.precision.math_dtype`: ``tfloat32`` for float32
  operands), so the cost model prices TF32 kernels at the device's TF32 tensor-core peak.

:func:`cheapest_config` prices every candidate configuration (:func:`candidates`) and returns
the cheapest (ties: less compute + memory time, fewer stages, no split-K, then the first listed).

Example
-------
>>> cfg, est = cheapest_config(wl, "sm_90a", load_device("h100"))   # describe(wl, cfg, device) each
>>> cfg.api, est.source
('3x', 'analytic')
"""
from __future__ import annotations

import math

from ..hardware import DeviceSpec
from ..select.analytic import AnalyticCostModel, fits_l2, resident_blocks
from ..select.candidate import CodePath, LaunchShape
from ..select.cost import CostEstimate, CostModel
from ..graph import element_bytes
from ..select.describe import KernelDescription
from .candidates import candidates
from .config import API_3X, KernelConfig
from .precision import math_dtype

#: Threads of a CUTLASS 3.x Hopper kernel: one producer and two consumer warp groups.
THREADS_3X = 384


def describe(wl, cfg: KernelConfig, device: DeviceSpec) -> KernelDescription:
    """What one call of ``wl`` with ``cfg`` computes and moves on ``device``."""
    if wl.kind == "attention":
        return describe_attention(wl, cfg, device)
    m, n, k = wl.gemm_mnk
    tbm, tbn, tbk = cfg.threadblock
    tiles_m, tiles_n = math.ceil(m / tbm), math.ceil(n / tbn)
    batch = wl.batch
    flops = 2 * tiles_m * tbm * tiles_n * tbn * k * batch
    if wl.flops > 2 * m * n * k * batch:   # a back-to-back pair: its second GEMM too
        flops += wl.flops - 2 * m * n * k * batch
    ib, ob = element_bytes(wl.dtype), element_bytes(wl.final_dtype)
    a, b, out = m * k * ib * batch, k * n * ib * (batch if getattr(wl, "b_batched", False) else 1), m * n * ob * batch
    source = getattr(getattr(wl, "epilogue", None), "source", "")
    c = out if source in ("residual", "bias_residual") else (n * ob if source == "bias" else 0)
    grid, partial = tiles_m * tiles_n * batch * cfg.split_k, 2 * (cfg.split_k - 1) * out
    if cfg.tile_scheduler == "stream_k":
        grid, partial = _stream_k(tiles_m * tiles_n * batch, math.ceil(k / tbk), tbm * tbn, device)
    global_bytes = a * tiles_n + b * tiles_m + out + c + partial
    stages = max(cfg.stages, 2)
    launch = LaunchShape(grid=grid,
                         threads=THREADS_3X if cfg.api == API_3X else cfg.threads,
                         shared_bytes=stages * (tbm + tbn) * tbk * ib)
    path = CodePath.WGMMA if cfg.api == API_3X else CodePath.MMA_SYNC
    unique = a + b + out + c
    return KernelDescription(flops, global_bytes, unique, launch, path, math_dtype(wl.dtype),
                             dram_bytes=_dram_bytes(wl, cfg, device, launch, unique, global_bytes, out + c))


def describe_attention(wl, cfg: KernelConfig, device: DeviceSpec) -> KernelDescription:
    """The fused attention kernel (CUTLASS example 41): one CTA per block of ``queries`` rows, head
    and batch entry walks all keys (causal: those up to its last row) in blocks of ``keys``.

    Flops are both products over the padded blocks; global bytes are Q and O once, K and V once
    per query block (each CTA streams them, causal ones up to their last row), the bias once per
    score it is added to; shared memory holds the Q block, one K/V block and the score block (fp32), an
    estimate of the kernel's ``SharedStorage`` (assumed, not read from the built kernel).
    """
    queries, keys, max_k = cfg.threadblock
    batch = wl.batch
    blocks_m = math.ceil(wl.m / queries)
    # keys each query block reads: all, or (causal) up to its last row
    read = [min(wl.n, (i + 1) * queries) if wl.causal else wl.n for i in range(blocks_m)]
    padded = sum(math.ceil(r / keys) * keys for r in read)
    flops = 2 * batch * padded * queries * (wl.d + wl.dv)
    eb = element_bytes(wl.dtype)
    q, o = batch * wl.m * wl.d * eb, batch * wl.m * wl.dv * eb
    kv_once = batch * wl.n * (wl.d + wl.dv) * eb
    kv = batch * sum(read) * (wl.d + wl.dv) * eb
    bias = batch * wl.m * wl.n * eb if wl.bias_shape else 0
    unique_bias = math.prod(wl.bias_shape) * eb if wl.bias_shape else 0
    launch = LaunchShape(grid=blocks_m * batch, threads=32 * cfg.warp_count[0],
                         shared_bytes=(queries * max_k + keys * max_k) * eb + queries * keys * 4)
    unique = q + o + kv_once + unique_bias
    moved = q + o + kv + bias
    return KernelDescription(flops, moved, unique, launch, CodePath.MMA_SYNC, math_dtype(wl.dtype),
                             dram_bytes=unique if fits_l2(unique, device) else moved)


def _stream_k(tiles: int, iterations: int, tile_elements: int, device: DeviceSpec) -> tuple[int, int]:
    """Grid and partial-sum bytes of a stream-K kernel: one cooperative CTA per SM (its stages fill
    shared memory) shares out the ``tiles x iterations`` K steps; each tile split over ``s`` CTAs
    writes and reads ``s - 1`` fp32 partial tiles through the workspace (CUTLASS's
    ``StreamKScheduler``; its heuristic may choose fewer CTAs, which this does not model)."""
    grid = max(1, min(device.sm_count, tiles * iterations))
    splits = max(1, grid // tiles)
    return grid, 2 * (splits - 1) * tiles * tile_elements * 4


def _dram_bytes(wl, cfg: KernelConfig, device: DeviceSpec, launch: LaunchShape, unique: int, moved: int,
                written: int) -> int:
    """DRAM bytes of the tiling (see the module docstring)."""
    if fits_l2(unique, device):
        return unique
    m, n, k = wl.gemm_mnk
    tbm, tbn, _ = cfg.threadblock
    tiles_m, tiles_n = math.ceil(m / tbm), math.ceil(n / tbn)
    ib = element_bytes(wl.dtype)
    # one wave: resident CTAs -> output tiles (split-K slices share one) -> an a x b patch per batch entry
    resident = min(launch.grid, resident_blocks(device, launch))
    tiles = max(1, math.ceil(resident / cfg.split_k))
    per_entry = min(tiles, tiles_m * tiles_n)
    entries = math.ceil(tiles / per_entry)
    pm = min(tiles_m, math.ceil(math.sqrt(per_entry)))
    pn = min(tiles_n, math.ceil(per_entry / pm))
    b_entries = entries if getattr(wl, "b_batched", False) else 1
    bands = entries * min(pm * tbm, m) * k * ib + b_entries * min(pn * tbn, n) * k * ib
    waves = math.ceil(launch.grid / resident)
    return min(moved, max(unique, waves * bands + written))


def ranked_by_price(wl, arch: str, device: DeviceSpec, model: CostModel | None = None) -> list[KernelConfig]:
    """Every candidate configuration of ``wl`` on ``arch``, cheapest first as the cost model prices
    them (ties: less compute + memory time, fewer stages, no split-K, first listed)."""
    return [cfg for cfg, _ in _priced(wl, arch, device, model)]


def _priced(wl, arch: str, device: DeviceSpec, model: CostModel | None) -> list[tuple[KernelConfig, CostEstimate]]:
    model = model or AnalyticCostModel()
    priced = [(model.cost(describe(wl, cfg, device), device), i, cfg) for i, cfg in enumerate(candidates(wl, arch, device))]

    def order(item):
        est, index, cfg = item
        busy = est.parts.get("compute_s", 0.0) + est.parts.get("memory_s", 0.0)
        return (round(est.seconds, 12), round(busy, 12), cfg.stages, cfg.split_k, index)

    return [(cfg, est) for est, _, cfg in sorted(priced, key=order)]


def cheapest_config(wl, arch: str, device: DeviceSpec, model: CostModel | None = None
                    ) -> tuple[KernelConfig, CostEstimate]:
    """The candidate configuration of ``wl`` the cost model prices lowest (see :func:`ranked_by_price`).

    Raises
    ------
    ValueError
        ``wl`` has no candidate configuration on ``arch``.
    """
    priced = _priced(wl, arch, device, model)
    if not priced:
        raise ValueError(f"no CUTLASS candidate for {wl.key()} on {arch}")
    return priced[0]


__all__ = ["THREADS_3X", "cheapest_config", "describe", "describe_attention", "ranked_by_price"]
