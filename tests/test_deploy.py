"""Deployable libraries: compiled device code at export, loading with the runtime alone, ``tvm-ext run``."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import tvm_ext
from tvm_ext.cli import main
from tvm_ext.models import get_model
from tvm_ext.toolchain.device_code import build_libcuda_stub, device_code_archs, library_device_code
from tvm_ext.toolchain.library_bin import ImportBlob, compile_blob

REPO = Path(__file__).resolve().parent.parent
needs_cuda_tools = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("nm") is None
                                      or shutil.which("cc") is None, reason="needs nvcc, nm and a C compiler")

#: Loads a library as a GPU machine would, with TVM's runtime only; any compile attempt fails loudly.
_LOAD = """
import sys, tvm_ffi
from tvm_ext.deploy.runtime import enable_cuda, import_tvm
tvm = import_tvm()
assert tvm.base._RUNTIME_ONLY
@tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
def _no_compile(*_args):
    raise RuntimeError("LOAD TRIED TO COMPILE CUDA SOURCE")
enable_cuda(tvm)
lib = tvm.runtime.load_module(sys.argv[1])
print("loaded", lib.kind)
"""


@pytest.fixture(scope="module")
def mlp_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("models") / "mlp.onnx"
    onnx.save(get_model("mlp", batch=4, sizes=(32, 64, 16)), str(path))
    return path


@pytest.fixture(scope="module")
def stub_dir(tmp_path_factory) -> Path:
    """A stand-in libcuda.so.1 so TVM's CUDA runtime (the real module loader) loads without a driver."""
    directory = tmp_path_factory.mktemp("stub")
    build_libcuda_stub(directory)
    return directory


