"""Compile generated CUDA source with nvcc (no GPU needed): the one device-code compile.

Without a CUDA driver ``tvm.compile`` only generates CUDA source. :func:`compile_cuda_source`
runs nvcc on it with the flags of :func:`~tvm_ext.toolchain.gencode.gencode_flags` for the
target's arch (SASS plus PTX): :func:`~tvm_ext.toolchain.export.export_library` packs the
fatbin into the library, and tests use it as a kernel check (broken kernels show up at build time).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import tvm

from ..errors import KernelCompileError
from .cuda import cuda_root, use_toolkit
from .gencode import gencode_flags


@dataclass(frozen=True)
class NvccResult:
    """Outcome of one nvcc run.

    Attributes
    ----------
    seconds : float
        Wall time of the nvcc run.
    arch : str
        The target arch compiled for (``sm_90``).
    binary_bytes : int
        Size of the produced fatbin (SASS and PTX).
    cuda_root : str
        Toolkit root used.
    binary : bytes
        The fatbin.
    """

    seconds: float
    arch: str
    binary_bytes: int
    cuda_root: str
    binary: bytes = field(default=b"", repr=False)


def _first_errors(message: str, limit: int = 3) -> str:
    tail = message.split("Compilation error:", 1)[-1]
    lines = [ln.strip() for ln in tail.splitlines() if "error" in ln.lower()]
    return "; ".join(lines[:limit]) or (tail.strip().splitlines() or ["nvcc failed"])[-1]


def compile_cuda_source(source: str, target: tvm.target.Target) -> NvccResult:
    """Compile CUDA ``source`` to a fatbin for ``target``'s arch with nvcc.

    Raises
    ------
    KernelCompileError
        nvcc or the toolkit is missing, the target has no arch, or nvcc reports errors
        (the message quotes the first error lines).
    """
    if not source.strip():
        raise KernelCompileError("no CUDA source to compile (the module has no GPU kernels)")
    root = cuda_root()
    arch = target.attrs.get("arch")
    if arch is None:
        raise KernelCompileError(f"target {target} has no 'arch'; nvcc needs one")
    flags = gencode_flags(str(arch))
    from tvm.support import nvcc

    start = time.perf_counter()
    try:
        with use_toolkit(root), target:
            binary = nvcc.compile_cuda(source, target_format="fatbin", arch=flags, compiler="nvcc")
    except RuntimeError as err:
        raise KernelCompileError(f"nvcc failed for {arch}: {_first_errors(str(err))}") from None
    return NvccResult(seconds=time.perf_counter() - start, arch=str(arch), binary_bytes=len(binary),
                      cuda_root=str(root), binary=bytes(binary))
