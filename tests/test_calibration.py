"""The analytic cost model calibrated on GPU measurements: record corrections, the fit, leave-one-
model-out validation, the device files it writes, and the validation report committed with them."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tvm_ext.hardware import load_device
from tvm_ext.hardware.calibrated import (
    calibration_summary,
    fitted_constants,
    write_cost_model,
    yaml_number,
)
from tvm_ext.hardware.device_spec import PACKAGED_DEVICES_DIR, load_device_file
from tvm_ext.select.analytic import AnalyticCostModel, efficiency
from tvm_ext.select.calibration import (
    PRIOR_H200,
    MeasuredKernel,
    Priced,
    fit,
    leave_one_out,
    load_kernels,
    price,
    record_kernel,
    summary,
    with_constants,
)
from tvm_ext.select.candidate import CodePath, LaunchShape
from tvm_ext.select.describe import KernelDescription
from tvm_ext.select.validation import check_targets, markdown

ROOT = Path(__file__).resolve().parents[1]
H200 = load_device("h200")
REPORT = ROOT / "bench" / "modelled" / "validation.json"


def _desc(flops: int, nbytes: int, grid: int, threads: int, path: CodePath, syncs: int = 0) -> dict:
    return {"flops": flops, "global_bytes": nbytes, "unique_bytes": nbytes, "dram_bytes": 0, "dtype": "float16",
            "code_path": path.value, "launch": {"grid": grid, "threads": threads, "kernels": 1, "grid_syncs": syncs,
                                                "registers": None, "shared_bytes": 0}}


def _record(generator: str, desc: dict, plan: dict | None = None, latency: float = 1e-5) -> dict:
    config = {"kernel": desc, **({"measured": plan} if plan is not None else {})}
    return {"key": "k" if plan else "", "device": "h200", "dtype": "float16", "generator": generator,
            "latency_s": latency, "config": config, "source": "test"}


def test_records_are_described_as_the_model_prices_them_today():
    gemm = _desc(10 ** 8, 10 ** 6, 6, 512, CodePath.MMA_SYNC)
    # TVM's tensorized schedules are ``wmma`` (a library's mma.sync kernel stays ``mma_sync``)
    kernel, notes = record_kernel(_record("dlight", gemm, {"rule": "Matmul"}))
    assert kernel.code_path == CodePath.WMMA and notes == ("code path mma_sync -> wmma",)
    assert record_kernel(_record("cutlass", gemm, {"api": "2x"}))[0].code_path == CodePath.MMA_SYNC
    # a multi-stage kernel is priced stage by stage from its plan's work
    stages = [_desc(10 ** 8, 10 ** 6, 96, 128, CodePath.MMA_SYNC), _desc(0, 10 ** 6, 96, 128, CodePath.SIMT)]
    merged, notes = record_kernel(_record("subprogram", gemm, {"work": stages, "grid_syncs": 1}))
    assert [s.code_path for s in merged.stages] == [CodePath.WMMA, CodePath.SIMT] and "stages from plan" in notes
    # plans written before ``plan.code_path``: GEMM prologues and SIMT tile GEMMs are one output per thread
    simt = _desc(10 ** 7, 10 ** 6, 96, 128, CodePath.SIMT)
    assert record_kernel(_record("stitch", simt, {"tiles": {}}))[0].code_path == CodePath.SIMT_CONTRACTION
    tile = {"output_tile": [1, 16, 64], "inline": []}
    assert record_kernel(_record("tilegraph", simt, tile), "fused_matmul_add")[0].code_path == CodePath.SIMT_CONTRACTION
    assert record_kernel(_record("tilegraph", simt, tile), "fused_add_layer_norm")[0].code_path == CodePath.SIMT
    wmma = {**tile, "tensor_core": ["matmul"]}
    assert record_kernel(_record("tilegraph", simt, wmma), "fused_matmul")[0].code_path == CodePath.WMMA_TILE
    # a plan that says its code path is believed
    assert record_kernel(_record("tilegraph", simt, {**tile, "code_path": "simt"}), "matmul")[0].code_path == CodePath.SIMT


def test_records_are_named_by_the_tables_that_list_them(tmp_path):
    desc = _desc(0, 4096, 1, 128, CodePath.SIMT)
    records = [_record("dlight", desc, latency=t) for t in (1e-6, 2e-6, 3e-6)]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    rows = {"a_kernels.jsonl": [("bert", 1e-6), ("bert", 2e-6)], "b_kernels.jsonl": [("gpt", 9e-6)],
            "c_kernels.jsonl": [("vit", 3e-6)]}
    for name, entries in rows.items():
        (tmp_path / name).write_text("".join(json.dumps({"model": m, "system": "s", "func": "f", "measured_s": t})
                                             + "\n" for m, t in entries))
    kernels = load_kernels(tmp_path / "m.jsonl", sorted(tmp_path.glob("*_kernels.jsonl")))
    # b's row is no record (its run was not filed): skipped, c names the third record
    assert [(k.model, k.measured_s) for k in kernels] == [("bert", 1e-6), ("bert", 2e-6), ("vit", 3e-6)]


def _synthetic(truth: dict[str, float]) -> list[MeasuredKernel]:
    """Kernels whose measured time is the model's with the constants ``truth``: three models."""
    shapes = [(0, 4096, 1, 128, CodePath.SIMT), (0, 2 ** 20, 64, 256, CodePath.SIMT),
              (0, 2 ** 27, 65536, 256, CodePath.SIMT), (0, 2 ** 26, 32768, 512, CodePath.SIMT),
              (2 * 10 ** 9, 2 ** 20, 8192, 256, CodePath.SIMT), (10 ** 9, 2 ** 21, 4096, 128, CodePath.SIMT),
              (2 * 10 ** 9, 2 ** 22, 6, 512, CodePath.WMMA), (8 * 10 ** 9, 2 ** 24, 1024, 512, CodePath.WMMA),
              (10 ** 9, 2 ** 22, 48, 512, CodePath.WMMA)]
    device = with_constants(H200, truth)
    out = []
    for i, (flops, nbytes, grid, threads, path) in enumerate(shapes):
        kernel = KernelDescription(flops, nbytes, nbytes, LaunchShape(grid=grid, threads=threads), path, "float16")
        seconds = AnalyticCostModel().cost(kernel, device).seconds
        out.append(MeasuredKernel("abc"[i % 3], "s", f"f{i}", "dlight", kernel, seconds))
    return out


