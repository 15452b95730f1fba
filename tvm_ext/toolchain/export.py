"""Export a compiled model as a deployable library: compiled device code, CUDA runtime linked when needed.

:func:`export_library` is the one export of the package (``tvm_ext.export_library``, ``tvm-ext
compile``, the benchmark bundles):

* CUDA device code is compiled *here*: on a host without the NVIDIA driver TVM keeps CUDA
  source in the executable; the export packs nvcc's fatbin for the target's arch (SASS plus
  PTX for newer GPUs) in its place (:mod:`.library_bin`), so the GPU machine needs the driver
  and the TVM runtime only, and loading costs no compile. ``embed_source=True`` keeps the
  source instead (TVM's own behaviour: the GPU machine compiles it at every load);
* CUTLASS objects inside need ``libcudart``: the link options are added;
* ``strip_debug=True`` links without the host code's DWARF sections (a third of a typical
  library; the benchmark bundles, which must fit the 64 MiB that travel to a GPU machine).

The arch comes from the ``target`` argument, else from the source itself: importing tvm_ext
installs TVM's ``tvm_callback_cuda_postproc`` hook (:func:`register_arch_marker`), which ends
every CUDA source TVM generates with a ``// tvm_ext: CUDA arch sm_90`` line (whatever built
it: ``tvm_ext.compile``, ``tvm.compile`` with our pipelines or TVM's), else ``Target.current()``.
"""
from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tvm

from ..errors import KernelCompileError
from .cuda import cuda_root

log = logging.getLogger(__name__)

#: Last line of the CUDA source TVM generates while tvm_ext is imported (see the module docstring).
ARCH_MARKER = "// tvm_ext: CUDA arch "
_ARCH_LINE = re.compile(r"^// tvm_ext: CUDA arch (\S+)$", re.MULTILINE)
_MARKER: list[Any] = []  # the installed hook, once


@dataclass
class ExportedLibrary:
    """What :func:`export_library` wrote.

    Attributes
    ----------
    path : Path
        The library.
    size_bytes : int
        Its size.
    device_code : str or None
        Format of its CUDA device code (``fatbin``, ``cubin``, ``ptx``; ``cuda`` for source),
        None without a CUDA module.
    archs : list of str
        What the device code runs on, e.g. ``["sm_90 SASS", "compute_90 PTX"]`` (empty for source).
    cutlass_objects : bool
        CUTLASS object code is linked in (with ``libcudart``).
    nvcc_seconds : float
        Time nvcc took for the device code.
    """

    path: Path
    size_bytes: int
    device_code: str | None
    archs: list[str] = field(default_factory=list)
    cutlass_objects: bool = False
    nvcc_seconds: float = 0.0

    def describe_device_code(self) -> str:
        """One phrase: ``compiled CUDA device code (sm_90 SASS + compute_90 PTX)`` or the like."""
        from .device_code import BINARY_FORMATS  # noqa: PLC0415

        if self.device_code is None:
            return "no CUDA device code"
        if self.device_code not in BINARY_FORMATS:
            return "CUDA source embedded (compiled by the GPU machine each time it loads the file)"
        return f"compiled CUDA device code ({' + '.join(self.archs) or self.device_code})"


def link_options() -> list[str]:
    """Linker options for a ``.so`` with CUDA objects in it: ``libcudart`` (with an rpath).

    Raises
    ------
    KernelCompileError
        No CUDA toolkit is found.
    """
    lib = cuda_root() / "lib64"
    return ["-Wl,--no-as-needed", f"-L{lib}", "-lcudart", f"-Wl,-rpath,{lib}"]


def _modules(ex: tvm.runtime.Executable | tvm.runtime.Module) -> Iterator[Any]:
    """Every module of the import tree, once (by object handle: ``m.imports`` makes new Python wrappers,
    and the id of a dropped wrapper is reused)."""
    mod = ex.mod if hasattr(ex, "mod") else ex
    stack, seen = [mod], set()
    while stack:
        m = stack.pop()
        key = m.__chandle__() if hasattr(m, "__chandle__") else id(m)
        if key in seen:
            continue
        seen.add(key)
        yield m
        stack.extend(m.imports)


def has_cutlass_objects(ex: tvm.runtime.Executable | tvm.runtime.Module) -> bool:
    """Whether a compiled module imports a ``static_library`` (our CUTLASS code)."""
    return any(m.kind == "static_library" for m in _modules(ex))


def register_arch_marker() -> None:
    """Install the ``tvm_callback_cuda_postproc`` hook that ends CUDA source with its arch (idempotent;
    a hook registered before is called first)."""
    import tvm_ffi  # noqa: PLC0415

    if _MARKER:
        return
    previous = tvm.get_global_func("tvm_callback_cuda_postproc", allow_missing=True)

    def mark(code: str, target: tvm.target.Target) -> str:
        code = str(previous(code, target)) if previous is not None else code
        arch = target.attrs.get("arch")
        return code if arch is None or _ARCH_LINE.search(code) else f"{code}\n{ARCH_MARKER}{arch}\n"

    tvm_ffi.register_global_func("tvm_callback_cuda_postproc", mark, override=True)
    _MARKER.append(mark)


