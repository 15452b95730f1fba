"""Pruned template candidates per architecture (the search space of a CUTLASS workload).

Candidate lists follow Bolt's guidelines (MLSys'22 §3.2.2): the largest warp tiles that fit the
register file, 4 or 8 warps per threadblock, small threadblocks for small problems, shared
memory within the device's opt-in limit; split-K only when the output tiles cannot fill the
SMs but K is long. Split-K and the batch count are runtime arguments of a compiled instance
(see :func:`tvm_ext.cutlass.instance.instance_key`), so split-K candidates add no compile.
Hopper (sm_90a) adds CUTLASS 3.x TMA + warp-group-MMA kernels when every operand is 16-byte
aligned. float32 workloads (TF32 tensor cores, :mod:`.precision`) take CUTLASS's own TF32 tile
list, whose K extents hold the same bytes as the 16-bit ones (half the elements).

Which candidate is used is decided by the cost interface: the fastest measured configuration,
else the one the cost model prices lowest (:func:`tvm_ext.cutlass.pricing.cheapest_config`).
"""
from __future__ import annotations

import math

import tvm

from ..hardware import DeviceSpec
from .config import API_2X, API_3X, KernelConfig
from .epilogue import Epilogue
from .workload import Workload
from .attention import ATTENTION, attention_configs

#: (threadblock, warp_count, stages) for Sm80 16-bit tensor-op kernels (instruction 16x8x16).
SM80_TILES: tuple[tuple[tuple[int, int, int], tuple[int, int, int], int], ...] = (
    ((256, 128, 32), (4, 2, 1), 3), ((128, 256, 32), (2, 4, 1), 3),
    ((256, 64, 32), (4, 1, 1), 4), ((64, 256, 32), (1, 4, 1), 4),
    ((128, 128, 32), (2, 2, 1), 3), ((128, 128, 32), (2, 2, 1), 4), ((128, 128, 32), (2, 2, 1), 5),
    ((128, 64, 32), (2, 2, 1), 6), ((64, 128, 32), (2, 2, 1), 6), ((64, 64, 32), (2, 2, 1), 10),
    ((256, 128, 64), (4, 2, 1), 3), ((128, 256, 64), (2, 4, 1), 3), ((128, 128, 64), (2, 2, 1), 4),
    ((128, 64, 64), (2, 2, 1), 3), ((64, 128, 64), (2, 2, 1), 3), ((64, 64, 64), (2, 2, 1), 5),
)
#: (threadblock, warp_count, stages) for Sm80 TF32 tensor-op kernels on float32 operands (instruction
#: 16x8x8): the tiles of cutlass_library's ``GenerateSM80_TensorOp_1688_fast_math`` (CUTLASS 4.2).
SM80_TF32_TILES: tuple[tuple[tuple[int, int, int], tuple[int, int, int], int], ...] = (
    ((256, 128, 16), (4, 2, 1), 3), ((128, 256, 16), (2, 4, 1), 3),
    ((256, 64, 16), (4, 1, 1), 4), ((64, 256, 16), (1, 4, 1), 4),
    ((128, 128, 16), (2, 2, 1), 5), ((128, 128, 16), (2, 2, 1), 4), ((128, 128, 16), (2, 2, 1), 3),
    ((128, 64, 16), (2, 2, 1), 6), ((64, 128, 16), (2, 2, 1), 6), ((64, 64, 16), (2, 2, 1), 10),
    ((256, 128, 32), (4, 2, 1), 3), ((128, 256, 32), (2, 4, 1), 3), ((256, 64, 32), (4, 1, 1), 4),
    ((64, 256, 32), (1, 4, 1), 4), ((128, 128, 32), (2, 2, 1), 4), ((128, 128, 32), (2, 2, 1), 3),
    ((128, 64, 32), (2, 2, 1), 3), ((64, 128, 32), (2, 2, 1), 3), ((64, 64, 32), (2, 2, 1), 5),
)
#: (tile, cluster, schedule) for Sm90 3.x kernels with 16-bit operands (stages chosen by the
#: builder); TF32 kernels use the same tiles with half the K elements (same bytes per stage).
SM90_TILES: tuple[tuple[tuple[int, int, int], tuple[int, int, int], str], ...] = (
    ((128, 128, 64), (1, 1, 1), "cooperative"), ((128, 256, 64), (1, 1, 1), "cooperative"),
    ((256, 128, 64), (1, 1, 1), "cooperative"), ((128, 128, 64), (2, 1, 1), "cooperative"),
    ((128, 256, 64), (2, 1, 1), "cooperative"), ((64, 128, 64), (1, 1, 1), "pingpong"),
    ((64, 256, 64), (1, 1, 1), "pingpong"), ((128, 128, 64), (1, 2, 1), "cooperative"),
)
SPLIT_K = (2, 4, 8, 16)
#: K iterations (threadblock K steps) a GEMM needs before stream-K variants are offered: with
#: fewer there is too little K to share out (the same bound serial split-K uses for 4 slices).
STREAM_K_MIN_ITERATIONS = 16


def arch_number(arch: str) -> int:
    """``"sm_90a"`` -> 90."""
    digits = "".join(ch for ch in arch.replace("sm_", "") if ch.isdigit())
    if not digits:
        raise ValueError(f"cannot read a compute capability from {arch!r}")
    return int(digits)


