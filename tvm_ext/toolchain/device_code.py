"""Compile CUDA device code at build time, on a host without a GPU driver.

TVM's CUDA code generator hands the generated source to ``ffi.Module.create.cuda``, which
``libtvm_runtime_cuda.so`` registers. That library links against the driver's
``libcuda.so.1``; without a driver it does not load, the factory is missing, and TVM keeps
the CUDA *source* in the exported library (the GPU machine would need a CUDA compiler to
load it). So the build runs in a worker process that:

* finds a stand-in ``libcuda.so.1`` on ``LD_LIBRARY_PATH`` (:func:`build_libcuda_stub`: a
  tiny library, compiled with the host C compiler, that defines every ``cu*`` function
  ``libtvm_runtime_cuda.so`` imports and makes each return ``CUDA_ERROR_NO_DEVICE``; none
  is called while compiling), so TVM's real CUDA module factory loads; and
* registers its own ``tvm_callback_cuda_compile`` (:func:`install_nvcc_callback`), which the
  factory calls with the source: nvcc compiles it to a fatbin with the flags of
  :func:`~tvm_ext.toolchain.gencode.gencode_flags` (SASS for the target's arch plus PTX for
  newer GPUs; TVM's own callback needs NVRTC from ``cuda-bindings``, or nvcc through
  ``TVM_CUDA_COMPILE_MODE=nvcc`` with SASS only).

The exported library then carries the binary; :func:`library_device_code` reads back which
format it holds, so a build that still embeds source is caught here, not on the GPU machine.
On a machine with a driver no stand-in is needed (:func:`needs_libcuda_stub`).
"""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import time
from pathlib import Path

from .cuda import driver_present
from ..errors import KernelCompileError
from .gencode import gencode_flags

#: ``CUDA_ERROR_NO_DEVICE``: what every stand-in driver function returns.
_NO_DEVICE = 100
#: Serialized CUDA modules: kind "cuda" (u64-length-prefixed), blob length, then the format string.
_CUDA_RECORD = re.compile(rb"\x04\x00\x00\x00\x00\x00\x00\x00cuda(.{8})(.{8})", re.DOTALL)
BINARY_FORMATS = ("cubin", "fatbin", "ptx")
#: Seconds spent in nvcc by :func:`install_nvcc_callback`'s callback (read and reset by the builder).
NVCC_SECONDS: list[float] = []


def needs_libcuda_stub() -> bool:
    """True when the NVIDIA driver library cannot be loaded here."""
    return not driver_present()


def cuda_runtime_library() -> Path:
    """``libtvm_runtime_cuda.so`` of the installed TVM (found without importing tvm)."""
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.find_spec("tvm")
    if spec is None or not spec.submodule_search_locations:
        raise KernelCompileError("tvm is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "lib" / "libtvm_runtime_cuda.so"
    if not path.is_file():
        raise KernelCompileError(f"this TVM has no CUDA runtime ({path} missing)")
    return path


def driver_symbols(library: Path) -> list[str]:
    """The ``cu*`` driver functions ``library`` imports (``nm -D --undefined-only``)."""
    nm = shutil.which("nm")
    if nm is None:
        raise KernelCompileError("`nm` (binutils) is needed to list the driver functions TVM's CUDA runtime imports")
    out = subprocess.run([nm, "-D", "--undefined-only", str(library)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise KernelCompileError(f"nm failed on {library}: {out.stderr.strip()}")
    names = sorted({line.split()[-1].split("@")[0] for line in out.stdout.splitlines() if line.split()})
    return [n for n in names if re.fullmatch(r"cu[A-Z]\w*", n)]


def build_libcuda_stub(directory: str | Path, library: Path | None = None) -> Path:
    """Write and compile ``directory/libcuda.so.1`` (see the module docstring).

    Raises
    ------
    KernelCompileError
        No C compiler, or it fails.
    """
    symbols = driver_symbols(library or cuda_runtime_library())
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "libcuda_stub.c"
    lines = ["/* Stand-in for the NVIDIA driver so TVM's CUDA runtime loads on a build host. */"]
    lines += [f"int {name}(void) {{ return {_NO_DEVICE}; }}" for name in symbols]
    source.write_text("\n".join(lines) + "\n")
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise KernelCompileError("a C compiler (cc or gcc) is needed to build the stand-in libcuda.so.1")
    target = directory / "libcuda.so.1"
    out = subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(target), str(source)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise KernelCompileError(f"building the stand-in libcuda.so.1 failed: {out.stderr.strip()[:500]}")
    return target


def install_nvcc_callback() -> None:
    """Register ``tvm_callback_cuda_compile``: nvcc to a fatbin for ``Target.current()``'s arch.

    Call in the build worker only; it replaces TVM's callback for the whole process.
    """
    import tvm  # noqa: PLC0415
    import tvm_ffi  # noqa: PLC0415
    from tvm.support import nvcc  # noqa: PLC0415

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def _compile(code: str) -> bytearray:
        target = tvm.target.Target.current(allow_none=True)
        arch = None if target is None else target.attrs.get("arch")
        if arch is None:
            raise KernelCompileError("CUDA compile without a target arch: build inside `with target:`")
        start = time.perf_counter()
        binary = nvcc.compile_cuda(code, target_format="fatbin", arch=gencode_flags(str(arch)), compiler="nvcc")
        NVCC_SECONDS.append(time.perf_counter() - start)
        return binary


def library_device_code(path: str | Path) -> str | None:
    """Format of the CUDA device code in an exported library (``cubin`` also for fatbins,
    ``cuda`` for source), or None when it has no CUDA module."""
    data = Path(path).read_bytes()
    for match in _CUDA_RECORD.finditer(data):
        (fmt_len,) = struct.unpack("<Q", match.group(2))
        if 0 < fmt_len <= 16:
            start = match.end()
            fmt = data[start:start + fmt_len]
            if fmt.isalpha():
                return fmt.decode()
    return None


def check_device_code(path: str | Path) -> str:
    """Raise unless the exported library holds compiled CUDA device code; returns its format.

    Raises
    ------
    KernelCompileError
        The library embeds CUDA source (the GPU machine would need a compiler) or no CUDA module.
    """
    fmt = library_device_code(path)
    if fmt is None:
        raise KernelCompileError(f"{path}: no CUDA module found in the exported library")
    if fmt not in BINARY_FORMATS:
        raise KernelCompileError(f"{path}: the library embeds CUDA {fmt!r} (source), not compiled device code")
    return fmt


__all__ = ["needs_libcuda_stub", "cuda_runtime_library", "driver_symbols", "build_libcuda_stub",
           "install_nvcc_callback", "library_device_code", "check_device_code", "NVCC_SECONDS",
           "BINARY_FORMATS"]