TRUTH = {"launch_overhead_s": 2.5e-6, "bytes_in_flight_per_thread": 8.0, "simt_dram_efficiency": 0.5,
         "efficiency.simt": 0.3, "efficiency.wmma": 0.07}


def test_the_fit_recovers_the_constants_that_made_the_times():
    kernels = _synthetic({**PRIOR_H200, **TRUTH})
    found = fit(kernels, H200, PRIOR_H200)
    # only what the kernels exercise is fitted; the rest keeps its prior
    assert set(found.free) == set(TRUTH)
    assert found.values["efficiency.simt_contraction"] == PRIOR_H200["efficiency.simt_contraction"]
    assert found.values["grid_sync_s"] == PRIOR_H200["grid_sync_s"]
    for name, value in TRUTH.items():
        assert found.values[name] == pytest.approx(value, rel=0.05), name
    assert found.rms_log < 0.02 and found.kernels == len(kernels)


def test_leave_one_model_out_prices_a_model_with_constants_fitted_without_it():
    kernels = _synthetic({**PRIOR_H200, **TRUTH})
    contraction = KernelDescription(10 ** 8, 2 ** 20, 2 ** 20, LaunchShape(grid=96, threads=256),
                                    CodePath.SIMT_CONTRACTION, "float16")
    kernels.append(MeasuredKernel("d", "s", "g", "stitch", contraction, 1e-4))
    priced, fits = leave_one_out(kernels, H200, PRIOR_H200)
    assert sorted(fits) == ["a", "b", "c", "d"]
    for name, f in fits.items():
        assert f.records == sum(k.model != name for k in kernels)
        held = [i for i, k in enumerate(kernels) if k.model == name]
        assert [priced[i].modelled_s for i in held] == [
            p.modelled_s for p in price([kernels[i] for i in held], with_constants(H200, f.values))]
    # the only thread-per-output contraction is model d's: its fold cannot fit that rate and keeps the prior
    assert "efficiency.simt_contraction" not in fits["d"].free
    assert fits["d"].values["efficiency.simt_contraction"] == PRIOR_H200["efficiency.simt_contraction"]
    assert "efficiency.simt_contraction" in fits["a"].free


