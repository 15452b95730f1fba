"""CUDA on this machine: the toolkit (one finder for the package), its nvcc, and whether a GPU is present.

The toolkit root is the first of these that holds ``bin/nvcc`` and ``include/cuda_runtime.h``:

1. ``$CUDA_PATH``, then ``$CUDA_HOME``;
2. the ``TOP`` that ``nvcc -v --dryrun`` reports for the ``nvcc`` on PATH: nvcc computes it
   from its own location, so it is right even when ``nvcc`` on PATH is a wrapper script that
   execs the real one (TVM's own lookup, ``CUDA_PATH`` else ``which nvcc``, is wrong then);
3. two levels above the real path of the ``nvcc`` on PATH.

There is no default location: with none of these the toolkit counts as missing.

TVM's ``tvm.support.nvcc`` runs whatever ``nvcc`` is on PATH and reads ``CUDA_PATH``;
:func:`toolkit_env` / :func:`use_toolkit` point both at the root found here.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

from ..errors import TVM_ERRORS, GpuRuntimeError, KernelCompileError

_LOG = logging.getLogger(__name__)

#: Environment variables naming the toolkit root, in the order they are read.
ROOT_ENV_VARS = ("CUDA_PATH", "CUDA_HOME")


def _is_root(path: Path) -> bool:
    return (path / "bin" / "nvcc").is_file() and (path / "include" / "cuda_runtime.h").is_file()


@functools.lru_cache(maxsize=None)
def _dryrun_top(nvcc: str) -> Path | None:
    """The ``TOP`` directory ``nvcc -v --dryrun`` prints (cached per nvcc path)."""
    try:
        proc = subprocess.run([nvcc, "-v", "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                              capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        _LOG.debug("nvcc -v --dryrun failed: %s", err)
        return None
    for line in (proc.stderr + proc.stdout).splitlines():
        if line.startswith("#$ TOP="):
            return Path(os.path.realpath(line.split("=", 1)[1].strip()))
    return None


def find_cuda_root() -> Path | None:
    """The CUDA toolkit root (see the module docstring), or None when there is none."""
    for var in ROOT_ENV_VARS:
        value = os.environ.get(var)
        if value:
            if _is_root(Path(value)):
                return Path(value)
            _LOG.debug("$%s=%s is not a CUDA toolkit root (no bin/nvcc or include/cuda_runtime.h)", var, value)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    top = _dryrun_top(nvcc)
    if top is not None and _is_root(top):
        return top
    real = Path(os.path.realpath(nvcc)).parent.parent
    return real if _is_root(real) else None


def cuda_root() -> Path:
    """The CUDA toolkit root.

    Raises
    ------
    KernelCompileError
        No toolkit is found.
    """
    root = find_cuda_root()
    if root is None:
        raise KernelCompileError("CUDA toolkit not found: put nvcc on PATH or set CUDA_PATH to the toolkit root")
    return root


def nvcc_available() -> bool:
    """Whether a CUDA toolkit (with its nvcc) is found."""
    return find_cuda_root() is not None


def nvcc_path() -> str:
    """The toolkit's ``bin/nvcc`` (raises :class:`KernelCompileError` without a toolkit)."""
    return str(cuda_root() / "bin" / "nvcc")


@functools.lru_cache(maxsize=None)
def _version_of(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "unknown"


def nvcc_version() -> str:
    """The last line of ``nvcc --version`` (``Build cuda_13.0...``), or ``"unknown"``."""
    return _version_of(nvcc_path())


def driver_present() -> bool:
    """Whether the NVIDIA driver library (``libcuda.so.1``) loads in this process."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def gpu_available() -> bool:
    """Whether a CUDA GPU can run kernels in this process.

    False when there is no driver, or the driver sees no device. A machine whose driver loads but
    whose TVM CUDA runtime fails is broken, not GPU-less: that raises.

    Raises
    ------
    GpuRuntimeError
        The driver is present but TVM's CUDA runtime cannot query the device.
    """
    if not driver_present():
        return False
    import tvm  # noqa: PLC0415 - the toolkit helpers above work without TVM

    try:
        return bool(tvm.cuda(0).exist)
    except TVM_ERRORS as err:
        raise GpuRuntimeError(f"the NVIDIA driver is installed but TVM's CUDA runtime fails: "
                              f"{str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__}") \
            from None


def toolkit_env(env: Mapping[str, str], root: Path) -> dict[str, str]:
    """A copy of ``env`` in which ``CUDA_PATH`` and the first ``nvcc`` on PATH are those of toolkit ``root``."""
    out = dict(env)
    out["CUDA_PATH"] = str(root)
    out["PATH"] = os.pathsep.join(filter(None, [str(root / "bin"), env.get("PATH")]))
    return out


@contextlib.contextmanager
def use_toolkit(root: Path) -> Iterator[None]:
    """Within the block, ``os.environ`` points TVM's nvcc helpers at toolkit ``root``."""
    saved = {var: os.environ.get(var) for var in ("CUDA_PATH", "PATH")}
    os.environ.update(toolkit_env(os.environ, root))
    try:
        yield
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
