"""TVM with the runtime library only, on the machine that runs a library (``tvm-ext run``, bench bundles).

``TVM_USE_RUNTIME_LIB=1`` makes ``import tvm`` load ``libtvm_runtime`` and skip the
compiler; in that mode TVM does not load its CUDA runtime by itself, so
:func:`enable_cuda` loads ``libtvm_runtime_cuda`` from TVM's library directory (it needs
the NVIDIA driver's ``libcuda.so.1`` and ``libcudart.so.13``, which a packed runtime
carries next to it). Then ``tvm.runtime.load_module`` reads exported libraries whose
device code was compiled on the build host, and ``tvm.runtime.vm.VirtualMachine`` runs
them: no compiler, nvcc or NVRTC is needed here.
"""
from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from . import DeployError, NoDeviceError

_CUDA_LOADER = "ffi.Module.load_from_bytes.cuda"


def import_tvm(runtime_only: bool = True) -> ModuleType:
    """Import tvm, with only its runtime library unless tvm was already imported.

    Before the first import, sets ``TVM_USE_RUNTIME_LIB=1`` (when ``runtime_only``) and
    ``TVM_DEVICE_BACKEND_AUTOLOAD=0`` unless the caller set them; an already imported tvm
    (full or not) is used as it is and the environment is left alone.
    """
    if "tvm" not in sys.modules:
        if runtime_only:
            os.environ.setdefault("TVM_USE_RUNTIME_LIB", "1")
        os.environ.setdefault("TVM_DEVICE_BACKEND_AUTOLOAD", "0")
    import tvm  # noqa: PLC0415 - after the environment is set
    import tvm.runtime.vm  # noqa: PLC0415,F401 - not imported by `import tvm` alone

    return tvm


def runtime_only(tvm: ModuleType) -> bool:
    """Whether this process runs TVM without its compiler library."""
    return bool(getattr(tvm.base, "_RUNTIME_ONLY", False))


def enable_cuda(tvm: ModuleType) -> None:
    """Make sure TVM's CUDA runtime is loaded (module loader for CUDA device code).

    Raises
    ------
    NoDeviceError
        ``libtvm_runtime_cuda.so`` is missing or cannot be loaded (no NVIDIA driver).
    """
    if tvm.get_global_func(_CUDA_LOADER, allow_missing=True) is not None:
        return
    candidates = [Path(d) / "libtvm_runtime_cuda.so" for d in tvm.libinfo.package_lib_paths()]
    found = [p for p in candidates if p.is_file()]
    if not found:
        raise NoDeviceError("TVM's CUDA runtime (libtvm_runtime_cuda.so) is not installed; looked in "
                         + ", ".join(str(p.parent) for p in candidates))
    try:
        ctypes.CDLL(str(found[0]))
    except OSError as err:
        raise NoDeviceError(f"cannot load {found[0]}: {err} (is the NVIDIA driver installed?)") from None
    if tvm.get_global_func(_CUDA_LOADER, allow_missing=True) is None:
        raise DeployError(f"{found[0]} loaded but registered no CUDA module loader")


def device_for(tvm: ModuleType, target_kind: str) -> Any:
    """The TVM device a library built for ``target_kind`` runs on (``cuda`` -> GPU 0, ``llvm`` -> CPU).

    Raises
    ------
    NoDeviceError
        No GPU here for a CUDA library.
    DeployError
        Another target kind.
    """
    if target_kind == "cuda":
        enable_cuda(tvm)
        dev = tvm.cuda(0)
        if not dev.exist:
            raise NoDeviceError("no CUDA GPU is visible (tvm.cuda(0) does not exist)")
        return dev
    if target_kind in ("llvm", "c"):
        return tvm.cpu(0)
    raise DeployError(f"cannot run a bundle built for target kind '{target_kind}'")


def _cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _nvidia_smi_driver() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out else None


def device_info(dev: Any, target_kind: str, cuda_driver: str | None = None) -> dict[str, str]:
    """``device`` (as the driver names it) and ``driver`` (version) of ``dev``."""
    if target_kind != "cuda":
        return {"device": _cpu_name(), "driver": f"{platform.system()} {platform.release()}"}
    driver = _nvidia_smi_driver() or (f"CUDA driver API {cuda_driver}" if cuda_driver else "unknown")
    return {"device": str(dev.device_name), "driver": driver, "compute_capability": str(dev.compute_version)}


__all__ = ["import_tvm", "runtime_only", "enable_cuda", "device_for", "device_info"]
