"""The prepared GPU run without a GPU: prepare, dry-run execute, crash isolation, deadlines, ingest, README table."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tvm_ext.bench.gpu_ingest import ingest, sanitizer_findings
from tvm_ext.bench.gpu_plan import (
    ASSUMED_S,
    Estimator,
    History,
    ncu_choices,
    ncu_planned_s,
    sanitize_steps,
    torch_steps,
)
from tvm_ext.bench.gpu_prepare import PrepareOptions, make_plan, prepare, render_plan
from tvm_ext.bench.gpu_steps import Plan
from tvm_ext.bench.gpu_table import BEGIN, END, render, update_readme
from tvm_ext.bench.manifest import read_manifest
from tvm_ext.cli import main
from tvm_ext.errors import BenchError

REPO = Path(__file__).resolve().parents[1]
OPTIONS = {"models": ["mlp"], "presets": ["baseline", "stitch"], "targets": ["tvm_ext/h100", "tvm_ext/h200"],
           "tiny": ["conv_block"], "overhead_model": None, "torch_compile": [], "ncu_count": 1, "runtime": False}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpu_run") / "run"
    prepare(out, PrepareOptions(**OPTIONS))
    return out


def _execute(run_dir: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """The device-side command, as the GPU machine runs it (bundled harness, runtime-only TVM)."""
    return subprocess.run(["bash", str(REPO / "scripts" / "gpu_run.sh"), str(run_dir), str(out), "--dry-run",
                           "--python", sys.executable, *extra], capture_output=True, text=True, timeout=600, check=False)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_prepare_writes_bundles_plan_and_a_deduplicated_second_target(run_dir):
    plan = Plan.read(run_dir)
    kinds = [s.kind for s in plan.steps]
    assert kinds == sorted(kinds, key=["measure", "sanitize", "overhead", "torch", "ncu"].index)
    assert {s.id for s in plan.steps if s.kind == "measure"} == {"measure:mlp/baseline", "measure:mlp/stitch"}
    assert all(s.estimate_s > 0 and s.timeout_s >= s.estimate_s and s.estimate_from for s in plan.steps)
    assert render_plan(plan).splitlines()[-1] == f"planned device seconds: {plan.planned_s:.0f}"
    # the h200 bundle reuses the h100 libraries that came out byte-identical
    h200 = read_manifest(run_dir / "h200")
    shared = [b.library for m in h200.models for b in m.builds if b.library.startswith("../h100/")]
    assert shared and all((run_dir / "h200" / lib).is_file() for lib in shared)
    assert (run_dir / "python" / "tvm_ext" / "bench" / "gpu_execute.py").is_file()
    assert json.loads((run_dir / "ncu_list.json").read_text())[0]["kernels"]


def test_a_plan_over_its_deadline_is_refused(run_dir):
    with pytest.raises(BenchError, match="more than its deadline of 1 s"):
        make_plan(run_dir, PrepareOptions(**{**OPTIONS, "deadline_s": 1.0}), [])


def test_dry_run_runs_every_step_it_can_without_a_gpu(run_dir, tmp_path):
    proc = _execute(run_dir, tmp_path / "out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = {s["step"]: s for s in _lines(tmp_path / "out" / "steps.jsonl")}
    for sid in ("measure:mlp/baseline", "measure:mlp/stitch", "sanitize:memcheck/stitch"):
        assert steps[sid]["status"] == "ok" and steps[sid]["dry_run"]
    assert all(s["status"] == "skipped" and "ncu" in s["reason"] for s in steps.values() if s["kind"] == "ncu")
    rows = _lines(tmp_path / "out" / "results.jsonl")
    assert {(r["model"], r["system"]) for r in rows} >= {("mlp", "baseline"), ("mlp", "stitch")}
    # the references compared with themselves through the numerics code; the weights' digests checked
    assert all(r["dry_run"] and r["numerics_ok"] and r["error"] is None and r["tvm_runtime_only"] for r in rows)


def test_a_crashing_or_hanging_process_loses_one_row_not_the_run(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, symlinks=True)
    plan = Plan.read(copy)
    for s in plan.steps:
        if s.id == "measure:mlp/stitch":
            s.timeout_s = 3.0
    plan.write(copy)
    proc = _execute(copy, tmp_path / "out", "--inject-fault", "measure:mlp/baseline=abort",
                    "--inject-fault", "measure:mlp/stitch=hang")
    assert proc.returncode == 1
    steps = {s["step"]: s for s in _lines(tmp_path / "out" / "steps.jsonl")}
    assert steps["measure:mlp/baseline"]["status"] == "crashed" and "SIGABRT" in steps["measure:mlp/baseline"]["reason"]
    assert steps["measure:mlp/stitch"]["status"] == "timeout"
    assert steps["sanitize:memcheck/stitch"]["status"] == "ok"  # the run went on
    rows = {(r["model"], r["system"]): r for r in _lines(tmp_path / "out" / "results.jsonl")}
    assert "crashed" in rows[("mlp", "baseline")]["error"] and rows[("mlp", "baseline")]["median_ms"] is None
    assert "timeout" in rows[("mlp", "stitch")]["error"]


def test_steps_past_the_deadline_are_skipped_and_recorded(run_dir, tmp_path):
    proc = _execute(run_dir, tmp_path / "out", "--deadline", "0")
    assert proc.returncode == 0
    steps = _lines(tmp_path / "out" / "steps.jsonl")
    assert steps and all(s["status"] == "skipped" and s["reason"].startswith("deadline") for s in steps)


def _fake_output(out: Path, run_dir: Path) -> None:
    out.mkdir(parents=True)
    (out / "device.txt").write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3, 580.1, 1980 MHz", "bundle": "h100"}))
    (out / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in [
        {"step": "measure:mlp/baseline", "kind": "measure", "model": "mlp", "systems": ["baseline"], "status": "ok",
         "estimate_s": 4.0, "wall_s": 3.2, "dry_run": False},
        {"step": "measure:mlp/stitch", "kind": "measure", "model": "mlp", "systems": ["stitch"],
         "status": "crashed", "reason": "signal 11 (SIGSEGV)", "estimate_s": 4.0, "wall_s": 1.0, "dry_run": False},
        {"step": "sanitize:racecheck/stitch", "kind": "sanitize", "model": "conv_block", "systems": ["stitch"],
         "status": "failed", "reason": "exit 9", "estimate_s": 25.0, "wall_s": 9.0, "dry_run": False,
         "log": "logs/san.log"}]))
    (out / "logs").mkdir()
    (out / "logs" / "san.log").write_text("========= COMPUTE-SANITIZER\n========= Error: Race reported between "
                                          "Write access at k+0x10\n========= ERROR SUMMARY: 1 error\n")
    base = {"device": "NVIDIA H100 80GB HBM3", "commit": "abc", "date": "2026-11-28T01:00:00+00:00", "min_ms": 1.0,
            "max_ms": 1.2, "kernels": 2, "max_rel_err": 1e-3}
    (out / "results.jsonl").write_text(
        json.dumps({**base, "model": "mlp", "system": "baseline", "median_ms": 1.1, "numerics_ok": True}) + "\n"
        + json.dumps({**base, "model": "mlp", "system": "stitch", "median_ms": None, "numerics_ok": None,
                      "error": "the process crashed: signal 11 (SIGSEGV)"}) + "\n")


def test_ingest_files_results_steps_and_regenerates_the_table(run_dir, tmp_path):
    out, results, readme = tmp_path / "out", tmp_path / "results", tmp_path / "README.md"
    _fake_output(out, run_dir)
    readme.write_text(f"# x\n{BEGIN}\nstale\n{END}\ntail\n")
    written = ingest(out, run_dir, results=results, measurements=tmp_path / "m", readme=readme)
    names = sorted(p.name for p in written if p.parent == results)
    assert any(n.endswith("_steps.jsonl") for n in names) and all("nvidia-h100" in n for n in names)
    text = readme.read_text()
    assert "stale" not in text and "| mlp | 1.100 | crashed |" in text and text.endswith("tail\n")
    steps_md = next(p for p in written if p.name.endswith("_steps.md")).read_text()
    assert "Race reported" in steps_md and "ERROR SUMMARY: 1 error" in steps_md
    assert update_readme(readme, results, check=True)


def test_ingest_refuses_a_dry_run(run_dir, tmp_path):
    _execute(run_dir, tmp_path / "out")
    with pytest.raises(BenchError, match="dry run"):
        ingest(tmp_path / "out", run_dir, results=tmp_path / "r", readme=tmp_path / "README.md")


def test_readme_gpu_table_matches_bench_results():
    """The README's table is what `python -m tvm_ext.bench.gpu_table` makes of bench/results/."""
    assert update_readme(REPO / "README.md", REPO / "bench" / "results", check=True), \
        "README's GPU table is stale: run python -m tvm_ext.bench.gpu_table"


