"""Export a compiled model; CUDA object code inside (CUTLASS kernels) needs the CUDA runtime linked in."""
from __future__ import annotations

import os
from typing import Any

import tvm

from .cuda import cuda_root


def link_options() -> list[str]:
    """Linker options for a ``.so`` with CUDA objects in it: ``libcudart`` (with an rpath).

    Raises
    ------
    KernelCompileError
        No CUDA toolkit is found.
    """
    lib = cuda_root() / "lib64"
    return ["-Wl,--no-as-needed", f"-L{lib}", "-lcudart", f"-Wl,-rpath,{lib}"]


def has_cutlass_objects(ex: tvm.runtime.Executable | tvm.runtime.Module) -> bool:
    """Whether a compiled module imports a ``static_library`` (our CUTLASS code)."""
    mod = ex.mod if hasattr(ex, "mod") else ex
    stack, seen = [mod], set()
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        if m.kind == "static_library":
            return True
        stack.extend(m.imports)
    return False


def export_library(ex: tvm.runtime.Executable | tvm.runtime.Module, path: str | os.PathLike[str], **kwargs: Any) -> None:
    """``ex.export_library(path)`` plus the CUDA runtime link options when CUTLASS code is inside.

    Without them the exported library fails to load (``undefined symbol: __cudaRegisterFatBinary``).

    Raises
    ------
    KernelCompileError
        CUTLASS code is inside and no CUDA toolkit is found.
    """
    if has_cutlass_objects(ex):
        kwargs["options"] = list(kwargs.get("options") or []) + link_options()
    ex.export_library(str(path), **kwargs)
