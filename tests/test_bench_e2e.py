"""tvm-ext bench end to end without a GPU: build-only bundles (llvm and CUDA) and a runtime-only run."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tvm_ext.bench.bundle import RUNTIME_MODULES, build_bundle
from tvm_ext.bench.weights import regenerate
from tvm_ext.bench.manifest import read_manifest
from tvm_ext.bench.results import REQUIRED, read_jsonl
from tvm_ext.bench.run import run_bundle
from tvm_ext.bench.suite import resolve
from tvm_ext.cli import main

MIB = 1 << 20


@pytest.fixture(scope="module")
def llvm_bundle(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("bundle") / "small"
    code = main(["-q", "bench", "mlp", "conv_block", "--target", "llvm", "--build-only", "--out", str(out)])
    assert code == 0
    return out, ""


def test_build_only_writes_a_complete_bundle(llvm_bundle, capsys):
    out, _ = llvm_bundle
    manifest = read_manifest(out)
    assert [m.name for m in manifest.models] == ["mlp", "conv_block"]
    assert manifest.target_kind == "llvm" and manifest.runtime is None
    # Kernels: mlp = 2 fused (matmul + bias + relu, matmul + bias); conv_block = conv + folded BN bias
    # + relu, max pool, global average pool, Gemm + bias (Flatten is a reshape the VM does in place).
    # Weights: the float initializers of >= 1024 elements (make_skeleton's default); the biases,
    # the BN statistics and the 10x16 fc weight stay in the model.
    expect = {"mlp": (2, [("fc0.weight", (128, 64)), ("fc1.weight", (64, 128))]),
              "conv_block": (4, [("conv1.weight", (16, 3, 7, 7))])}
    for m in manifest.models:
        assert m.status == "ok" and len(m.builds) == 1
        b = m.builds[0]
        assert b.system == "baseline" and b.status == "ok" and b.device_code == "host"
        kernels, weights = expect[m.name]
        assert b.kernels == kernels and [(w.name, tuple(w.shape)) for w in m.weights] == weights
        assert (out / b.library).is_file() and b.library_bytes == (out / b.library).stat().st_size
        assert m.transform_params and m.weights_digest and len(m.check_digests) == 2
        assert (out / m.reference).is_file()
        # weights travel as a recipe: no weight's bytes are inside the library
        assert all(w.std > 0 for w in m.weights)
        library = (out / b.library).read_bytes()
        for w, values in zip(m.weights, regenerate(m.weights, m.weights_seed)):
            assert values.tobytes()[:256] not in library, w.name
    mlp = manifest.model("mlp")
    assert [i.name for i in mlp.inputs] == ["x"] and mlp.inputs[0].kind == "normal"
    # mlp: x [8, 64] -> 128 -> 64. flops: two GEMMs 2 * 8 * 64 * 128 each, bias adds 8 * (128 + 64),
    # relu 8 * 128; least traffic: x, both weights, both biases read once, y written once (fp32)
    assert mlp.flops == 2 * (2 * 8 * 64 * 128) + 8 * (128 + 64) + 8 * 128
    assert mlp.min_traffic_bytes == (8 * 64 + 2 * 64 * 128 + 128 + 64 + 8 * 64) * 4
    shipped = sorted(p.stem for p in (out / "python" / "tvm_ext" / "bench").glob("*.py"))
    assert shipped == sorted(RUNTIME_MODULES)
    assert os.access(out / "run.sh", os.X_OK)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    assert size < 40 * MIB


def test_build_only_prints_kernels_per_model(tmp_path, capsys):
    code = main(["-q", "bench", "mlp", "--target", "llvm", "--build-only", "--out", str(tmp_path / "b")])
    out = capsys.readouterr().out
    assert code == 0
    row = next(line.split() for line in out.splitlines() if line.startswith("mlp "))
    assert row[:4] == ["mlp", "baseline", "ok", "2"]
    assert "bundle " in out and "MiB" in out


def _run_runtime_only(bundle: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(bundle / "python"), TVM_USE_RUNTIME_LIB="1",
               TVM_DEVICE_BACKEND_AUTOLOAD="0")
    return subprocess.run([sys.executable, "-m", "tvm_ext.bench.run", str(bundle), "--runs", "5", "--warmup", "1",
                           "--input-sets", "2", *extra], env=env, capture_output=True, text=True, cwd=bundle,
                          check=False, timeout=120)


def test_runtime_only_run_writes_valid_results(llvm_bundle, tmp_path):
    out, _ = llvm_bundle
    results = tmp_path / "results.jsonl"
    proc = _run_runtime_only(out, "--out", str(results))
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = read_jsonl(results)
    manifest = read_manifest(out)
    assert [(r["model"], r["system"]) for r in records] == [("mlp", "baseline"), ("conv_block", "baseline")]
    for r in records:
        assert set(REQUIRED) <= set(r) and r["error"] is None
        assert r["tvm_runtime_only"] is True  # measured without TVM's compiler library
        assert r["numerics_ok"] is True and r["max_rel_err"] < 1e-5 and r["nonfinite"] == 0
        assert 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"] and r["runs"] == 5
        assert r["repeat_median_ms"] > 0 and r["noise_pct"] >= 0  # timed twice
        assert r["kernels"] == manifest.model(r["model"]).builds[0].kernels
        assert r["commit"] == manifest.commit and r["device"] and r["driver"] and r["date"]
        assert r["input_sets"] == 2 and r["timer"] == "host-sync"
    table = results.with_suffix(".md").read_text()
    assert "| mlp | baseline |" in table and "| conv_block | baseline |" in table
    assert "| mlp | baseline |" in proc.stdout


def test_wrong_reference_fails_the_numerics(llvm_bundle, tmp_path):
    out, _ = llvm_bundle
    copy = tmp_path / "bundle"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("results"))
    ref = copy / "ref" / "mlp.npz"
    with np.load(ref) as npz:
        arrays = {k: npz[k] * 1.5 for k in npz.files}
    np.savez(ref, **arrays)
    records, path = run_bundle(copy, models=["mlp"], runs=2, warmup=0, input_sets=1, repeat=False,
                               out=tmp_path / "r.jsonl")
    assert len(records) == 1 and records[0]["numerics_ok"] is False
    assert records[0]["max_rel_err"] == pytest.approx(1 / 3, rel=1e-3)
    assert read_jsonl(path)[0]["numerics_ok"] is False


def test_changed_weights_recipe_is_caught(llvm_bundle, tmp_path):
    out, _ = llvm_bundle
    copy = tmp_path / "bundle"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("results"))
    data = json.loads((copy / "manifest.json").read_text())
    data["models"][0]["weights_seed"] += 1  # the GPU machine would draw other weights
    (copy / "manifest.json").write_text(json.dumps(data))
    records, _ = run_bundle(copy, models=["mlp"], runs=1, warmup=0, input_sets=1, repeat=False,
                            out=tmp_path / "r.jsonl")
    assert "regenerated weights differ" in records[0]["error"] and records[0]["median_ms"] is None


@pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("nm") is None or shutil.which("cc") is None,
                    reason="needs nvcc, nm and a C compiler")
def test_cuda_build_embeds_compiled_device_code(tmp_path):
    summary = build_bundle(resolve(["mlp"]), tmp_path / "cuda", target="tvm_ext/h100", fp16=True, runtime=False)
    build = summary.manifest.model("mlp").builds[0]
    assert build.status == "ok", build.error
    assert build.device_code in ("cubin", "fatbin") and build.kernels == 2 and build.stage_s["nvcc"] > 0
    data = (tmp_path / "cuda" / build.library).read_bytes()
    assert b"__global__" not in data and b"\x50\xed\x55\xba" in data  # fatbin magic, no CUDA source
    assert summary.manifest.model("mlp").dtype == "float16" and summary.manifest.arch == "sm_90"


@pytest.mark.parametrize("argv, needle", [
    (["bench", "mlp", "--build-only"], "--build-only needs --out"),
    (["bench", "nope", "--build-only", "--out", "x"], "unknown model 'nope'"),
    (["bench", "--build-only", "--out", "x"], "name models or a --suite"),
    (["bench", "mlp", "--presets", "warp", "--target", "llvm", "--build-only", "--out", "{tmp}"], "unknown preset"),
])
def test_bench_usage_errors(argv, needle, tmp_path, capsys):
    code = main(["-q", *[a.replace("{tmp}", str(tmp_path / "o")) for a in argv]])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err


def test_bench_without_build_only_measures_here(tmp_path, capsys):
    results = tmp_path / "results"
    code = main(["-q", "bench", "mlp", "--target", "llvm", "--out", str(tmp_path / "b"), "--runs", "3",
                 "--warmup", "1", "--input-sets", "2", "--torch", "off", "--results", str(results)])
    assert code == 0, capsys.readouterr().err[-2000:]
    files = sorted(results.glob("*.jsonl"))
    assert len(files) == 1 and files[0].with_suffix(".md").is_file()
    (record,) = read_jsonl(files[0])
    assert record["model"] == "mlp" and record["numerics_ok"] is True and record["runs"] == 3


def _torch_python() -> str | None:
    """A Python with torch: ``$TVM_EXT_TORCH_PYTHON`` (e.g. the corpus venv of scripts/corpus)."""
    path = os.environ.get("TVM_EXT_TORCH_PYTHON")
    return path if path and Path(path).is_file() else None


@pytest.mark.skipif(_torch_python() is None, reason="no Python with torch (set TVM_EXT_TORCH_PYTHON)")
def test_torch_baseline_runs_from_the_bundle_without_tvm(tmp_path):
    if not (Path(__file__).parents[1] / "tvm_ext/models/skeletons/mmoe_b1_fp32.onnx").is_file():
        pytest.skip("mmoe skeleton not committed")
    out = tmp_path / "b"
    build_bundle(resolve(["mmoe_b1"]), out, target="llvm")
    script = (
        "import sys, json; sys.path.insert(0, sys.argv[1] + '/python')\n"
        "from tvm_ext.bench.manifest import read_manifest\n"
        "from tvm_ext.bench.model_data import load_model_data\n"
        "from tvm_ext.bench.torch_runner import measure_torch\n"
        "e = read_manifest(sys.argv[1]).model('mmoe_b1')\n"
        "data = load_model_data(sys.argv[1], e, 2)\n"
        "(m,) = measure_torch(e, data, sys.argv[1] + '/corpus', ['torch-eager'], warmup=1, runs=3, device='cpu')\n"
        "print(json.dumps({'error': m.error, 'numerics': m.numerics, 'n': len(m.samples_ms),\n"
        "                  'r': len(m.repeat_samples_ms), 'tvm': 'tvm' in sys.modules}))\n")
    proc = subprocess.run([_torch_python(), "-c", script, str(out)], capture_output=True, text=True, check=False,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["error"] is None and result["numerics"]["numerics_ok"] is True
    assert result["n"] == 3 and result["r"] == 3 and result["tvm"] is False  # torch side never imports TVM
