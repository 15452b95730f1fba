"""Per-kernel measurements against the cost model: Nsight Compute rows joined with a bundle.

``tvm_ext.bench.kernel_profile`` runs one inference of one build under ``ncu`` (raw page, CSV,
metrics :data:`NCU_METRICS`). This module reads that CSV on the build host, matches every
profiled kernel to the function of the build that launched it (by its ``__global__`` name, from
the manifest's ``kernel_list``), and gives, per function: measured and modelled seconds per
call, measured DRAM bytes against the modelled global traffic, and a database
:class:`~tvm_ext.select.database.Record` (source: the profiler) that the
:class:`~tvm_ext.select.measured.MeasuredCostModel` reads through ``TVM_EXT_DATABASE``.

Library kernels (CUTLASS) carry template names that no manifest entry lists: they are summed
per build as ``library`` and get no record (the CUTLASS profiler measures those).

Example
-------
>>> rows = kernel_rows(read_manifest("bundle"), "bert_base_s128_b1", "stitch", parse_ncu_csv(text))
>>> rows[0].measured_s, rows[0].modelled_s
"""
from __future__ import annotations

import csv
import io
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from ..errors import BenchError
from .manifest import Manifest

#: What the profiler reads of every kernel: its duration and the DRAM bytes it moved.
NCU_METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum")
#: How the profile was taken (stored as every record's source).
NCU_SOURCE = "ncu gpu__time_duration, cache-control all (cold L2), clock-control none"
LIBRARY = "library"

