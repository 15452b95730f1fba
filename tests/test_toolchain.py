"""tvm_ext.toolchain: the toolkit finder, -gencode flags, link options, device-code helpers."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from tvm_ext.errors import KernelCompileError
from tvm_ext.toolchain import cuda, export, find_cuda_root, gencode_flags, link_options, use_toolkit
from tvm_ext.toolchain.device_code import (
    build_libcuda_stub, check_device_code, cuda_runtime_library, driver_symbols, library_device_code)


# ------------------------------------------------------------------------------------------- finder
def _fake_root(path: Path) -> Path:
    """A directory that looks like a toolkit root: bin/nvcc and include/cuda_runtime.h."""
    (path / "bin").mkdir(parents=True)
    (path / "include").mkdir()
    nvcc = path / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\nexit 1\n")
    nvcc.chmod(0o755)
    (path / "include" / "cuda_runtime.h").write_text("")
    return path


@pytest.fixture
def no_cuda_env(monkeypatch):
    for var in ("CUDA_PATH", "CUDA_HOME"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_environment_variables_come_first_in_order(tmp_path, no_cuda_env):
    a, b = _fake_root(tmp_path / "a"), _fake_root(tmp_path / "b")
    no_cuda_env.setenv("CUDA_HOME", str(b))
    assert find_cuda_root() == b
    no_cuda_env.setenv("CUDA_PATH", str(a))
    assert find_cuda_root() == a
    no_cuda_env.setenv("CUDA_PATH", str(tmp_path / "not_a_toolkit"))  # skipped, not trusted blindly
    assert find_cuda_root() == b


def test_no_toolkit_means_none_not_a_default_path(tmp_path, no_cuda_env):
    no_cuda_env.setenv("PATH", str(tmp_path))  # no nvcc anywhere
    assert find_cuda_root() is None and not cuda.nvcc_available()
    with pytest.raises(KernelCompileError, match="CUDA toolkit not found"):
        cuda.nvcc_path()


def test_a_wrapper_script_resolves_to_the_toolkit_it_runs(tmp_path, no_cuda_env):
    real = _fake_root(tmp_path / "cuda-x")
    (real / "bin" / "nvcc").write_text(f"#!/bin/sh\necho '#$ TOP={real}/bin/..' >&2\n")
    wrappers = tmp_path / "wrappers"
    wrappers.mkdir()
    (wrappers / "nvcc").write_text(f"#!/bin/sh\nexec {real}/bin/nvcc \"$@\"\n")
    (wrappers / "nvcc").chmod(0o755)
    no_cuda_env.setenv("PATH", f"{wrappers}{os.pathsep}{os.environ['PATH']}")
    assert find_cuda_root() == real
    assert cuda.nvcc_path() == str(real / "bin" / "nvcc")


def test_use_toolkit_points_path_and_cuda_path_at_the_root(tmp_path, no_cuda_env):
    root = _fake_root(tmp_path / "tk")
    before = os.environ["PATH"]
    with use_toolkit(root):
        assert os.environ["CUDA_PATH"] == str(root)
        assert shutil.which("nvcc") == str(root / "bin" / "nvcc")
    assert "CUDA_PATH" not in os.environ and os.environ["PATH"] == before


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_installed_toolkit_is_found():
    root = find_cuda_root()
    assert root is not None and (root / "lib64").is_dir()
    assert cuda.nvcc_version() != "unknown"
    assert link_options()[1:3] == [f"-L{root / 'lib64'}", "-lcudart"]


# ------------------------------------------------------------------------------------------ gencode
def test_gencode_sass_for_every_arch_and_ptx_for_the_newest():
    assert gencode_flags("sm_90a") == ["-gencode", "arch=compute_90a,code=[sm_90a,compute_90a]"]
    assert gencode_flags(["sm_90", "sm_80", "sm_80"]) == [
        "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=[sm_90,compute_90]"]
    assert gencode_flags(["sm_100f", "sm_90a"])[-1] == "arch=compute_100f,code=[sm_100f,compute_100f]"
    for bad in ("compute_90", "sm90", "sm_90x", []):
        with pytest.raises(KernelCompileError):
            gencode_flags(bad)


def test_cutlass_objects_use_the_same_flags():
    from tvm_ext.cutlass.nvcc import nvcc_flags

    flags = nvcc_flags("sm_80")
    assert flags[-2:] == gencode_flags("sm_80")


# ------------------------------------------------------------------------------------------- export
class _Mod:
    def __init__(self, kind: str, imports=()):
        self.kind, self.imports = kind, list(imports)


def test_has_cutlass_objects_walks_the_imports():
    assert export.has_cutlass_objects(_Mod("vm", [_Mod("llvm", [_Mod("cuda"), _Mod("static_library")])]))
    assert not export.has_cutlass_objects(_Mod("vm", [_Mod("llvm", [_Mod("cuda")])]))


# -------------------------------------------------------------------------------------- device code
def _cuda_blob(fmt: bytes, payload: bytes) -> bytes:
    body = struct.pack("<Q", len(fmt)) + fmt + payload
    return b"junk" + struct.pack("<Q", 4) + b"cuda" + struct.pack("<Q", len(body)) + body + b"tail"


def test_library_device_code_reads_the_format(tmp_path):
    binary, source = tmp_path / "bin.so", tmp_path / "src.so"
    binary.write_bytes(_cuda_blob(b"cubin", b"\x50\xed\x55\xba" + b"\0" * 32))
    source.write_bytes(_cuda_blob(b"cuda", b'extern "C" __global__ void k() {}'))
    assert library_device_code(binary) == "cubin" and check_device_code(binary) == "cubin"
    assert library_device_code(source) == "cuda"
    with pytest.raises(KernelCompileError, match="source"):
        check_device_code(source)
    (tmp_path / "none.so").write_bytes(b"\0" * 64)
    with pytest.raises(KernelCompileError, match="no CUDA module"):
        check_device_code(tmp_path / "none.so")


@pytest.mark.skipif(shutil.which("nm") is None or shutil.which("cc") is None, reason="needs nm and a C compiler")
def test_libcuda_stub_exports_every_driver_symbol(tmp_path):
    wanted = driver_symbols(cuda_runtime_library())
    assert "cuModuleLoadData" in wanted and "cuLaunchKernelEx" in wanted
    stub = build_libcuda_stub(tmp_path)
    out = subprocess.run(["nm", "-D", "--defined-only", str(stub)], capture_output=True, text=True, check=True)
    defined = {line.split()[-1] for line in out.stdout.splitlines() if line.split()}
    assert set(wanted) <= defined
    soname = subprocess.run(["objdump", "-p", str(stub)], capture_output=True, text=True, check=False).stdout
    assert "libcuda.so.1" in soname or not soname


def test_a_broken_cuda_runtime_is_an_error_not_no_gpu(monkeypatch):
    """No driver: no GPU. A driver whose TVM runtime fails: an error, so GPU tests fail instead of skipping."""
    import tvm

    from tvm_ext.errors import GpuRuntimeError
    from tvm_ext.toolchain import cuda

    monkeypatch.setattr(cuda, "driver_present", lambda: False)
    assert cuda.gpu_available() is False

    def broken(_index):
        raise RuntimeError("CUDA: initialization error")

    monkeypatch.setattr(cuda, "driver_present", lambda: True)
    monkeypatch.setattr(tvm, "cuda", broken)
    with pytest.raises(GpuRuntimeError, match="initialization error"):
        cuda.gpu_available()