def _arch_for(source: str, target: str | tvm.target.Target | None) -> str:
    if target is not None:
        from ..hardware import resolve_target  # noqa: PLC0415

        tgt = resolve_target(target)
        if tgt.kind.name != "cuda" or tgt.attrs.get("arch") is None:
            raise KernelCompileError(f"target {tgt} is not a CUDA target with an arch")
        return str(tgt.attrs["arch"])
    match = _ARCH_LINE.search(source)
    if match:
        return match.group(1)
    current = tvm.target.Target.current(allow_none=True)
    if current is not None and current.kind.name == "cuda" and current.attrs.get("arch") is not None:
        return str(current.attrs["arch"])
    raise KernelCompileError(
        "the executable holds CUDA source and the export does not know which GPU to compile it for: "
        "pass target=... (e.g. target='tvm_ext/h100'), export inside `with target:`, or embed_source=True")


def _compiling_packer(target: str | tvm.target.Target | None, sources: list[str], seconds: list[float]):
    from .kernel_check import compile_cuda_source  # noqa: PLC0415
    from .library_bin import compile_blob, write_assembly  # noqa: PLC0415

    archs = {source: _arch_for(source, target) for source in sources}  # fail before TVM's export starts

    def compile_source(source: str) -> bytes:
        result = compile_cuda_source(source, tvm.target.Target({"kind": "cuda", "arch": archs[source]}))
        seconds.append(result.seconds)
        return result.binary

    def pack(mod: Any, is_system_lib: bool, prefix: str, workspace_dir: str) -> str:
        if is_system_lib:
            raise KernelCompileError("compiled device code is packed for shared libraries, not system libs; "
                                     "use embed_source=True")
        raw = tvm.get_global_func("runtime.ModulePackImportsToTensor")(mod).numpy().tobytes()
        blob, compiled = compile_blob(raw, sources, compile_source)
        log.info("compiled %d CUDA module(s) for %s with nvcc in %.1f s", compiled, ", ".join(sorted(set(
            archs.values()))), sum(seconds))
        return str(write_assembly(blob, workspace_dir, prefix))

    return pack


def export_library(ex: tvm.runtime.Executable | tvm.runtime.Module, path: str | os.PathLike[str], *,
                   target: str | tvm.target.Target | None = None, embed_source: bool = False,
                   strip_debug: bool = False, **kwargs: Any) -> ExportedLibrary:
    """Export ``ex`` as a shared library with compiled device code (see the module docstring).

    Parameters
    ----------
    ex : Executable or Module
        The compiled model (``tvm_ext.compile``, ``tvm.compile``).
    path : path-like
        The ``.so`` to write.
    target : str or Target, optional
        CUDA target whose arch the device code is compiled for (default: the arch the source was
        generated for, see the module docstring).
    embed_source : bool
        Keep CUDA source in the library instead of compiled device code.
    strip_debug : bool
        Leave the host code's debug information out of the library (``-Wl,--strip-debug``).
    **kwargs
        Passed to TVM's ``export_library`` (``options``, ``workspace_dir``, ...).

    Raises
    ------
    KernelCompileError
        No CUDA toolkit (nvcc; ``libcudart`` for CUTLASS objects), nvcc fails, or the arch is unknown.
    """
    from .device_code import device_code_archs, library_device_code  # noqa: PLC0415

    mod = ex.mod if hasattr(ex, "mod") else ex
    cutlass = has_cutlass_objects(ex)
    if cutlass:
        kwargs["options"] = list(kwargs.get("options") or []) + link_options()
    if strip_debug:
        kwargs["options"] = list(kwargs.get("options") or []) + ["-Wl,--strip-debug"]
    sources = [m.inspect_source("cuda") for m in _modules(ex) if m.kind == "cuda"]
    seconds: list[float] = []
    if sources and not embed_source:
        kwargs["fpack_imports"] = _compiling_packer(target, sources, seconds)
    start = time.perf_counter()
    mod.export_library(str(path), **kwargs)
    log.info("exported %s in %.1f s", path, time.perf_counter() - start)
    out = Path(path)
    fmt = library_device_code(out)
    return ExportedLibrary(path=out, size_bytes=out.stat().st_size, device_code=fmt,
                           archs=device_code_archs(out) if fmt is not None else [], cutlass_objects=cutlass,
                           nvcc_seconds=sum(seconds))


__all__ = ["ARCH_MARKER", "ExportedLibrary", "link_options", "has_cutlass_objects", "register_arch_marker",
           "export_library"]