def test_table_marks_wrong_failed_and_crashed_cells(tmp_path):
    rows = [{"model": "m", "system": "baseline", "device": "NVIDIA H200", "median_ms": 2.0, "numerics_ok": False},
            {"model": "m", "system": "cutlass", "device": "NVIDIA H200", "median_ms": None,
             "error": "RuntimeError: can_implement failed"},
            {"model": "m", "system": "full", "device": "NVIDIA H200", "median_ms": None,
             "error": "the process crashed: signal 6 (SIGABRT)"}]
    (tmp_path / "20261128T0100Z_nvidia-h200_x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "| m | 2.000 wrong | failed | crashed |" in render(tmp_path)


def test_sanitizer_findings_and_ncu_choices():
    log = "========= COMPUTE-SANITIZER\nok line\n========= Invalid __global__ read of size 4 bytes\n"
    assert sanitizer_findings(log) == ["========= Invalid __global__ read of size 4 bytes"]


def test_ncu_prefers_builds_priced_from_unmeasured_kinds(run_dir):
    manifest = read_manifest(run_dir / "h100")
    measured_all = [{"generator": k["generator"], "config": {"kernel": {"code_path": k["measurement"]["config"]
                                                                        ["kernel"]["code_path"]}}}
                    for m in manifest.models for b in m.builds for k in b.kernel_list]
    unmeasured = ncu_choices(manifest, [], 5)
    half = ncu_choices(manifest, measured_all, 5)
    assert unmeasured and all(k["measured_kind"] for c in half for k in c["kernels"])
    assert half[0]["unsure_modelled_s"] == pytest.approx(unmeasured[0]["unsure_modelled_s"] / 2)


def test_gpu_run_cli_usage_error(tmp_path, capsys):
    assert main(["gpu-run", "ingest", str(tmp_path), "--run", str(tmp_path)]) == 2
    assert "no steps.jsonl" in capsys.readouterr().err


def test_weight_cache_is_shared_and_checked(tmp_path, monkeypatch):
    from tvm_ext.bench.weights import CACHE_ENV, WeightDigest, WeightTensor, checked_weights

    tensors = [WeightTensor("w", (4, 3), "float32", "float16", 0.0, 1.0)]
    digest = WeightDigest()
    drawn = checked_weights(tensors, 0, None, "m")
    digest.update(drawn[0])
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    first = checked_weights(tensors, 0, digest.hexdigest(), "m")
    (cached,) = tmp_path.glob("m_*.npz")
    assert (first[0] == drawn[0]).all()
    np.savez(cached, w0=np.zeros((4, 3), dtype=np.float16))  # a stale or damaged cache is caught by the digest
    with pytest.raises(BenchError, match="differ"):
        checked_weights(tensors, 0, digest.hexdigest(), "m")


def test_resume_keeps_the_parts_already_built(run_dir, tmp_path, monkeypatch):
    """A prepare cut short goes on: parts whose manifest holds every asked build are not rebuilt."""
    import tvm_ext.bench.gpu_prepare as gpu_prepare

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, symlinks=True)
    (copy / "plan.json").unlink()
    built: list[str] = []
    monkeypatch.setattr(gpu_prepare, "build_bundle", lambda models, out, **kw: built.append(Path(out).name))
    with pytest.raises(BenchError, match="--resume"):
        prepare(copy, PrepareOptions(**OPTIONS))
    prepare(copy, PrepareOptions(**OPTIONS, resume=True))
    assert built == [] and Plan.read(copy).steps
    # a preset the bundles lack: the target bundles and the tiny one are built again
    prepare(copy, PrepareOptions(**{**OPTIONS, "presets": ["baseline", "stitch", "full"]}, resume=True))
    assert built == ["h100", "h200", "tiny"]


