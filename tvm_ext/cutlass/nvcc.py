"""nvcc for CUTLASS sources: include paths, flags, and an on-disk cache keyed by source hash.

The toolkit and the ``-gencode`` flags come from :mod:`tvm_ext.toolchain`; what is here is
CUTLASS-specific.

CUTLASS instances take tens of seconds each to compile on a small machine, so every object
is cached under :func:`cache_dir` (``$TVM_EXT_CUTLASS_CACHE`` or ``~/.cache/tvm_ext/cutlass``)
with the SHA-256 of (source, flags, nvcc version) as its name. Compiles run in parallel.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from ..errors import KernelCompileError
from ..toolchain.cuda import nvcc_path, nvcc_version
from ..toolchain.gencode import gencode_flags
from .errors import CutlassSetupError

_LOG = logging.getLogger(__name__)
CACHE_ENV = "TVM_EXT_CUTLASS_CACHE"


def cutlass_root() -> Path:
    """``cutlass_library/source`` of the installed ``nvidia-cutlass`` package."""
    try:
        import cutlass_library
    except ImportError as err:
        raise CutlassSetupError("the CUTLASS offload needs the 'nvidia-cutlass' package (pip install nvidia-cutlass)") from err
    root = Path(cutlass_library.__file__).parent / "source"
    if not (root / "include" / "cutlass" / "cutlass.h").exists():
        raise CutlassSetupError(f"CUTLASS headers not found under {root}")
    return root


#: The package's own C++ headers (operation adapters, the contract hook and its program's driver).
OWN_INCLUDE = Path(__file__).parent / "include"


def tvm_ffi_include() -> Path:
    import tvm_ffi.libinfo

    return Path(tvm_ffi.libinfo.find_include_path())


def include_dirs() -> list[Path]:
    """CUTLASS, CUTLASS util, CUTLASS examples 13 (back-to-back kernels) and 41 (fused attention),
    the package's own headers (with the empty ``curand_kernel.h`` example 41 includes but, without
    dropout, does not use) and TVM-FFI includes."""
    root = cutlass_root()
    return [root / "include", root / "tools" / "util" / "include", root / "examples" / "13_two_tensor_op_fusion",
            root / "examples" / "41_fused_multi_head_attention", OWN_INCLUDE, OWN_INCLUDE / "no_curand",
            tvm_ffi_include()]


def nvcc_flags(arch: str) -> list[str]:
    """Flags for a CUTLASS translation unit (object file, position independent)."""
    return ["-std=c++17", "-O3", "-DNDEBUG", "-DCUTLASS_ENABLE_TENSOR_CORE_MMA=1", "--expt-relaxed-constexpr",
            "-Xcompiler=-fPIC", "-Xcompiler=-fvisibility=default", "-w", *gencode_flags(arch)]


def cache_dir() -> Path:
    path = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "tvm_ext" / "cutlass")
    path.mkdir(parents=True, exist_ok=True)
    return path


def source_key(source: str, flags: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for part in (source, "\0".join(flags), nvcc_version()):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


def object_path(source: str, arch: str, *, extra_flags: Sequence[str] = (), link: bool = False,
                base_flags: Sequence[str] | None = None) -> Path:
    """Where :func:`compile_object` caches the object (or executable) of ``source``."""
    return _target(source, _flags(arch, extra_flags, base_flags), link)


def _flags(arch: str, extra_flags: Sequence[str], base_flags: Sequence[str] | None) -> list[str]:
    base = nvcc_flags(arch) if base_flags is None else list(base_flags)
    return base + [f"-I{d}" for d in include_dirs()] + list(extra_flags)


def _target(source: str, flags: Sequence[str], link: bool) -> Path:
    suffix = ".bin" if link else ".o"
    return cache_dir() / (source_key(source, list(flags) + [suffix]) + suffix)


def cached_object(source: str, arch: str) -> Path | None:
    """The cached object of ``source`` for ``arch``, or None if it was never compiled."""
    path = object_path(source, arch)
    return path if path.exists() else None


def compile_object(source: str, arch: str, *, extra_flags: Sequence[str] = (), link: bool = False,
                   base_flags: Sequence[str] | None = None) -> Path:
    """Compile ``source`` to an object (``link=True``: an executable) and return the cached path.

    ``base_flags`` replaces :func:`nvcc_flags` (the include directories are always added).

    Raises
    ------
    KernelCompileError
        nvcc failed; the message holds the end of its output.
    """
    flags = _flags(arch, extra_flags, base_flags)
    suffix = ".bin" if link else ".o"
    target = _target(source, flags, link)
    if target.exists():
        _LOG.debug("nvcc cache hit %s", target.name)
        if link and not os.access(target, os.X_OK):
            os.chmod(target, 0o755)
        return target
    with tempfile.TemporaryDirectory(prefix="tvm_ext_cutlass_") as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(source)
        out = Path(tmp) / ("out" + suffix)
        cmd = [nvcc_path(), *flags, *([] if link else ["-c"]), str(src), "-o", str(out)]
        _LOG.info("nvcc %s (%d lines)", arch, source.count("\n"))
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout)[-4000:]
            raise KernelCompileError(f"nvcc failed for {arch}:\n{tail}")
        tmp_target = target.with_suffix(f".{os.getpid()}.tmp")
        shutil.copyfile(out, tmp_target)
        if link:
            os.chmod(tmp_target, 0o755)
        os.replace(tmp_target, target)  # atomic: parallel builds never see half a file
    return target


def compile_many(sources: Sequence[str], arch: str, *, jobs: int | None = None,
                 extra_flags: Sequence[str] = (), link: bool = False) -> list[Path]:
    """Compile several sources in parallel (``jobs`` defaults to the CPU count)."""
    jobs = jobs or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(sources) or 1))) as pool:
        futures = [pool.submit(compile_object, s, arch, extra_flags=extra_flags, link=link) for s in sources]
        return [f.result() for f in futures]


def link_relocatable(objects: Sequence[Path], out: Path) -> Path:
    """Merge objects into one relocatable object (``ld -r``) for ``load_static_library``."""
    ld = shutil.which("ld")
    if ld is None:
        raise CutlassSetupError("the linker 'ld' is missing")
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    proc = subprocess.run([ld, "-r", *map(str, objects), "-o", str(tmp)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise KernelCompileError(f"ld -r failed: {proc.stderr[-2000:]}")
    os.replace(tmp, out)
    return out