def test_summary_geomean_share_within_2x_and_rank_correlation():
    desc = KernelDescription(0, 0, 0, LaunchShape(grid=1, threads=1), CodePath.SIMT, "float16")
    measured = [1e-6, 2e-6, 4e-6, 8e-6]
    priced = [Priced(MeasuredKernel("m", "s", "f", "g", desc, t), t * r) for t, r in zip(measured, (1, 2, 0.5, 4))]
    s = summary(priced)
    assert s["n"] == 4 and s["geomean"] == pytest.approx(2 ** 0.5) and s["within_2x"] == 0.75
    assert s["spearman"] == pytest.approx(0.8)     # modelled ranks 1 3 2 4 against 1 2 3 4
    after = {"all": {**s, "geomean": 1.1, "spearman": 0.9}, "code_path": {"simt": {"geomean": 1.7}}}
    assert check_targets(after) == {"geomean": True, "within_2x": True, "spearman": True, "code_paths": False,
                                    "code_paths_outside": ["simt"], "met": False}


def test_fitted_constants_are_written_into_a_device_file(tmp_path):
    path = tmp_path / "h200.yaml"
    original = (PACKAGED_DEVICES_DIR / "h200.yaml").read_text()
    path.write_text(original)
    write_cost_model(path, {"efficiency.simt": 0.25, "grid_sync_s": 3e-06, "sibling": "h100"},
                     {"efficiency.simt": "fitted: a test", "grid_sync_s": "fitted on h100: a test", "sibling": "doc"})
    device = load_device_file(path)
    assert device.cost.efficiency["simt"] == 0.25 and device.cost.grid_sync_s == 3e-06
    assert device.cost.sibling == "h100" and device.sources["cost_model.sibling"] == "doc"
    assert set(fitted_constants(device)) >= {"efficiency.simt", "grid_sync_s"}
    # every other line is as it was
    changed = set(path.read_text().splitlines()) ^ set(original.splitlines())
    assert all(any(k in line for k in ("simt:", "grid_sync_s", "sibling")) for line in changed), changed
    # PyYAML reads a float only with a dot in the mantissa and a signed exponent
    assert [yaml_number(v) for v in (3e-06, 0.25, 4.8e12, 7.0)] == ["3.000e-06", "0.25", "4.800e+12", "7.0"]


def test_the_wmma_path_falls_back_to_mma_sync_where_a_device_has_no_rate_for_it():
    a100 = load_device("a100")
    assert "wmma" not in a100.cost.efficiency
    assert efficiency(a100, CodePath.WMMA) == a100.cost.efficiency["mma_sync"]
    # the H200 has a fitted rate for TVM's tensorized schedules; CUTLASS's mma.sync keeps its own
    assert efficiency(H200, CodePath.WMMA) < H200.cost.efficiency["mma_sync"] / 2


def test_the_device_files_hold_the_reported_fit():
    """The committed report was made by the committed code: its in-sample prices are the device
    file's, its BEFORE the prior constants', and the H100 carries the H200 fit."""
    report = json.loads(REPORT.read_text())
    kernels = load_kernels(ROOT / "bench/measurements/h200.jsonl", sorted((ROOT / "bench/results").glob("*_kernels.jsonl")))
    assert len(kernels) == report["records"]
    fitted = {n: report["fit"]["values"][n] for n in report["fit"]["free"]}
    h100 = load_device("h100")
    for name, value in fitted.items():
        for device in (H200, h100):
            have = (device.cost.efficiency[name.split(".")[1]] if name.startswith("efficiency.")
                    else getattr(device.cost, name))
            assert have == pytest.approx(value, rel=1e-12), (device.name, name)
        assert H200.sources[f"cost_model.{name}"].startswith("fitted: ")
        assert "bench/measurements/h200.jsonl" in H200.sources[f"cost_model.{name}"]
        assert "scripts/validate_cost_model.py" in H200.sources[f"cost_model.{name}"]
        assert h100.sources[f"cost_model.{name}"].startswith("fitted on h200: ")
    assert (H200.cost.sibling, h100.cost.sibling) == ("h100", "h200")
    assert calibration_summary(H200) == f"{len(fitted)} fitted on h200" == calibration_summary(h100)
    assert calibration_summary(load_device("a100")) == "-"
    in_sample = summary(price(kernels, H200))
    before = summary(price(kernels, with_constants(H200, PRIOR_H200)))
    for got, want in ((in_sample, report["in_sample"]["all"]), (before, report["before"]["all"])):
        assert got["n"] == want["n"] and got["geomean"] == pytest.approx(want["geomean"], rel=1e-9)
        assert got["within_2x"] == want["within_2x"] and got["spearman"] == pytest.approx(want["spearman"])
    # the markdown beside it is the rendering of the JSON
    assert REPORT.with_suffix(".md").read_text() == markdown(report)
    assert not math.isnan(report["after"]["all"]["geomean"])