def _estimator(history: History | None = None) -> Estimator:
    return Estimator(history or History({}, {}), 1e9, 1e9, runs=10, warmup=2, repeat=False)


def test_memcheck_runs_a_process_per_preset_racecheck_one_for_all(run_dir):
    tiny = read_manifest(run_dir / "tiny")
    steps = sanitize_steps("tiny", tiny, _estimator(), {"memcheck": ["baseline", "stitch"],
                                                        "racecheck": ["baseline", "stitch"]})
    assert [(s.id, s.systems) for s in steps] == [("sanitize:memcheck/baseline", ["baseline"]),
                                                  ("sanitize:memcheck/stitch", ["stitch"]),
                                                  ("sanitize:racecheck/baseline+stitch", ["baseline", "stitch"])]
    assert steps[2].argv[steps[2].argv.index("--systems") + 1] == "baseline,stitch"
    one = ASSUMED_S["sanitize_process"] + ASSUMED_S["sanitize_build"]  # one tiny model, one preset
    assert [s.estimate_s for s in steps] == [one, one, one + ASSUMED_S["sanitize_build"]]


def test_torch_eager_is_one_process_priced_by_recorded_medians(run_dir):
    manifest = read_manifest(run_dir / "h100")
    (entry,) = manifest.models
    assert torch_steps("{main}", manifest, _estimator(), [entry.name]) == []  # no torch definition, no step
    entry.corpus = {"module": "mlp_corpus"}
    history = History({}, {(entry.name, "torch-eager"): (7.0, "earlier.jsonl")})
    steps = torch_steps("{main}", manifest, _estimator(history), [entry.name])
    assert [s.id for s in steps] == ["torch:eager", f"torch:compile/{entry.name}"]
    eager, compiled = steps
    runs = 2 + 2 + 10  # first runs, warm-up, timed (no repeat)
    assert eager.estimate_s == pytest.approx(ASSUMED_S["torch_process"] + runs * 7.0e-3, abs=0.1)
    assert "median of earlier.jsonl" in eager.estimate_from
    assert compiled.estimate_s == ASSUMED_S["torch-compile"] and compiled.systems == ["torch-compile-reduce-overhead"]
    assert torch_steps("{main}", manifest, _estimator(), [])[-1].id == "torch:eager"