def _load_runtime_only(path: Path, stub: Path) -> subprocess.CompletedProcess:
    """Load ``path`` in a clean process: PATH without nvcc, TVM_USE_RUNTIME_LIB=1, no compile callback."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "LD_LIBRARY_PATH": str(stub), "HOME": str(stub),
           "TVM_USE_RUNTIME_LIB": "1", "TVM_DEVICE_BACKEND_AUTOLOAD": "0"}
    assert shutil.which("nvcc", path=env["PATH"]) is None
    return subprocess.run([sys.executable, "-c", _LOAD, str(path)], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_compile_blob_replaces_cuda_source_records():
    source = 'extern "C" __global__ void k() {}\n// tvm_ext: CUDA arch sm_90\n'
    table = struct.pack("<Q", 0)
    record = struct.pack("<Q", 4) + b"cuda" + table + struct.pack("<Q", len(source)) + source.encode()
    blob = ImportBlob([0, 1, 1], [1], [("_lib", None), ("cuda", record)]).to_bytes()
    assert ImportBlob.parse(blob).modules[1] == ("cuda", record)
    out, n = compile_blob(blob, [source], lambda src: b"FATBIN")
    assert n == 1
    assert ImportBlob.parse(out).modules[1] == ("cuda", struct.pack("<Q", 5) + b"cubin" + table
                                                + struct.pack("<Q", 6) + b"FATBIN")
    assert compile_blob(out, [source], lambda src: b"")[1] == 0  # compiled records stay as they are


@needs_cuda_tools
def test_export_holds_sm90_sass_and_ptx_and_loads_without_a_compiler(tmp_path, stub_dir):
    ex = tvm_ext.compile(get_model("mlp", batch=4, sizes=(32, 64, 16)), "tvm_ext/h100", preset="baseline")
    info = tvm_ext.export_library(ex, tmp_path / "mlp.so")
    assert info.device_code == "cubin" == library_device_code(info.path) and info.nvcc_seconds > 0
    assert info.archs == device_code_archs(info.path) == ["sm_90 SASS", "compute_90 PTX"]
    assert b"__global__" not in info.path.read_bytes()
    loaded = _load_runtime_only(info.path, stub_dir)
    assert loaded.returncode == 0 and "loaded relax.VMExecutable" in loaded.stdout, loaded.stderr[-2000:]
    # the probe works: a source library makes the same load try to compile
    source = tvm_ext.export_library(ex, tmp_path / "src.so", embed_source=True)
    assert source.device_code == "cuda" and source.archs == []
    failed = _load_runtime_only(source.path, stub_dir)
    assert failed.returncode != 0 and "LOAD TRIED TO COMPILE" in failed.stderr


def _debug_sections(path: Path) -> list[str]:
    out = subprocess.run(["readelf", "-S", "-W", str(path)], capture_output=True, text=True, check=True).stdout
    return [w for w in out.split() if w.startswith(".debug_")]


@needs_cuda_tools
@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs readelf")
def test_strip_debug_leaves_host_debug_info_out_and_the_library_loads(tmp_path, stub_dir):
    ex = tvm_ext.compile(get_model("mlp", batch=4, sizes=(32, 64, 16)), "tvm_ext/h100", preset="baseline")
    full = tvm_ext.export_library(ex, tmp_path / "full.so")
    small = tvm_ext.export_library(ex, tmp_path / "small.so", strip_debug=True)
    assert _debug_sections(full.path), "TVM's host code carries DWARF: the test no longer shows anything"
    assert _debug_sections(small.path) == [] and small.size_bytes < full.size_bytes
    assert small.archs == full.archs == ["sm_90 SASS", "compute_90 PTX"]
    loaded = _load_runtime_only(small.path, stub_dir)
    assert loaded.returncode == 0 and "loaded relax.VMExecutable" in loaded.stdout, loaded.stderr[-2000:]


@needs_cuda_tools
def test_tvm_compile_pipeline_export_knows_its_arch(tmp_path):
    import tvm

    from tvm_ext.driver import load_module

    mod = load_module(get_model("mlp", batch=4, sizes=(32, 16)))
    ex = tvm.compile(mod, target="tvm_ext/h100", relax_pipeline="tvm_ext")  # no target at export time
    assert tvm_ext.export_library(ex, tmp_path / "m.so").archs == ["sm_90 SASS", "compute_90 PTX"]


@pytest.mark.slow
@needs_cuda_tools
def test_cutlass_build_links_cudart_and_loads_without_a_compiler(tmp_path, stub_dir):
    from tvm.script import ir as I, relax as R

    @I.ir_module
    class Dense:
        @R.function
        def main(x: R.Tensor((256, 128), "float16"), w: R.Tensor((512, 128), "float16")):
            with R.dataflow():
                o = R.exp(R.matmul(x, R.permute_dims(w)))
                R.output(o)
            return o

    ex = tvm_ext.compile(Dense, "tvm_ext/h100", preset="cutlass")
    info = tvm_ext.export_library(ex, tmp_path / "dense.so")
    assert info.cutlass_objects and info.device_code == "cubin"
    assert {"sm_90 SASS", "compute_90 PTX"} <= set(info.archs)
    dynamic = subprocess.run(["readelf", "-d", str(info.path)], capture_output=True, text=True, check=True).stdout
    assert "libcudart.so" in dynamic and "RUNPATH" in dynamic
    ldd = subprocess.run(["ldd", str(info.path)], capture_output=True, text=True, check=True).stdout
    assert "libcudart.so" in ldd and "not found" not in ldd
    loaded = _load_runtime_only(info.path, stub_dir)
    assert loaded.returncode == 0 and "loaded relax.VMExecutable" in loaded.stdout, loaded.stderr[-2000:]


@needs_cuda_tools
def test_compile_prints_size_archs_and_weights(capsys, mlp_file, tmp_path):
    out = tmp_path / "mlp.so"
    assert main(["-q", "compile", str(mlp_file), "--preset", "baseline", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"wrote {out} (" in text and "KiB)" in text
    assert "device code: compiled CUDA device code (sm_90 SASS + compute_90 PTX)" in text
    assert "weights: inside the library" in text
    assert main(["-q", "compile", str(mlp_file), "--preset", "baseline", "-o", str(out), "--embed-source"]) == 0
    assert "CUDA source embedded" in capsys.readouterr().out and library_device_code(out) == "cuda"


def _run_cli(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TVM_USE_RUNTIME_LIB", None)
    return subprocess.run([sys.executable, "-m", "tvm_ext", *argv], env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def test_cpu_library_runs_with_the_runtime_alone_weights_inside_or_outside(mlp_file, tmp_path):
    inside, outside = tmp_path / "in.so", tmp_path / "out.so"
    for lib, extra in ((inside, []), (outside, ["--weights-outside"])):
        built = _run_cli("-q", "compile", str(mlp_file), "--preset", "baseline", "--target", "llvm", "-o",
                         str(lib), *extra)
        assert built.returncode == 0, built.stderr
    assert "weights: outside the library, 2 tensors" in built.stdout and (tmp_path / "out.params.npz").is_file()
    results = []
    for lib in (inside, outside):
        ran = _run_cli("run", str(lib), "--runs", "5", "--warmup", "1", "--save-outputs", str(lib) + ".npz")
        assert ran.returncode == 0, ran.stderr
        assert "inputs (random): x (4, 32) float32" in ran.stdout and "output 0: (4, 16) float32" in ran.stdout
        assert "main: median" in ran.stdout and "over 5 runs" in ran.stdout
        results.append(np.load(str(lib) + ".npz")["output_0"])
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-6)
    # given inputs: checked against the signature
    np.savez(tmp_path / "x.npz", x=np.ones((4, 32), "float32"))
    assert _run_cli("run", str(inside), "--inputs", str(tmp_path / "x.npz"), "--runs", "0").returncode == 0
    np.savez(tmp_path / "bad.npz", x=np.ones((2, 32), "float32"))
    bad = _run_cli("run", str(inside), "--inputs", str(tmp_path / "bad.npz"))
    assert bad.returncode == 2 and "the library takes (4, 32) float32" in bad.stderr and "Traceback" not in bad.stderr
    (tmp_path / "out.params.npz").unlink()
    missing = _run_cli("run", str(outside))
    assert missing.returncode == 2 and "params file not found" in missing.stderr


@needs_cuda_tools
def test_run_without_a_gpu_says_so(mlp_file, tmp_path):
    from tvm_ext.toolchain import gpu_available

    if gpu_available():
        pytest.skip("this machine has a GPU")
    lib = tmp_path / "mlp.so"
    tvm_ext.export_library(tvm_ext.compile(str(mlp_file), "tvm_ext/h100", preset="baseline"), lib)
    ran = _run_cli("run", str(lib))
    assert ran.returncode == 3 and "Traceback" not in ran.stderr
    assert ran.stderr.startswith("error: no GPU to run") and len(ran.stderr.strip().splitlines()) == 1
