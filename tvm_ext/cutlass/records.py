"""CUTLASS measurements in the shared :class:`~tvm_ext.select.database.Database`.

A CUTLASS record is keyed by the workload key (``gemm_b1_m256_n512_k128_rc``), the device it was
measured on and ``"<tensor-core input dtype>-><output dtype>"`` (``"float16->float32"``,
``"tfloat32->float32"``); its ``config`` is the
:class:`~tvm_ext.cutlass.config.KernelConfig`. A configuration measured on a device may not build
for every target of that device (CUTLASS 3.x kernels need ``sm_90a``), so lookups filter by the
target's arch.

Example
-------
>>> db.add(cutlass_record(wl, cfg, "h100", latency_s=3.1e-6))
>>> best_config(db, wl, "h100", "sm_90a")
(KernelConfig(api='3x', ...), 3.1e-06)
"""
from __future__ import annotations

import logging

from ..select.database import Database, Record
from .candidates import admissible
from .config import API_2X, API_3X, KernelConfig
from .precision import math_dtype

_LOG = logging.getLogger(__name__)
GENERATOR = "cutlass"
#: Marks 2.x records timed by a launcher that runs the problem it is given. Before it, the 2.x
#: launcher ran the transposed problem through GemmUniversalAdapter (NVIDIA/cutlass#801): such a
#: record timed the wrong GEMM and is ignored.
LAUNCHER_2X = 2


def dtype_key(in_dtype: str, out_dtype: str) -> str:
    """The dtype part of a key, e.g. ``"float16->float32"``."""
    return f"{in_dtype}->{out_dtype}"


def workload_dtype(wl) -> str:
    """The dtype part of ``wl``'s records: the tensor cores' input precision and the output dtype
    (``"tfloat32->float32"`` for a float32 GEMM on TF32 tensor cores)."""
    return dtype_key(math_dtype(wl.dtype), wl.final_dtype)


def builds_for(cfg: KernelConfig, arch: str) -> bool:
    """Whether ``cfg`` compiles for ``arch`` (3.x kernels need an ``a`` arch of compute capability 9.0)."""
    return cfg.api != API_3X or arch == "sm_90a"


def cutlass_record(wl, cfg: KernelConfig, device: str, latency_s: float, source: str = "cutlass profiler") -> Record:
    """The record of one measured configuration."""
    return Record(key=wl.key(), device=device, dtype=workload_dtype(wl), generator=GENERATOR, latency_s=latency_s,
                  config=record_config(cfg), source=source)


def record_config(cfg: KernelConfig) -> dict:
    """What a measurement of ``cfg`` is keyed by: its parameters and, for 2.x, :data:`LAUNCHER_2X`."""
    config = cfg.to_dict()
    if cfg.api == API_2X:
        config["launcher"] = LAUNCHER_2X
    return config


def timed_the_right_problem(rec: Record) -> bool:
    """False for a 2.x record timed before :data:`LAUNCHER_2X` (it measured the transposed problem)."""
    return rec.config.get("api") != API_2X or rec.config.get("launcher") == LAUNCHER_2X


def best_configs(database: Database | None, wl, device: str, arch: str) -> list[tuple[KernelConfig, float]]:
    """Every measured configuration of ``wl`` on ``device`` that builds for ``arch`` and is
    admissible for ``wl``'s epilogue (:func:`~tvm_ext.cutlass.candidates.admissible`), fastest
    first, each with its latency in seconds (the fastest record of each configuration)."""
    if database is None:
        return []
    fastest: dict[KernelConfig, float] = {}
    for rec in database.records(wl.key(), device, workload_dtype(wl)):
        if rec.generator != GENERATOR:
            continue
        if not timed_the_right_problem(rec):
            _LOG.warning("ignoring a CUTLASS 2.x record of %s timed with the transposing launcher; re-run "
                         "`tvm-ext measure` or cutlass tune", rec.key)
            continue
        cfg = KernelConfig.from_dict(rec.config)
        if builds_for(cfg, arch) and admissible(wl, cfg, arch):
            fastest[cfg] = min(rec.latency_s, fastest.get(cfg, rec.latency_s))
    return sorted(fastest.items(), key=lambda item: item[1])


def best_config(database: Database | None, wl, device: str, arch: str) -> tuple[KernelConfig, float] | None:
    """The fastest of :func:`best_configs` with its latency; None without a usable record."""
    usable = best_configs(database, wl, device, arch)
    return usable[0] if usable else None


__all__ = ["GENERATOR", "LAUNCHER_2X", "best_config", "best_configs", "record_config", "timed_the_right_problem", "builds_for", "cutlass_record", "dtype_key", "workload_dtype"]