def test_ncu_picks_the_most_unsure_time_per_planned_second(run_dir):
    manifest = read_manifest(run_dir / "h100")
    (model,) = manifest.models
    cheap, dear = model.builds[0], model.builds[1]
    for build, launches, seconds in ((cheap, 2, 1e-3), (dear, 400, 2e-3)):
        build.kernels = launches
        for k in build.kernel_list:
            k["modelled_s"], k["calls"], k["cost_source"] = seconds, 1, "modelled"
    assert len(dear.kernel_list) >= len(cheap.kernel_list)  # dear holds more unsure time ...
    best = ncu_choices(manifest, [], 2)
    assert [c["system"] for c in best] == [cheap.system, dear.system]  # ... and costs 200x the launches
    assert best[1]["unsure_modelled_s"] > best[0]["unsure_modelled_s"]
    assert best[0]["unsure_per_planned_s"] == pytest.approx(best[0]["unsure_modelled_s"] / ncu_planned_s(2))


def test_a_runtime_packed_for_another_python_is_not_put_on_the_path(tmp_path):
    """The packed tvm_ffi is compiled for one Python: another one falls back to the machine's TVM."""
    from tvm_ext.bench.gpu_execute import step_environment

    runtime = tmp_path / "runtime"
    runtime.mkdir()
    (runtime / "tvm_runtime.tar.gz").write_bytes(b"not unpacked")
    (runtime / "runtime.json").write_text(json.dumps({"python": "2.7"}))
    env, used = step_environment(tmp_path, sys.executable)
    assert "packed runtime is for Python 2.7" in used and "site" not in env["PYTHONPATH"]
    assert not (runtime / "site").exists()