_SCALE = {"": 1.0, "byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "kibyte": 2.0 ** 10,
          "mibyte": 2.0 ** 20, "gibyte": 2.0 ** 30, "nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3,
          "second": 1.0, "ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass(frozen=True)
class ProfiledKernel:
    """One kernel launch the profiler saw (seconds, bytes)."""

    name: str
    seconds: float
    dram_read: float
    dram_write: float


@dataclass(frozen=True)
class KernelRow:
    """One function of a build: what the profiler measured and what the cost model said, per call."""

    model: str
    system: str
    func: str
    generator: str
    rule: str
    calls: int
    launches_seen: int
    measured_s: float
    modelled_s: float | None
    dram_bytes: float
    modelled_bytes: int | None

    @property
    def time_ratio(self) -> float | None:
        """Measured over modelled seconds."""
        return self.measured_s / self.modelled_s if self.modelled_s else None

    @property
    def bytes_ratio(self) -> float | None:
        """Measured DRAM bytes over modelled global traffic."""
        return self.dram_bytes / self.modelled_bytes if self.modelled_bytes else None

    def to_json(self) -> dict:
        """JSON form, with the ratios."""
        return {**asdict(self), "time_ratio": self.time_ratio, "bytes_ratio": self.bytes_ratio}


def _number(text: str) -> float:
    return float(text.replace(",", "")) if text.strip() else 0.0


def _kernel_name(text: str) -> str:
    """``void f<...>(float*)`` / ``f`` -> the function's base name (templates kept)."""
    name = text.strip()
    if name.startswith("void "):
        name = name[5:]
    depth, cut = 0, len(name)
    for pos, ch in enumerate(name):      # the first '(' outside template brackets starts the parameters
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            cut = pos
            break
    return name[:cut].strip()


def parse_ncu_csv(text: str) -> list[ProfiledKernel]:
    """The kernels of an ``ncu --csv --page raw`` output, in launch order.

    Lines before the header (the profiler's and the program's own output) are skipped; a units
    row after the header scales the values.

    Raises
    ------
    BenchError
        No header with ``Kernel Name`` and the metrics, or a value that is not a number.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"') and "Kernel Name" in line), None)
    if start is None:
        raise BenchError("no ncu raw CSV header (a line starting with \"ID\" that names \"Kernel Name\")")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = rows[0]
    missing = [m for m in ("Kernel Name", *NCU_METRICS) if m not in header]
    if missing:
        raise BenchError(f"ncu CSV lacks the columns {missing}; profile with --metrics {','.join(NCU_METRICS)}")
    col = {name: header.index(name) for name in ("ID", "Kernel Name", *NCU_METRICS)}
    scale: dict[str, float] | None = None
    out = []
    for row in rows[1:]:
        if len(row) < len(header):
            continue
        if not row[col["ID"]].strip():          # the units row
            units = {m: row[col[m]].strip().lower() for m in NCU_METRICS}
            unknown = {m: u for m, u in units.items() if u not in _SCALE}
            if unknown:
                raise BenchError(f"ncu CSV: unknown units {unknown}")
            scale = {m: _SCALE[u] for m, u in units.items()}
            continue
        if scale is None:
            raise BenchError("ncu CSV has no units row before its first kernel (profile with --csv --page raw)")
        try:
            values = {m: _number(row[col[m]]) * scale[m] for m in NCU_METRICS}
        except ValueError as err:
            raise BenchError(f"ncu CSV row {row[col['ID']]}: {err}") from None
        out.append(ProfiledKernel(_kernel_name(row[col["Kernel Name"]]), values["gpu__time_duration.sum"],
                                  values["dram__bytes_read.sum"], values["dram__bytes_write.sum"]))
    return out


def kernel_rows(manifest: Manifest, model: str, system: str, kernels: Sequence[ProfiledKernel]) -> list[KernelRow]:
    """Join the profiled kernels of one inference of ``model``/``system`` with its ``kernel_list``.

    Raises
    ------
    BenchError
        Unknown model or system, or a build without a kernel list (built before it existed).
    """
    entry = manifest.model(model)
    build = next((b for b in entry.builds if b.system == system), None)
    if build is None:
        raise BenchError(f"{model} has no build '{system}'")
    if not build.kernel_list:
        raise BenchError(f"{model}/{system} has no kernel list; rebuild the bundle with this version")
    owner = {name: item for item in build.kernel_list for name in item["kernel_names"]}
    seen: dict[str, list[ProfiledKernel]] = defaultdict(list)
    for k in kernels:
        seen[owner[k.name]["func"] if k.name in owner else LIBRARY].append(k)
    rows = []
    for item in build.kernel_list:
        if item["rule"] == "library" or item["func"] not in seen:
            continue
        got = seen[item["func"]]
        calls = max(int(item["calls"]), 1)
        measurement = item.get("measurement") or {}
        description = (measurement.get("config") or {}).get("kernel") or {}
        rows.append(KernelRow(model, system, item["func"], item["generator"], item["rule"], calls, len(got),
                              sum(k.seconds for k in got) / calls, item.get("modelled_s"),
                              sum(k.dram_read + k.dram_write for k in got) / calls,
                              description.get("global_bytes")))
    library = [item for item in build.kernel_list if item["rule"] == "library"]
    if seen.get(LIBRARY):
        got = seen[LIBRARY]
        modelled = sum(int(i["calls"]) * (i.get("modelled_s") or 0.0) for i in library) if library else None
        rows.append(KernelRow(model, system, LIBRARY, "cutlass" if library else "unknown", LIBRARY, 1, len(got),
                              sum(k.seconds for k in got), modelled,
                              sum(k.dram_read + k.dram_write for k in got), None))
    return rows


def database_records(manifest: Manifest, rows: Iterable[KernelRow], device: str) -> list:
    """A :class:`~tvm_ext.select.database.Record` per measured function that the manifest describes."""
    from ..select.measured import record_from_fields  # noqa: PLC0415 (the build host's side)

    records = []
    for row in rows:
        if row.func == LIBRARY:
            continue
        build = next(b for b in manifest.model(row.model).builds if b.system == row.system)
        item = next(i for i in build.kernel_list if i["func"] == row.func)
        if item.get("measurement") and row.measured_s > 0:
            records.append(record_from_fields(item["measurement"], device, row.measured_s, NCU_SOURCE))
    return records


def summary(rows: Sequence[KernelRow]) -> dict:
    """Geometric-mean ratios and the share of functions within 20 %, overall and per generator."""
    def stats(subset: Sequence[KernelRow]) -> dict:
        times = [r.time_ratio for r in subset if r.time_ratio]
        traffic = [r.bytes_ratio for r in subset if r.bytes_ratio]
        return {"functions": len(subset),
                "time_ratio_geomean": math.exp(statistics.fmean(map(math.log, times))) if times else None,
                "bytes_ratio_geomean": math.exp(statistics.fmean(map(math.log, traffic))) if traffic else None,
                "bytes_within_20pct": sum(0.8 <= b <= 1.2 for b in traffic),
                "time_within_20pct": sum(0.8 <= t <= 1.2 for t in times)}

    kernels = [r for r in rows if r.func != LIBRARY]
    by_gen: dict[str, list[KernelRow]] = defaultdict(list)
    for r in kernels:
        by_gen[r.generator].append(r)
    return {"all": stats(kernels), **{g: stats(v) for g, v in sorted(by_gen.items())}}


def markdown(rows: Sequence[KernelRow]) -> str:
    """One table row per function: measured and modelled µs per call and MB per call."""
    def fmt(x: float | None, scale: float, digits: int = 1) -> str:
        return "" if x is None else f"{x * scale:.{digits}f}"

    lines = ["| model | system | function | generator | calls | measured µs | modelled µs | time ratio | "
             "DRAM MB | modelled MB | bytes ratio |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.model} | {r.system} | {r.func} | {r.generator} | {r.calls} | {fmt(r.measured_s, 1e6)} | "
                     f"{fmt(r.modelled_s, 1e6)} | {fmt(r.time_ratio, 1, 2)} | {fmt(r.dram_bytes, 1e-6, 2)} | "
                     f"{fmt(r.modelled_bytes, 1e-6, 2)} | {fmt(r.bytes_ratio, 1, 2)} |")
    return "\n".join(lines) + "\n"


__all__ = ["NCU_METRICS", "NCU_SOURCE", "LIBRARY", "ProfiledKernel", "KernelRow", "parse_ncu_csv", "kernel_rows",
           "database_records", "summary", "markdown"]
