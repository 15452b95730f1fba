"""Compile generated CUDA source with nvcc as a kernel check (no GPU needed).

Without a CUDA driver ``tvm.compile`` only generates CUDA source; the GPU machine compiles it
when it loads the module. :func:`compile_cuda_source` runs nvcc on that source now, for the
target's arch, so broken kernels show up at build time. The device code is not kept.

TVM locates the toolkit through ``CUDA_PATH`` only (else the directory above ``which nvcc``,
which is wrong when ``nvcc`` on PATH is a wrapper script); :func:`find_cuda_root` finds the
real root and :func:`compile_cuda_source` sets ``CUDA_PATH`` to it for the call.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import tvm

from ..errors import KernelCompileError

_WRAPPED_NVCC = re.compile(r"(/[^\s'\"]+)/bin/nvcc\b")


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
        Size of the produced cubin.
    cuda_root : str
        Toolkit root used.
    """

    seconds: float
    arch: str
    binary_bytes: int
    cuda_root: str


def _is_root(path: Path) -> bool:
    return (path / "bin" / "nvcc").is_file() and (path / "include" / "cuda_runtime.h").is_file()


def find_cuda_root() -> Path | None:
    """The CUDA toolkit root (``$CUDA_PATH``, else resolved from ``nvcc`` on PATH), or None."""
    env = os.environ.get("CUDA_PATH")
    if env and _is_root(Path(env)):
        return Path(env)
    nvcc = shutil.which("nvcc")
    if nvcc is not None:
        real = Path(os.path.realpath(nvcc))
        if _is_root(real.parent.parent):
            return real.parent.parent
        with contextlib.suppress(OSError, UnicodeDecodeError):
            if real.stat().st_size < 65536:  # a wrapper script: look for the nvcc it execs
                for match in _WRAPPED_NVCC.finditer(real.read_text()):
                    if _is_root(Path(match.group(1))):
                        return Path(match.group(1))
    default = Path("/usr/local/cuda")
    return default if _is_root(default) else None


def nvcc_available() -> bool:
    """Whether nvcc and a toolkit root can be found."""
    return shutil.which("nvcc") is not None and find_cuda_root() is not None


@contextlib.contextmanager
def _cuda_path(root: Path) -> Iterator[None]:
    old = os.environ.get("CUDA_PATH")
    os.environ["CUDA_PATH"] = str(root)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CUDA_PATH", None)
        else:
            os.environ["CUDA_PATH"] = old


def _first_errors(message: str, limit: int = 3) -> str:
    tail = message.split("Compilation error:", 1)[-1]
    lines = [ln.strip() for ln in tail.splitlines() if "error" in ln.lower()]
    return "; ".join(lines[:limit]) or (tail.strip().splitlines() or ["nvcc failed"])[-1]


def compile_cuda_source(source: str, target: tvm.target.Target) -> NvccResult:
    """Compile CUDA ``source`` to a cubin for ``target``'s arch with nvcc.

    Raises
    ------
    KernelCompileError
        nvcc or the toolkit is missing, the target has no arch, or nvcc reports errors
        (the message quotes the first error lines).
    """
    if not source.strip():
        raise KernelCompileError("no CUDA source to compile (the module has no GPU kernels)")
    root = find_cuda_root()
    if shutil.which("nvcc") is None or root is None:
        raise KernelCompileError("nvcc / CUDA toolkit not found (put nvcc on PATH or set CUDA_PATH)")
    arch = target.attrs.get("arch")
    if arch is None:
        raise KernelCompileError(f"target {target} has no 'arch'; nvcc needs one")
    from tvm.support import nvcc

    start = time.perf_counter()
    try:
        with _cuda_path(root), target:
            binary = nvcc.compile_cuda(source, target_format="cubin", compiler="nvcc")
    except RuntimeError as err:
        raise KernelCompileError(f"nvcc failed for {arch}: {_first_errors(str(err))}") from None
    return NvccResult(seconds=time.perf_counter() - start, arch=str(arch), binary_bytes=len(binary),
                      cuda_root=str(root))
