"""End-to-end validation: a profiled build's kernels priced, summed by calls, against its run's median."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tvm_ext.select.calibration import MeasuredKernel, Priced
from tvm_ext.select.candidate import CodePath, LaunchShape
from tvm_ext.select.describe import KernelDescription
from tvm_ext.select.end_to_end import end_to_end, end_to_end_markdown, end_to_end_targets, order_checks

_DESC = KernelDescription(0, 4096, 4096, LaunchShape(grid=1, threads=128), CodePath.SIMT, "float16")


def _priced(system: str, calls: int, measured_s: float, modelled_s: float, model: str = "bert") -> Priced:
    return Priced(MeasuredKernel(model, system, f"f_{system}", "dlight", _DESC, measured_s, calls=calls, run="r1"),
                  modelled_s)


def _results(tmp_path: Path, rows: list[dict]) -> Path:
    (tmp_path / "r1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_a_build_is_priced_as_calls_times_each_kernel_against_its_median(tmp_path):
    priced = [_priced("baseline", 10, 1e-4, 2e-4), _priced("baseline", 2, 5e-4, 5e-4), _priced("stitch", 4, 1e-4, 1e-4)]
    results = _results(tmp_path, [{"model": "bert", "system": "baseline", "median_ms": 2.1, "numerics_ok": True}])
    rows = {r["system"]: r for r in end_to_end(priced, results, {"before": priced})}
    base = rows["baseline"]
    assert base["launches"] == 12 and base["kernels_ms"] == pytest.approx(2.0)
    assert base["modelled_ms"] == pytest.approx(3.0) and base["measured_ms"] == 2.1
    assert base["ratio"] == pytest.approx(3.0 / 2.1) and base["before_ms"] == pytest.approx(3.0)
    # no median for stitch in the run's file: its kernels' measured sum stands in
    assert rows["stitch"]["median_ms"] is None and rows["stitch"]["measured_ms"] == pytest.approx(0.4)


def test_targets_judge_right_builds_only_and_their_order(tmp_path):
    priced = [_priced("baseline", 1, 1e-3, 1.2e-3), _priced("stitch", 1, 2e-3, 1.1e-3),
              _priced("subprogram", 1, 1e-2, 1e-4)]
    results = _results(tmp_path, [
        {"model": "bert", "system": "baseline", "median_ms": 1.0, "numerics_ok": True},
        {"model": "bert", "system": "stitch", "median_ms": 2.0, "numerics_ok": True},
        {"model": "bert", "system": "subprogram", "median_ms": 10.0, "numerics_ok": False}])
    rows = end_to_end(priced, results)
    checks = order_checks(rows)
    # subprogram computed wrong: out of the judgement; baseline is measured faster, modelled slower
    assert [(c["systems"], c["ordered"]) for c in checks] == [(["baseline", "stitch"], False)]
    t = end_to_end_targets(rows)
    assert t["builds"] == 2 and t["outside"] == ["bert stitch (r1)"] and not t["met"]
    assert any("misordered" in line for line in end_to_end_markdown(rows))


def test_a_median_filed_by_another_run_of_the_same_build_is_found(tmp_path):
    """BERT re-run in its own processes: same commit, another file; its numerics judge the build."""
    priced = [Priced(MeasuredKernel("bert", "subprogram", "f", "subprogram", _DESC, 1e-2, calls=1,
                                    run="T0116Z_h200_abc123"), 4e-3)]
    (tmp_path / "T0131Z_h200_abc123_bert-per-process.jsonl").write_text(json.dumps(
        {"model": "bert", "system": "subprogram", "median_ms": 12.4, "numerics_ok": False}) + "\n")
    (tmp_path / "T0131Z_h200_other_x.jsonl").write_text(json.dumps(
        {"model": "bert", "system": "subprogram", "median_ms": 1.0, "numerics_ok": True}) + "\n")
    (row,) = end_to_end(priced, tmp_path)
    assert row["median_ms"] == 12.4 and row["numerics_ok"] is False
    assert end_to_end_targets([row])["builds"] == 0
