"""A compiled CUTLASS instance: its shape-free identity, C entry point and emitted CUDA source.

CUTLASS kernels are templates over everything but the problem size, so one compiled instance
serves every offload with the same :func:`instance_key`; the entry point's name is a hash of that
key. The codegen, the profiler and the contract check all emit instances through
:func:`kernel_for`.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

from .config import API_3X, KernelConfig
from .emit_attention import emit_attention
from .emit_b2b import emit_b2b_conv2d, emit_b2b_gemm
from .emit_conv import emit_conv2d
from .emit_gemm import emit_gemm
from .workload import Offload

#: Workload kinds fused only with measurements (their default is the first register-file variant).
FUSED_KINDS = ("b2b_gemm", "b2b_conv2d")
#: kind -> ``emit(workload, config, entry) -> CUDA source`` of the instance.
EMITTERS = {
    "gemm": lambda wl, cfg, entry: emit_gemm(wl, cfg, 90 if cfg.api == API_3X else 80, entry),
    "conv2d": emit_conv2d,
    "b2b_gemm": emit_b2b_gemm,
    "b2b_conv2d": emit_b2b_conv2d,
    "attention": emit_attention,
}


@dataclass(frozen=True)
class Kernel:
    """A chosen instance: C entry point, shape-free instance key, the offload's config, CUDA source.

    ``config`` is the offload's full choice; its runtime part (split-K slices) is not in the
    instance, so offloads with different shapes or split-K share one ``entry`` and ``source``.
    """

    entry: str
    config: KernelConfig
    source: str
    from_database: bool
    key: str = ""


def instance_key(wl, cfg: KernelConfig) -> str:
    """Shape-free identity of the compiled instance of ``wl`` with ``cfg``.

    Everything that is a template parameter, nothing that is a runtime argument: operator kind,
    dtypes, B layout, epilogue, tile configuration (threadblock, warps, instruction, stages,
    swizzle, alignment, 3.x cluster and schedule), the conv stride support and the kernel arch
    (``sm80`` for 2.x kernels, also when built for sm_90a; ``sm90`` for 3.x). Problem sizes,
    batch count and split-K slices are runtime arguments of the launcher.
    """
    tile = dataclasses.replace(cfg, split_k=1).name().replace("_k1_", "_")
    if wl.kind == "attention":  # queries, keys and the largest head dim per block; a bias or none
        return f"attention|{wl.dtype}|{'bias' if wl.bias_shape else 'nobias'}|{tile}|sm80"
    if wl.kind in FUSED_KINDS:  # N0 and N1 are threadblock N of the two GEMMs
        return f"{wl.kind}|{wl.dtype}|bias_relu,bias_{wl.activation1}|{tile}|sm80"
    kernel_arch = 90 if cfg.api == API_3X else 80
    ep = wl.epilogue.suffix.strip("_") or "plain"
    if wl.kind == "conv2d":
        stride = "unit" if wl.stride == (1, 1) else "strided"
        return f"conv2d_fprop|{wl.dtype}->{wl.final_dtype}|nhwc|{ep}|stride={stride}|{tile}|sm{kernel_arch}"
    return (f"gemm|{wl.dtype}->{wl.out_dtype}->{wl.final_dtype}|a=row,b={wl.layout_b}|{ep}|{tile}"
            f"|sm{kernel_arch}")


def kernel_for(off: Offload, cfg: KernelConfig, arch: str, from_db: bool = False) -> Kernel:
    """Emit the instance source for one offload (entry name = hash of :func:`instance_key`)."""
    wl = off.workload
    key = instance_key(wl, cfg)
    entry = "tvm_ext_cutlass_" + hashlib.sha1(key.encode()).hexdigest()[:16]
    return Kernel(entry, cfg, EMITTERS[wl.kind](wl, cfg, entry), from_db, key)



__all__ = ["EMITTERS", "FUSED_KINDS", "Kernel", "instance_key", "kernel_for"]
