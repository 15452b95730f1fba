"""The analytic cost model calibrated on, and validated against, per-kernel GPU measurements.

The measurements are the records of ``bench/measurements/<device>.jsonl`` (Nsight Compute
kernel durations, cold L2; each record carries the kernel description the model reads), joined
with the per-function tables ``bench/results/*_kernels.jsonl`` of the same runs, which name the
model, system and function of every record (:func:`load_kernels`).

**Model form** (the analytic model itself, :class:`~tvm_ext.select.analytic.AnalyticCostModel`,
with the device file's constants replaced): per launch a fixed time, per stage
``max(flops / (peak(path) x efficiency(path)) x wave quantization, DRAM bytes / achievable bandwidth,
global bytes / L2 bandwidth)``, per grid barrier a fixed time; the achievable DRAM bandwidth is
``min(datasheet x fraction, resident threads x bytes in flight / latency)`` (Little's law). The
fitted constants are :data:`PARAMETERS`: the fixed time per launch and per grid barrier, the bytes a
SIMT thread keeps in flight, the fraction of the DRAM bandwidth SIMT kernels sustain, and one
efficiency per code path the records exercise (``mma_sync`` and ``wgmma``, CUTLASS's, were never
measured per kernel: they keep their assumed values). The fit minimises the squared log ratio modelled / measured, each
distinct kernel (model and description) weighted once however often it was measured; a
constant no training record exercises (a code path nobody measured) keeps its prior value.

**Validation** is leave-one-model-out (:func:`leave_one_out`): the constants are fitted without
model X and X's kernels priced with them, for every X; :func:`summary` gives the geometric-mean
ratio modelled / measured, the share within 2x and Spearman's rank correlation.

Example
-------
>>> kernels = load_kernels("bench/measurements/h200.jsonl", sorted(Path("bench/results").glob("*_kernels.jsonl")))
>>> priced = leave_one_out(kernels, load_device("h200"), PRIOR_H200)
>>> summary(priced)["geomean"]
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..hardware import DeviceSpec
from .analytic import AnalyticCostModel
from .candidate import CodePath, StageWork
from .describe import KernelDescription, description_from_json

logger = logging.getLogger(__name__)

#: Constants the fit sets: (name, lower bound, upper bound). ``efficiency.<path>`` is the code
#: path's fraction of its peak; the rest are ``cost_model`` fields of the device file.
PARAMETERS: tuple[tuple[str, float, float], ...] = (
    ("launch_overhead_s", 0.5e-6, 8e-6),
    ("grid_sync_s", 0.2e-6, 10e-6),
    ("bytes_in_flight_per_thread", 1.0, 64.0),
    ("simt_dram_efficiency", 0.05, 0.95),
    ("efficiency.simt", 1e-3, 1.0),
    ("efficiency.simt_contraction", 1e-4, 1.0),
    ("efficiency.wmma", 1e-3, 1.0),
    ("efficiency.wmma_tile", 1e-4, 1.0),
)

#: The H200 file's constants before any calibration (the model the first GPU run compared with):
#: the starting point of the fit, the value of a constant no record exercises, and BEFORE in the
#: validation report. ``wmma``: TVM's tensorized kernels were priced as ``mma_sync``;
#: ``simt_dram_efficiency``: SIMT kernels streamed at ``dram_efficiency`` like every kernel.
PRIOR_H200: Mapping[str, float] = {
    "launch_overhead_s": 3e-6, "grid_sync_s": 2e-6, "bytes_in_flight_per_thread": 32, "simt_dram_efficiency": 0.9,
    "efficiency.simt": 0.6, "efficiency.simt_contraction": 0.03, "efficiency.wmma": 0.45,
    "efficiency.wmma_tile": 0.008,
}


@dataclass(frozen=True)
class MeasuredKernel:
    """One measured kernel call.

    Attributes
    ----------
    model, system, func, generator : str
        The model, system (preset), function and generator the record belongs to.
    kernel : KernelDescription
        What the cost model reads of it (see :func:`record_kernel` for the corrections).
    measured_s : float
        Measured seconds per call.
    corrections : tuple of str
        What :func:`record_kernel` changed in the recorded description, for the report.
    as_run_s : float
        What the build that was measured priced it at (its table's ``modelled_s``; 0 when unknown).
    calls : int
        Calls per inference (its table's ``calls``).
    run : str
        The table's run (its file name less ``_kernels.jsonl``: ``bench/results/<run>.jsonl`` holds
        the run's whole-model medians).
    """

    model: str
    system: str
    func: str
    generator: str
    kernel: KernelDescription
    measured_s: float
    corrections: tuple[str, ...] = ()
    as_run_s: float = 0.0
    calls: int = 1
    run: str = ""

    @property
    def code_path(self) -> str:
        """The code path the kernel is priced with."""
        return self.kernel.code_path.value

    @property
    def signature(self) -> str:
        """Equal for the same kernel of the same model measured several times."""
        return f"{self.model}|{json.dumps(kernel_json(self.kernel), sort_keys=True)}"


@dataclass(frozen=True)
class Priced:
    """A measured kernel and what a model priced it at."""

    kernel: MeasuredKernel
    modelled_s: float

    @property
    def ratio(self) -> float:
        """Modelled over measured seconds."""
        return self.modelled_s / self.kernel.measured_s


@dataclass(frozen=True)
class Fit:
    """Fitted constants.

    Attributes
    ----------
    values : Mapping
        Every constant of :data:`PARAMETERS` (fitted, or the prior where ``free`` lacks it).
    free : tuple of str
        The constants the training records exercised, hence fitted.
    records, kernels : int
        Training records and distinct kernels.
    rms_log : float
        Weighted root-mean-square of ``log(modelled / measured)`` on the training records.
    """

    values: Mapping[str, float]
    free: tuple[str, ...]
    records: int
    kernels: int
    rms_log: float


def kernel_json(kernel: KernelDescription) -> dict[str, Any]:
    """The description as JSON (stages included)."""
    out = {"flops": kernel.flops, "global_bytes": kernel.global_bytes, "unique_bytes": kernel.unique_bytes,
           "dram_bytes": kernel.dram_bytes, "launch": kernel.launch.to_json(), "code_path": kernel.code_path.value,
           "dtype": kernel.dtype}
    if kernel.stages:
        out["stages"] = [s.to_json() for s in kernel.stages]
    return out


def record_kernel(record: Mapping[str, Any], func: str = "") -> tuple[KernelDescription, tuple[str, ...]]:
    """The description of a measured record as the model prices the kernel today.

    A record keeps the description its build wrote; what the builds of the first GPU run did
    not yet write is taken from the plan it carries (``config["measured"]``):

    * a multi-stage kernel's stages (``plan.work``), which the model prices one after another
      (:func:`~tvm_ext.select.describe.describe_scheduled` does the same for a built kernel);
    * ``mma_sync`` written for a kernel TVM scheduled (every generator but a library's; its
      stages too): TVM's tensorized schedules are ``wmma``;
    * the code path of a plan that predates ``plan.code_path``: a stitch GEMM prologue
      (``tiles``) and a tile-graph kernel without tensor-core stages whose function holds a
      contraction (``matmul`` / ``conv`` in ``func``) compute one output per thread
      (``simt_contraction``); a tile-graph plan with tensor-core stages runs them on WMMA
      fragments (``wmma_tile``).
    """
    config = record.get("config") or {}
    kernel = description_from_json(config["kernel"])
    plan = config.get("measured") or {}
    notes: list[str] = []
    tvm_scheduled = record.get("generator") != "cutlass"
    work = plan.get("work")
    if work and not kernel.stages:
        stages = [StageWork.from_json(dict(w)) for w in work]
        if tvm_scheduled:
            stages = [dataclasses.replace(w, code_path=CodePath.WMMA) if w.code_path == CodePath.MMA_SYNC else w
                      for w in stages]
        kernel = dataclasses.replace(kernel, stages=tuple(stages))
        notes.append("stages from plan")
    path = plan.get("code_path")
    if path is None and tvm_scheduled and kernel.code_path == CodePath.MMA_SYNC:
        path = CodePath.WMMA.value
    if path is None and record.get("generator") == "stitch" and "tiles" in plan:
        path = CodePath.SIMT_CONTRACTION.value
    if path is None and record.get("generator") == "tilegraph" and "output_tile" in plan:
        if plan.get("tensor_core"):
            path = CodePath.WMMA_TILE.value
        elif any(op in func for op in ("matmul", "conv")):
            path = CodePath.SIMT_CONTRACTION.value
    if path is not None and path != kernel.code_path.value:
        notes.append(f"code path {kernel.code_path.value} -> {path}")
        kernel = dataclasses.replace(kernel, code_path=CodePath(path))
    return kernel, tuple(notes)


def load_kernels(measurements: str | Path, tables: Iterable[str | Path]) -> list[MeasuredKernel]:
    """The records of ``measurements`` joined with the per-function ``tables`` that name them.

    ``kernel_report.py`` appends one record per table row, in the table's order; a table's rows
    are matched to the next records whose latencies equal its measured seconds (a table none
    matches, e.g. one of a run whose records were not filed, is skipped). Records no table
    names keep ``model`` ``"?"``.
    """
    records = [json.loads(line) for line in Path(measurements).read_text().splitlines() if line.strip()]
    names: list[Mapping[str, Any] | None] = [None] * len(records)
    at = 0
    for table in sorted(Path(t) for t in tables):
        rows = [json.loads(line) for line in table.read_text().splitlines() if line.strip()]
        block = records[at:at + len(rows)]
        if rows and len(block) == len(rows) and all(
                math.isclose(r["latency_s"], row["measured_s"], rel_tol=1e-9) for r, row in zip(block, rows)):
            run = table.name.removesuffix("_kernels.jsonl")
            names[at:at + len(rows)] = [{**row, "run": run} for row in rows]
            at += len(rows)
        else:
            logger.info("%s: its rows are not the next records, skipped", table.name)
    out = []
    for record, row in zip(records, names):
        row = row or {}
        func = str(row.get("func", ""))
        kernel, notes = record_kernel(record, func)
        out.append(MeasuredKernel(model=str(row.get("model", "?")), system=str(row.get("system", "?")), func=func,
                                  generator=str(record.get("generator", "")), kernel=kernel,
                                  measured_s=float(record["latency_s"]), corrections=notes,
                                  as_run_s=float(row.get("modelled_s") or 0.0), calls=int(row.get("calls", 1)),
                                  run=str(row.get("run", ""))))
    return out


def with_constants(device: DeviceSpec, values: Mapping[str, float]) -> DeviceSpec:
    """``device`` with the cost-model constants ``values`` (names of :data:`PARAMETERS`)."""
    cost = device.cost
    efficiency = dict(cost.efficiency)
    plain = {}
    for name, value in values.items():
        if name.startswith("efficiency."):
            efficiency[name.split(".", 1)[1]] = float(value)
        else:
            plain[name] = float(value)
    return dataclasses.replace(device, cost=dataclasses.replace(cost, efficiency=efficiency, **plain))


def price(kernels: Sequence[MeasuredKernel], device: DeviceSpec) -> list[Priced]:
    """Every kernel priced by the analytic model on ``device`` (launches from a stream)."""
    model = AnalyticCostModel()
    return [Priced(k, model.cost(k.kernel, device).seconds) for k in kernels]


def _exercised(kernels: Sequence[MeasuredKernel]) -> set[str]:
    """The constants of :data:`PARAMETERS` some of ``kernels`` depend on."""
    used = {"launch_overhead_s", "bytes_in_flight_per_thread"}
    for k in kernels:
        for part in k.kernel.stages or (k.kernel,):
            if part.flops > 0:
                used.add(f"efficiency.{part.code_path.value}")
            if part.global_bytes > 0 and part.code_path in (CodePath.SIMT, CodePath.SIMT_CONTRACTION):
                used.add("simt_dram_efficiency")
        if k.kernel.launch.grid_syncs:
            used.add("grid_sync_s")
    return used


def written(name: str, value: float) -> float:
    """``value`` as a device file holds it: 4 significant digits, ``bytes_in_flight_per_thread`` whole."""
    return float(round(value)) if name == "bytes_in_flight_per_thread" else float(f"{value:.4g}")


def fit(kernels: Sequence[MeasuredKernel], device: DeviceSpec, prior: Mapping[str, float]) -> Fit:
    """Fit the constants of :data:`PARAMETERS` to ``kernels`` on ``device`` (see the module docstring).

    Parameters
    ----------
    kernels : sequence of MeasuredKernel
        The training records.
    device : DeviceSpec
        The device they were measured on (its hardware; its cost constants are replaced).
    prior : Mapping
        A value for every constant of :data:`PARAMETERS`: where the search starts, and the value
        of a constant no training record exercises.

    Returns
    -------
    Fit
        The values rounded as a device file holds them (:func:`written`) and their residual.
    """
    from scipy.optimize import minimize

    used = _exercised(kernels)
    free = tuple(name for name, _, _ in PARAMETERS if name in used)
    bounds = {name: (lo, hi) for name, lo, hi in PARAMETERS}
    counts: dict[str, int] = {}
    for k in kernels:
        counts[k.signature] = counts.get(k.signature, 0) + 1
    weights = np.array([1.0 / counts[k.signature] for k in kernels])
    measured = np.log([k.measured_s for k in kernels])

    def values_of(x: np.ndarray) -> dict[str, float]:
        return {**prior, **{name: float(math.exp(v)) for name, v in zip(free, x)}}

    def loss(x: np.ndarray) -> float:
        modelled = np.log([p.modelled_s for p in price(kernels, with_constants(device, values_of(x)))])
        return float(np.sum(weights * (modelled - measured) ** 2) / np.sum(weights))

    start = np.log([prior[n] for n in free])
    log_bounds = [(math.log(bounds[n][0]), math.log(bounds[n][1])) for n in free]
    start = np.clip(start, [b[0] for b in log_bounds], [b[1] for b in log_bounds])
    # the loss is piecewise smooth (max, ceil, min): Powell from the prior and from a start with every
    # rate a fifth of it, each run again from where it stopped; the better end point is kept
    best = None
    for first in (start, np.clip(start + np.array([math.log(0.2) if n.startswith("efficiency.") else 0.0
                                                     for n in free]), *zip(*log_bounds))):
        x = first
        for _ in range(2):
            found = minimize(loss, x, method="Powell", bounds=log_bounds, options={"xtol": 1e-3, "ftol": 1e-7})
            x = found.x
        if best is None or found.fun < best.fun:
            best = found
    values = {name: written(name, v) if name in free else v for name, v in values_of(best.x).items()}
    return Fit(values=values, free=free, records=len(kernels), kernels=len(counts),
               rms_log=math.sqrt(loss(np.log([values[n] for n in free]))))


def leave_one_out(kernels: Sequence[MeasuredKernel], device: DeviceSpec, prior: Mapping[str, float],
                  group: Callable[[MeasuredKernel], str] = lambda k: k.model) -> tuple[list[Priced], dict[str, Fit]]:
    """Price every kernel with constants fitted on the other groups' kernels (default: models).

    Parameters
    ----------
    kernels : sequence of MeasuredKernel
        Every record.
    device : DeviceSpec
        The device they were measured on.
    prior : Mapping
        As for :func:`fit`.
    group : callable
        The group of a kernel (its model; :func:`~tvm_ext.select.validation.family` for families).

    Returns
    -------
    list of Priced, dict
        The priced kernels, in the order of ``kernels``, and the fit each group's kernels were
        priced with (fitted on every other group's).
    """
    out: dict[int, Priced] = {}
    fits: dict[str, Fit] = {}
    for name in sorted({group(k) for k in kernels}):
        held = [i for i, k in enumerate(kernels) if group(k) == name]
        train = [k for k in kernels if group(k) != name]
        fits[name] = fit(train, device, prior)
        priced = price([kernels[i] for i in held], with_constants(device, fits[name].values))
        out.update(zip(held, priced))
    return [out[i] for i in range(len(kernels))], fits


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (ties get their mean rank)."""
    from scipy.stats import spearmanr

    if len(a) < 2:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def summary(priced: Sequence[Priced]) -> dict[str, float]:
    """``n``, ``geomean`` (modelled / measured), ``within_2x`` (share) and ``spearman`` of ``priced``."""
    if not priced:
        return {"n": 0, "geomean": float("nan"), "within_2x": float("nan"), "spearman": float("nan")}
    ratios = np.array([p.ratio for p in priced])
    return {"n": len(priced), "geomean": float(np.exp(np.mean(np.log(ratios)))),
            "within_2x": float(np.mean((ratios >= 0.5) & (ratios <= 2.0))),
            "spearman": spearman([p.modelled_s for p in priced], [p.kernel.measured_s for p in priced])}


def grouped(priced: Sequence[Priced], key: Callable[[MeasuredKernel], str]) -> dict[str, dict[str, float]]:
    """:func:`summary` per ``key`` of the kernels (code path, generator, model)."""
    groups: dict[str, list[Priced]] = {}
    for p in priced:
        groups.setdefault(key(p.kernel), []).append(p)
    return {name: summary(groups[name]) for name in sorted(groups)}


__all__ = [
    "PARAMETERS",
    "PRIOR_H200",
    "Fit",
    "MeasuredKernel",
    "Priced",
    "fit",
    "grouped",
    "kernel_json",
    "leave_one_out",
    "load_kernels",
    "price",
    "record_kernel",
    "spearman",
    "summary",
    "with_constants",
    "written",
]
