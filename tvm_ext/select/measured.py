"""Measured and learned costs on top of the analytic model.

:class:`MeasuredCostModel` prices a kernel, in order of preference:

1. **measured** — the fastest :class:`~tvm_ext.select.database.Record` of the kernel's key on
   the device whose configuration is the kernel's (:mod:`tvm_ext.select.runner` or the CUTLASS
   profiler wrote it on a GPU);
2. **learned** — with at least ``min_records`` measurements on the device, an xgboost model of
   the analytic model's residual ``log(measured / analytic)`` over the kernel's features (flops,
   bytes, grid, block, registers, shared memory, code path), as MetaSchedule's XGBModel does;
3. **analytic** — :class:`~tvm_ext.select.analytic.AnalyticCostModel` alone.

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

from ..hardware import DeviceSpec
from .analytic import AnalyticCostModel, Priced
from .candidate import CodePath
from .cost import CostEstimate
from .database import Database, Record, default_database
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
    """

    def __init__(self, analytic: AnalyticCostModel | None = None, database: Database | None = None,
                 min_records: int = MIN_RECORDS):
        self.analytic = analytic or AnalyticCostModel()
        self.database = database if database is not None else default_database()
        self.min_records = min_records
        self._learned: dict[str, Any] = {}

    def _measured(self, kernel, device: DeviceSpec) -> Record | None:
        if self.database is None or not getattr(kernel, "key", ""):
            return None
        wanted = measured_config(kernel.plan) if getattr(kernel, "plan", None) is not None else None
        dtype = getattr(kernel, "database_dtype", kernel.dtype)
        found = [r for r in self.database.records(kernel.key, device.name, dtype)
                 if wanted is None or dict(r.config.get("measured", r.config)) == dict(wanted)]
        return min(found, key=lambda r: r.latency_s) if found else None

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
        record = self._measured(kernel, device)
        if record is not None:
            return CostEstimate(record.latency_s, "measured", {"measured_s": record.latency_s})
        base = self.analytic.cost(kernel, device)
        model = self._model(device) if self.database is not None else None
        if model is None:
            return base
        import numpy as np

        import xgboost

        correction = float(model.predict(xgboost.DMatrix(np.asarray([features(kernel, base.seconds)])))[0])
        return CostEstimate(base.seconds * math.exp(correction), "learned", {**base.parts, "log_correction": correction})


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
