"""The cost model's validation report: BEFORE (the prior constants) and AFTER (fitted, leave one
model out) against per-kernel GPU measurements, per code path, generator and model.

:func:`validation_report` computes it as JSON-ready data (:mod:`tvm_ext.select.calibration` does
the fitting); :func:`markdown` renders it. ``scripts/validate_cost_model.py`` writes both to
``bench/modelled/validation.{json,md}``.

Example
-------
>>> report = validation_report(kernels, load_device("h200"), PRIOR_H200)
>>> report["after"]["all"]["geomean"], report["targets"]["met"]
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..hardware import DeviceSpec
from .calibration import (
    PARAMETERS,
    MeasuredKernel,
    Priced,
    fit,
    grouped,
    leave_one_out,
    price,
    summary,
    with_constants,
)
from .end_to_end import end_to_end, end_to_end_markdown

#: The issue's targets for the leave-one-model-out prices.
TARGETS = {"geomean": (0.8, 1.25), "within_2x": 0.75, "spearman": 0.85, "code_path_geomean": (0.6, 1.6)}


def family(kernel: MeasuredKernel) -> str:
    """The model family (``bert_base_s128_b1`` and ``bert_base_s384_b1`` are one: ``bert``)."""
    return kernel.model.split("_", 1)[0]


def _views(priced: Sequence[Priced]) -> dict[str, Any]:
    return {"all": summary(priced), "code_path": grouped(priced, lambda k: k.code_path),
            "generator": grouped(priced, lambda k: k.generator), "model": grouped(priced, lambda k: k.model)}


def check_targets(after: Mapping[str, Any]) -> dict[str, Any]:
    """Which of :data:`TARGETS` the summary ``after`` (of :func:`_views`) meets."""
    lo, hi = TARGETS["geomean"]
    plo, phi = TARGETS["code_path_geomean"]
    al = after["all"]
    outside = sorted(p for p, s in after["code_path"].items() if not plo <= s["geomean"] <= phi)
    checks = {"geomean": lo <= al["geomean"] <= hi, "within_2x": al["within_2x"] >= TARGETS["within_2x"],
              "spearman": al["spearman"] >= TARGETS["spearman"], "code_paths": not outside}
    return {**checks, "code_paths_outside": outside, "met": all(checks.values())}


def validation_report(kernels: Sequence[MeasuredKernel], device: DeviceSpec, prior: Mapping[str, float],
                      group: Callable[[MeasuredKernel], str] = lambda k: k.model,
                      results: Path | None = None) -> dict[str, Any]:
    """BEFORE, AFTER (leave one ``group`` out), AFTER leaving one family out, and the fit on every
    kernel (in sample: the constants the device file gets), with each kernel's prices; with
    ``results`` (``bench/results``), the end-to-end rows of :mod:`~tvm_ext.select.end_to_end`."""
    before = price(kernels, with_constants(device, prior))
    after, fits = leave_one_out(kernels, device, prior, group)
    by_family, _ = leave_one_out(kernels, device, prior, family)
    full = fit(kernels, device, prior)
    inside = price(kernels, with_constants(device, full.values))
    as_run = [Priced(k, k.as_run_s) for k in kernels if k.as_run_s > 0]
    after_views = _views(after)
    rows = [{"model": k.model, "system": k.system, "func": k.func, "generator": k.generator, "code_path": k.code_path,
             "corrections": list(k.corrections), "measured_s": k.measured_s, "before_s": b.modelled_s,
             "after_s": a.modelled_s, "after_family_s": f.modelled_s, "in_sample_s": i.modelled_s,
             "as_run_s": k.as_run_s}
            for k, b, a, f, i in zip(kernels, before, after, by_family, inside)]
    return {"device": device.name, "records": len(kernels), "distinct": len({k.signature for k in kernels}),
            "corrected": sum(bool(k.corrections) for k in kernels),
            "models": sorted({k.model for k in kernels}), "prior": dict(prior),
            "parameters": [{"name": n, "lower": lo, "upper": hi} for n, lo, hi in PARAMETERS],
            "fit": {"values": dict(full.values), "free": list(full.free), "rms_log": full.rms_log,
                    "records": full.records, "kernels": full.kernels},
            "folds": {name: {"values": dict(f.values), "free": list(f.free), "records": f.records,
                             "rms_log": f.rms_log} for name, f in fits.items()},
            "as_run": _views(as_run), "before": _views(before), "after": after_views, "after_family": _views(by_family),
            "in_sample": _views(inside), "targets": check_targets(after_views), "kernels": rows,
            "end_to_end": end_to_end(after, results, {"before": before, "in_sample": inside}) if results else []}


def _fmt(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def _value(name: str, v: float) -> str:
    return f"{v * 1e6:.2f} us" if name.endswith("_s") else f"{v:.4g}"


def _table(title: str, key: str, report: Mapping[str, Any]) -> list[str]:
    names = sorted(set(report["before"][key]) | set(report["after"][key]))
    head = ("| | n | geomean before | geomean after | within 2x before | within 2x after "
            "| Spearman before | Spearman after |")
    out = [f"### {title}", "", head, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name in names:
        b, a = report["before"][key].get(name, {}), report["after"][key].get(name, {})
        out.append(f"| {name} | {a.get('n', b.get('n'))} | {_fmt(b.get('geomean'))} | {_fmt(a.get('geomean'))} | "
                   f"{_fmt(b.get('within_2x'))} | {_fmt(a.get('within_2x'))} | {_fmt(b.get('spearman'))} | "
                   f"{_fmt(a.get('spearman'))} |")
    return out + [""]


def markdown(report: Mapping[str, Any], command: str = "python3 scripts/validate_cost_model.py") -> str:
    """The report as markdown."""
    t = report["targets"]
    rows = [("AS RUN (what each measured build priced its kernels at)", report["as_run"]["all"]),
            ("BEFORE (prior constants)", report["before"]["all"]),
            ("AFTER, leave one model out", report["after"]["all"]),
            ("AFTER, leave one model family out", report["after_family"]["all"]),
            ("fit on every record (in sample)", report["in_sample"]["all"])]
    intro = (f"Written by `{command}`. {report['records']} Nsight Compute kernel records "
             f"({report['distinct']} distinct kernels of {len(report['models'])} models: "
             f"{', '.join(report['models'])}), modelled / measured seconds per call. **Leave one model out**: the "
             "constants are fitted without model X, X's kernels priced with them, for every X; the family "
             "row also leaves BERT s128 and s384 out together. BEFORE prices the records' kernel descriptions "
             "with the device file's constants before this fit; AS RUN is what the measured builds' manifests "
             "said (older code: e.g. thread-per-output GEMMs at the CUDA-core SIMT rate). Descriptions are "
             "corrected from the plans they carry where the builds predate a field (`record_kernel` in "
             f"`tvm_ext/select/calibration.py`: {report['corrected']} records).")
    lines = [f"# Cost model against the GPU: {report['device']}", "", intro, "",
             "| | n | geomean modelled / measured | within 2x | Spearman |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {name} | {s['n']} | {_fmt(s['geomean'])} | {_fmt(s['within_2x'])} | {_fmt(s['spearman'])} |"
              for name, s in rows]
    lo, hi = TARGETS["geomean"]
    plo, phi = TARGETS["code_path_geomean"]
    paths = "met" if t["code_paths"] else f"NOT met ({', '.join(t['code_paths_outside'])})"
    targets = (f"Targets (leave one model out): geomean in [{lo}, {hi}]: {'met' if t['geomean'] else 'NOT met'}; "
               f">= {TARGETS['within_2x']:.0%} within 2x: {'met' if t['within_2x'] else 'NOT met'}; Spearman >= "
               f"{TARGETS['spearman']}: {'met' if t['spearman'] else 'NOT met'}; every code path's geomean in "
               f"[{plo}, {phi}]: {paths}")
    form = ("Model form: the analytic model (`tvm_ext/select/analytic.py`) itself: `launches x launch_overhead_s "
            "+ sum over stages of max(flops / (peak(path) x efficiency(path)) x wave quantization, DRAM bytes / "
            "min(DRAM bandwidth x dram_efficiency (SIMT paths: simt_dram_efficiency), resident threads x "
            "bytes_in_flight_per_thread / dram_latency_s), global bytes / L2 bandwidth) + grid barriers x "
            "grid_sync_s`. Fit: minimum of the mean squared log(modelled / measured), each distinct kernel "
            "weighted once (Powell, bounds below); a constant no training record exercises keeps its prior.")
    lines += ["", targets, "", "## Fitted constants", "", form, "",
              "| constant | prior | fitted (all records) | bounds | left-out folds (min - max) |",
              "|---|---:|---:|---:|---:|"]
    for p in report["parameters"]:
        name = p["name"]
        folds = [f["values"][name] for f in report["folds"].values() if name in f["free"]]
        span = f"{_value(name, min(folds))} - {_value(name, max(folds))}" if folds else "-"
        lines.append(f"| {name} | {_value(name, report['prior'][name])} | {_value(name, report['fit']['values'][name])}"
                     f" | {_value(name, p['lower'])} - {_value(name, p['upper'])} | {span} |")
    residual = (f"Residual of the fit on every record: rms log ratio {report['fit']['rms_log']:.3f} "
                f"(x{math.exp(report['fit']['rms_log']):.2f}).")
    lines += ["", residual, "", "## Per code path, generator and left-out model", ""]
    lines += _table("Code path", "code_path", report)
    lines += _table("Generator", "generator", report)
    lines += _table("Model (AFTER: priced by the fold that left it out)", "model", report)
    worst = sorted(report["kernels"], key=lambda r: -abs(math.log(r["after_s"] / r["measured_s"])))
    seen, top = set(), []
    for r in worst:
        if (r["model"], r["func"]) not in seen:
            seen.add((r["model"], r["func"]))
            top.append(r)
    lines += ["## Largest errors after the fit (leave one model out)", "",
              "| model | system | function | generator | path | measured us | before us | after us |",
              "|---|---|---|---|---|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['system']} | {r['func'][:48]} | {r['generator']} | {r['code_path']} | "
              f"{r['measured_s'] * 1e6:.1f} | {r['before_s'] * 1e6:.1f} | {r['after_s'] * 1e6:.1f} |" for r in top[:12]]
    if report.get("end_to_end"):
        lines += [""] + end_to_end_markdown(report["end_to_end"])
    return "\n".join(lines) + "\n"


__all__ = ["TARGETS", "check_targets", "family", "markdown", "validation_report"]
