"""Benchmark results: one JSON object per line, and a markdown table of them.

Every line has at least ``model``, ``system`` (preset or baseline name), ``device`` (as the
driver names it), ``driver``, ``commit``, ``date``, ``median_ms``, ``min_ms``, ``max_ms``,
``kernels`` and ``max_rel_err`` (:data:`REQUIRED`). A system that failed has a line too,
with ``error`` set and null timings, so failures stay visible.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import BenchError

REQUIRED = ("model", "system", "device", "driver", "commit", "date", "median_ms", "min_ms", "max_ms",
            "kernels", "max_rel_err")


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        return _clean(value.item())
    return value


def validate(record: Mapping) -> None:
    """Raise if ``record`` lacks a required field.

    Raises
    ------
    BenchError
        Naming the missing fields.
    """
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise BenchError(f"result record for {record.get('model')}/{record.get('system')} lacks {missing}")


def append_jsonl(path: str | Path, records: Iterable[Mapping]) -> Path:
    """Append records to a JSON-lines file (created with its directory)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for record in records:
            validate(record)
            f.write(json.dumps({k: _clean(v) for k, v in record.items()}, sort_keys=False) + "\n")
    return path


def read_jsonl(path: str | Path) -> list[dict]:
    """All records of a JSON-lines file.

    Raises
    ------
    BenchError
        A line is not a JSON object with the required fields.
    """
    records = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise BenchError(f"{path}:{n}: not JSON ({err})") from None
        if not isinstance(record, dict):
            raise BenchError(f"{path}:{n}: not a JSON object")
        validate(record)
        records.append(record)
    return records


def results_name(date: str, device: str, commit: str) -> str:
    """File stem for a run: ``<date>_<device>_<commit>``, e.g. ``2026-11-22T1200Z_nvidia-h100-80gb-hbm3_8ed4246``."""
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "device"
    stamp = re.sub(r"[^0-9TZ]", "", date.replace("+00:00", "Z"))[:13] + "Z"
    return f"{stamp}_{slug}_{(commit or 'nocommit')[:12]}"


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def markdown_table(records: Sequence[Mapping]) -> str:
    """A markdown report: one row per model and system, then medians by system.

    Columns: median / min / max ms of the first timing, the median of the repeated timing
    (the noise), kernel launches, max relative error and whether the numerics passed,
    the roofline bound and the share of it reached.
    """
    if not records:
        return "_no results_\n"
    first = records[0]
    lines = [f"Device: {first.get('device')} (driver {first.get('driver')}), commit {first.get('commit')}, "
             f"{first.get('date')}", "",
             "| model | system | median ms | min ms | max ms | repeat median ms | kernels | max rel err | ok "
             "| roofline ms | roofline / median |",
             "|---|---|---:|---:|---:|---:|---:|---:|:-:|---:|---:|"]
    for r in records:
        if r.get("error"):
            lines.append(f"| {r['model']} | {r['system']} | failed: {str(r['error'])[:80]} "
                         "| | | | | | | | |")
            continue
        ok = {True: "yes", False: "**no**"}.get(r.get("numerics_ok"), "-")
        frac = r.get("roofline_fraction")
        lines.append(
            f"| {r['model']} | {r['system']} | {_fmt(r['median_ms'])} | {_fmt(r['min_ms'])} | {_fmt(r['max_ms'])} "
            f"| {_fmt(r.get('repeat_median_ms'))} | {_fmt(r['kernels'])} | {_fmt(r['max_rel_err'], '.2e')} | {ok} "
            f"| {_fmt(r.get('roofline_ms'), '.4f')} | {'-' if frac is None else f'{100 * frac:.1f}%'} |")
    systems = list(dict.fromkeys(r["system"] for r in records))
    models = list(dict.fromkeys(r["model"] for r in records))
    by_key = {(r["model"], r["system"]): r for r in records}
    lines += ["", "Median ms by system:", "",
              "| model | " + " | ".join(systems) + " |", "|---|" + "---:|" * len(systems)]
    for m in models:
        cells = []
        for s in systems:
            r = by_key.get((m, s))
            cells.append("-" if r is None or r.get("median_ms") is None else _fmt(r["median_ms"]))
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


__all__ = ["REQUIRED", "validate", "append_jsonl", "read_jsonl", "results_name", "markdown_table"]
