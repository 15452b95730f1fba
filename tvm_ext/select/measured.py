"""Measured and learned costs on top of the analytic model.

:class:`MeasuredCostModel` prices a kernel, in order of preference:

1. **measured** — the fastest :class:`~tvm_ext.select.database.Record` of the kernel's key on
   the device whose configuration is the kernel's (:mod:`tvm_ext.select.runner`, the CUTLASS
   profiler or a GPU run's Nsight Compute profile wrote it); a kernel without a key (no plan: TVM's
   own dlight schedules) matches the keyless records whose kernel description (work, traffic,
   launch; the code path aside) is its own (median of them). The records are the user's
   database and the ones the package ships (:func:`~tvm_ext.select.database.shipped_database`),
   in that order; without a record on the device, a record on its documented sibling
   (``cost_model.sibling``: the H100 and H200 share the GH100 compute configuration) is scaled by
   the analytic model's ratio of the two devices for the record's kernel (the DRAM bandwidth is
   what differs);
2. **learned** — with at least ``min_records`` measurements on the device, an xgboost model of
   the analytic model's residual ``log(measured / analytic)`` over the kernel's features (flops,
   bytes, grid, block, registers, shared memory, code path), as MetaSchedule's XGBModel does;
3. **analytic** — :class:`~tvm_ext.select.analytic.AnalyticCostModel` alone.

The learned correction is trained only when a user database is given (``$TVM_EXT_DATABASE``), on
its records of the device; the shipped records price their own kernels and calibrate the
analytic constants (:mod:`tvm_ext.select.calibration`).

Records carry the kernel description they were measured for (``config["kernel"]``, see
:func:`kernel_description`), so the residual can be recomputed whenever the analytic model
changes. The report says which source priced each kernel.

Example
-------
>>> model = MeasuredCostModel(AnalyticCostModel(), Database("measurements.jsonl"))
>>> model.cost(candidate, load_device("h100")).source
'measured'
"""
from __future__ import annotations

import logging
import math
from typing import Any, Mapping

from ..hardware import DeviceSpec, load_device
from .analytic import AnalyticCostModel, Priced
from .candidate import CodePath
from .cost import CostEstimate
from .database import Database, Record, default_database, shipped_database
from .describe import description_from_json

logger = logging.getLogger(__name__)

#: Measurements on one device before the learned correction is trained.
MIN_RECORDS = 20
_PATHS = tuple(p.value for p in CodePath)


def kernel_description(kernel: Priced) -> dict[str, Any]:
    """What the cost model reads of ``kernel``, as JSON (stored with every measurement; read
    back by :func:`~tvm_ext.select.describe.description_from_json`)."""
    return {"flops": int(kernel.flops), "global_bytes": int(kernel.global_bytes),
            "unique_bytes": int(kernel.unique_bytes), "dram_bytes": int(getattr(kernel, "dram_bytes", 0)),
            "launch": kernel.launch.to_json(), "code_path": kernel.code_path.value, "dtype": kernel.dtype}


def features(kernel: Priced, analytic_s: float) -> list[float]:
    """Features of the learned correction: log work, log traffic, launch shape, code path, analytic time."""
    launch = kernel.launch
    return [math.log1p(kernel.flops), math.log1p(kernel.global_bytes), math.log1p(kernel.unique_bytes),
            math.log1p(launch.grid), float(launch.threads), float(launch.registers or 0),
            math.log1p(launch.shared_bytes), float(launch.kernels), float(launch.grid_syncs),
            *[float(kernel.code_path.value == p) for p in _PATHS], math.log(max(analytic_s, 1e-9))]


def measured_config(plan) -> Mapping[str, Any]:
    """The part of a plan a measurement is keyed by (a library kernel: its template configuration)."""
    return plan.measured_config() if hasattr(plan, "measured_config") else plan.to_json()