def element_bits(dtype: str) -> int:
    """Bits of one element of ``dtype``."""
    return tvm.DataType(dtype).bits


def mma_k(dtype: str) -> int:
    """K of one tensor-core MMA on ``dtype`` operands: 256 bits of operand per row, 16 16-bit or 8
    TF32 elements (PTX ISA: ``mma.sync`` m16n8k16 f16/bf16, m16n8k8 tf32; ``wgmma`` k16 / k8)."""
    return 256 // element_bits(dtype)


def _smem_bytes(tb: tuple[int, int, int], stages: int, bits: int) -> int:
    return stages * (tb[0] * tb[2] + tb[1] * tb[2]) * bits // 8


def _fits(wl: Workload, tb: tuple[int, int, int]) -> bool:
    """Prune threadblocks much larger than the problem (Bolt guideline iii)."""
    m, n, _ = wl.gemm_mnk
    return tb[0] <= max(64, 2 * m) and tb[1] <= max(64, 2 * n)


def uses_3x(wl: Workload, arch: str) -> bool:
    """Whether sm_90a 3.x kernels apply: Hopper target, GEMM, all operands 16-byte aligned, and an
    epilogue the 3.x fusion operations have (not a residual after the activation)."""
    if not arch.endswith("a") or arch_number(arch) != 90 or wl.kind != "gemm" or wl.epilogue.residual_after_act:
        return False
    full = [128 // element_bits(dtype) for dtype in (wl.dtype, wl.dtype, wl.final_dtype)]
    return list(wl.max_alignment) == full


def epilogue_splits_k(ep: Epilogue) -> bool:
    """Whether serial split-K may run a GEMM with epilogue ``ep``: not bias + residual (the
    broadcast epilogue would add its bias once per K slice)."""
    return ep.source != "bias_residual"


def _may_split_k(wl: Workload) -> bool:
    """Serial split-K: unbatched GEMMs whose epilogue allows it (:func:`epilogue_splits_k`)."""
    return wl.kind == "gemm" and wl.batch == 1 and epilogue_splits_k(wl.epilogue)


def admissible(wl: Workload, cfg: KernelConfig, arch: str) -> bool:
    """Whether ``cfg`` may run ``wl`` on ``arch`` under the rules :func:`candidates` enumerates by
    (a 3.x kernel only where :func:`uses_3x`, split-K only where the epilogue allows it). A
    measured record is keyed by the problem shape alone, so it may come from a workload with
    another epilogue."""
    if cfg.api == API_3X:
        return uses_3x(wl, arch)
    return cfg.split_k == 1 or _may_split_k(wl)


def candidates(wl: Workload, arch: str, device: DeviceSpec) -> list[KernelConfig]:
    """All pruned candidates for the workload on ``arch`` (``sm_80``..., ``sm_90a``)."""
    if arch_number(arch) < 80:
        return []
    if wl.kind == ATTENTION:
        return attention_configs(wl)
    align = wl.max_alignment
    bits, inst_k = element_bits(wl.dtype), mma_k(wl.dtype)
    out: list[KernelConfig] = []
    m, n, k = wl.gemm_mnk
    if uses_3x(wl, arch):
        for (tm, tn, tk), cluster, schedule in SM90_TILES:
            tile = (tm, tn, tk * 16 // bits)
            if not _fits(wl, tile):
                continue
            warps = (2, 1, 1) if schedule == "cooperative" else (1, 1, 1)
            out.append(KernelConfig(API_3X, tile, warps, (64, tn, inst_k), 0, alignment=align,
                                    cluster=cluster, schedule=schedule))
            tiles = math.ceil(m / tile[0]) * math.ceil(n / tile[1]) * wl.batch
            if schedule == "cooperative" and cluster == (1, 1, 1) and tiles < device.sm_count \
                    and k >= STREAM_K_MIN_ITERATIONS * tile[2]:
                out.append(KernelConfig(API_3X, tile, warps, (64, tn, inst_k), 0, alignment=align,
                                        cluster=cluster, schedule=schedule, tile_scheduler="stream_k"))
    swizzles = (4,) if wl.kind == "conv2d" else (8, 1)
    for tb, warps, stages in (SM80_TILES if bits == 16 else SM80_TF32_TILES):
        if not _fits(wl, tb) or _smem_bytes(tb, stages, bits) > device.max_shared_memory_per_block_optin:
            continue
        for sw in swizzles:
            out.append(KernelConfig(API_2X, tb, warps, (16, 8, inst_k), stages, swizzle=sw, alignment=align))
        tiles = math.ceil(m / tb[0]) * math.ceil(n / tb[1])
        if _may_split_k(wl) and tiles < device.sm_count:
            for split in SPLIT_K:
                if k >= 4 * split * tb[2] and tiles * split <= 2 * device.sm_count:
                    # same swizzle as the unsplit kernel: split-K is a runtime argument, so both
                    # run the same compiled instance (the grid has fewer tiles than SMs anyway)
                    out.append(KernelConfig(API_2X, tb, warps, (16, 8, inst_k), stages, swizzle=swizzles[0],
                                            split_k=split, alignment=align))
    return out
