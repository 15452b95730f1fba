"""CUDA device code inside exported libraries: which format and archs, and a stand-in driver.

:func:`~tvm_ext.toolchain.export.export_library` compiles the device code at export time
(nvcc, SASS for the target's arch plus PTX for newer GPUs). :func:`library_device_code` reads
back which format a library holds (``cuda`` means source: the GPU machine would need a
compiler to load it) and :func:`device_code_archs` which GPUs its fatbin covers
(``cuobjdump``); :func:`check_device_code` fails on source.

:func:`build_libcuda_stub` makes a stand-in ``libcuda.so.1`` (every ``cu*`` function
``libtvm_runtime_cuda.so`` imports, each returning ``CUDA_ERROR_NO_DEVICE``): with it on
``LD_LIBRARY_PATH`` TVM's CUDA runtime loads on a host without the NVIDIA driver, so a test can
load an exported library with the real CUDA module loader and see that loading compiles nothing.
"""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

from ..errors import KernelCompileError

#: ``CUDA_ERROR_NO_DEVICE``: what every stand-in driver function returns.
_NO_DEVICE = 100
#: Serialized CUDA modules: kind "cuda" (u64-length-prefixed), blob length, then the format string.
_CUDA_RECORD = re.compile(rb"\x04\x00\x00\x00\x00\x00\x00\x00cuda(.{8})(.{8})", re.DOTALL)
BINARY_FORMATS = ("cubin", "fatbin", "ptx")
#: Magic number of a fatbin (little-endian) and its header: magic, version, header size, payload size.
_FATBIN_MAGIC = b"\x50\xed\x55\xba"
_FATBIN_HEADER = struct.Struct("<IHHQ")
_ARCH_SPECIFIC = 0x100000


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


def _fatbin_entries(data: bytes, pos: int) -> tuple[list[str], int]:
    """Archs of the fatbin at ``pos`` and its end. Entry header: kind (1 PTX, 2 ELF), version,
    header size, payload size (u64), ..., SM version (u32 at 28), flags (u32 at 40; 0x100000: ``a``)."""
    _, _, header, size = _FATBIN_HEADER.unpack_from(data, pos)
    end, entry, found = min(len(data), pos + header + size), pos + header, []
    while entry + 44 <= end:
        kind, _, entry_header = struct.unpack_from("<HHI", data, entry)
        (payload,) = struct.unpack_from("<Q", data, entry + 8)
        (sm,) = struct.unpack_from("<I", data, entry + 28)
        (flags,) = struct.unpack_from("<I", data, entry + 40)
        suffix = "a" if flags & _ARCH_SPECIFIC else ""
        if kind in (1, 2):
            found.append(f"sm_{sm}{suffix} SASS" if kind == 2 else f"compute_{sm}{suffix} PTX")
        entry += entry_header + payload
    return found, end


def device_code_archs(path: str | Path) -> list[str]:
    """What the fatbins in a library run on, e.g. ``["sm_90 SASS", "compute_90 PTX"]`` (read from the
    fatbin headers, no toolkit needed); empty without a fatbin."""
    data = Path(path).read_bytes()
    found: list[str] = []
    pos = data.find(_FATBIN_MAGIC)
    while pos >= 0 and pos + _FATBIN_HEADER.size <= len(data):
        archs, end = _fatbin_entries(data, pos)
        found += [a for a in archs if a not in found]
        pos = data.find(_FATBIN_MAGIC, max(end, pos + 1))
    return found


__all__ = ["cuda_runtime_library", "driver_symbols", "build_libcuda_stub",
           "library_device_code", "device_code_archs", "check_device_code", "BINARY_FORMATS"]