class MeasuredCostModel:
    """Measured, else learned, else analytic costs (see the module docstring).

    Parameters
    ----------
    analytic : AnalyticCostModel
        The model under the corrections.
    database : Database, optional
        Measurements (default: ``$TVM_EXT_DATABASE`` when set, else none).
    min_records : int
        Measurements on a device before the learned correction is used.
    shipped : bool
        Also price from the measurements the package ships.
    """

    def __init__(self, analytic: AnalyticCostModel | None = None, database: Database | None = None,
                 min_records: int = MIN_RECORDS, shipped: bool = True):
        self.analytic = analytic or AnalyticCostModel()
        self.database = database if database is not None else default_database()
        self.shipped = shipped_database() if shipped else None
        self.min_records = min_records
        self._learned: dict[str, Any] = {}

    def _measured(self, kernel, device: DeviceSpec) -> tuple[float, dict[str, float]] | None:
        """Seconds and parts of ``kernel``'s measurement on ``device`` or its sibling, or None."""
        for db in (self.database, self.shipped):
            record = _lookup(db, kernel, device.name)
            if record is not None:
                return record.latency_s, {"measured_s": record.latency_s}
        sibling = device.cost.sibling
        for db in (self.database, self.shipped) if sibling else ():
            record = _lookup(db, kernel, sibling)
            if record is not None and "kernel" in record.config:
                described = description_from_json(record.config["kernel"])
                there = self.analytic.cost(described, load_device(sibling)).seconds
                scale = self.analytic.cost(described, device).seconds / there if there > 0 else 1.0
                return record.latency_s * scale, {"measured_s": record.latency_s * scale, "sibling_scale": scale}
        return None

    def _model(self, device: DeviceSpec):
        """The xgboost residual model of ``device`` (None with too few described records)."""
        if device.name in self._learned:
            return self._learned[device.name]
        model = None
        rows = [r for r in (self.database or ()) if r.device == device.name and "kernel" in r.config]
        if len(rows) >= self.min_records:
            import numpy as np
            import xgboost

            x, y = [], []
            for rec in rows:
                kernel = description_from_json(rec.config["kernel"])
                analytic = self.analytic.cost(kernel, device).seconds
                x.append(features(kernel, analytic))
                y.append(math.log(rec.latency_s / max(analytic, 1e-12)))
            # the native API (the scikit-learn wrapper needs scikit-learn, which we do not require)
            model = xgboost.train({"max_depth": 4, "eta": 0.1, "objective": "reg:squarederror"},
                                  xgboost.DMatrix(np.asarray(x), label=np.asarray(y)), num_boost_round=100)
            logger.info("learned cost correction for %s from %d measurements", device.name, len(rows))
        self._learned[device.name] = model
        return model

    def cost(self, kernel: Priced, device: DeviceSpec) -> CostEstimate:
        """Seconds of one call of ``kernel`` on ``device`` with the best source available."""
        found = self._measured(kernel, device)
        if found is not None:
            return CostEstimate(found[0], "measured", found[1])
        base = self.analytic.cost(kernel, device)
        model = self._model(device) if self.database is not None else None
        if model is None:
            return base
        import numpy as np

        import xgboost

        correction = float(model.predict(xgboost.DMatrix(np.asarray([features(kernel, base.seconds)])))[0])
        return CostEstimate(base.seconds * math.exp(correction), "learned", {**base.parts, "log_correction": correction})


def _matching(db: Database | None, kernel, device: str) -> list[Record]:
    """``db``'s records of ``kernel`` on ``device``: by key and plan, or, for a kernel without a
    key, the keyless records with its description."""
    if db is None:
        return []
    dtype = getattr(kernel, "database_dtype", kernel.dtype)
    key = getattr(kernel, "key", "")
    if not key:
        described = _without_path(kernel_description(kernel))
        return [r for r in db.records("", device, dtype) if "measured" not in r.config
                and _without_path(r.config.get("kernel") or {}) == described]
    wanted = measured_config(kernel.plan) if getattr(kernel, "plan", None) is not None else None
    return [r for r in db.records(key, device, dtype)
            if wanted is None or dict(r.config.get("measured", r.config)) == dict(wanted)]


def _without_path(described: Mapping[str, Any]) -> dict[str, Any]:
    """A description without its code path (records of TVM's tensorized kernels written before the
    ``wmma`` path say ``mma_sync``; the work and launch identify the kernel)."""
    return {k: v for k, v in described.items() if k != "code_path"}


def _lookup(db: Database | None, kernel, device: str) -> Record | None:
    """The record that stands for ``kernel`` on ``device`` in ``db``: the fastest of its key and
    plan; for a kernel without a key, the (lower) median of the keyless records with its
    description (several functions may share one); None without any."""
    found = sorted(_matching(db, kernel, device), key=lambda r: r.latency_s)
    if not found:
        return None
    return found[0] if getattr(kernel, "key", "") else found[(len(found) - 1) // 2]


def record_fields(kernel) -> dict[str, Any]:
    """Everything of a :class:`Record` of ``kernel`` but the device, latency and source, as JSON.

    A kernel without a plan (a dlight kernel) has no key: its measurements only train the
    learned correction, they are never looked up.
    """
    plan = getattr(kernel, "plan", None)
    config: dict[str, Any] = {"kernel": kernel_description(kernel)}
    if plan is not None:
        config["measured"] = dict(measured_config(plan))
    return {"key": getattr(kernel, "key", ""), "dtype": kernel.database_dtype, "generator": kernel.generator,
            "config": config}


def measurement_record(kernel, device: str, latency_s: float, source: str) -> Record:
    """The :class:`Record` of one measured kernel (a candidate with a ``key`` and a plan)."""
    return record_from_fields(record_fields(kernel), device, latency_s, source)


def record_from_fields(fields: Mapping[str, Any], device: str, latency_s: float, source: str) -> Record:
    """The :class:`Record` of a kernel measured on ``device``, from its :func:`record_fields`."""
    return Record(key=str(fields["key"]), device=device, dtype=str(fields["dtype"]),
                  generator=str(fields["generator"]) or "dlight", latency_s=latency_s,
                  config=dict(fields["config"]), source=source)


__all__ = ["MIN_RECORDS", "MeasuredCostModel", "features", "kernel_description", "measured_config",
           "measurement_record", "record_fields", "record_from_fields"]
