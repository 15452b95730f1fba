"""Measuring kernels: one :class:`Runner` interface, MetaSchedule's builder and runners behind it.

A measurement turns a built kernel into a :class:`~tvm_ext.select.database.Record` that the
:class:`~tvm_ext.select.measured.MeasuredCostModel` then prefers to the analytic price:

* :func:`measure_jobs` lists the kernels of a build worth measuring: every scheduled PrimFunc
  that carries a plan (so that its record key, :func:`~tvm_ext.select.context.kernel_key`, is
  the key a later selection looks up), with the description the cost model reads;
* a :class:`Runner` times them. :class:`MetaScheduleRunner` compiles each kernel alone with
  MetaSchedule's ``LocalBuilder`` and times it with MetaSchedule's ``LocalRunner`` (this
  machine's device) or ``RPCRunner`` (GPUs behind a TVM RPC tracker: how a user measures on
  many machines); :class:`NullRunner` measures nothing and says why;
* :func:`record_outcomes` writes what was measured to a :class:`~tvm_ext.select.database.Database`.

Library kernels (CUTLASS) are measured by their own profiler (:func:`tvm_ext.cutlass.profiler.tune`),
which writes records of the same database. Whole-model timings of an offline bench bundle
(``bench/``) are model-level and are not per-kernel records.

Example
-------
>>> jobs = measure_jobs(staged_build)
>>> outcomes = MetaScheduleRunner.rpc("tracker.local", 9190, "h100").measure(jobs, staged_build.target)
>>> record_outcomes(outcomes, Database("measurements.jsonl"), device="h100", source="rpc")
"""
from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

import tvm
from tvm import tirx

from ..tir.script_import import register_all_tensor_intrinsics
from .attrs import PLAN_ATTR
from .database import Database
from .describe import KernelDescription, describe_scheduled
from .measured import measurement_record

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..driver.stages import StagedBuild

logger = logging.getLogger(__name__)

#: Seconds one kernel may take to build in a builder worker (a fresh worker first imports TVM).
BUILD_TIMEOUT_S = 180


@dataclass(frozen=True)
class MeasureJob:
    """One kernel to time: its scheduled PrimFunc and what the cost model knows of it."""

    name: str
    func: tirx.PrimFunc
    kernel: KernelDescription


@dataclass(frozen=True)
class MeasureOutcome:
    """The time of one job (median of the runner's repeats), or why there is none."""

    job: MeasureJob
    latency_s: float | None = None
    error: str | None = None


class Runner(Protocol):
    """What every runner provides."""

    name: str

    def measure(self, jobs: Sequence[MeasureJob], target: tvm.target.Target) -> list[MeasureOutcome]:
        """Time every job built for ``target``; one outcome per job, in order."""


class NullRunner:
    """Measures nothing: every outcome says ``reason`` (a build without a GPU or RPC tracker)."""

    name = "none"

    def __init__(self, reason: str = "no runner: no GPU on this machine and no RPC tracker given"):
        self.reason = reason

    def measure(self, jobs: Sequence[MeasureJob], target: tvm.target.Target) -> list[MeasureOutcome]:  # noqa: D102
        return [MeasureOutcome(job, error=self.reason) for job in jobs]


class MetaScheduleRunner:
    """MetaSchedule's ``LocalBuilder`` plus one of its runners (see the module docstring).

    Parameters
    ----------
    runner : tvm.s_tir.meta_schedule.runner.Runner, optional
        Default: ``LocalRunner`` timing on this machine.
    builder : tvm.s_tir.meta_schedule.builder.Builder, optional
        Default: ``LocalBuilder`` with two workers.
    name : str
        How reports and records name the runner (``local``, ``rpc``).
    """

    def __init__(self, runner=None, builder=None, name: str = "local"):
        from tvm.s_tir import meta_schedule as ms

        self.runner = runner or ms.runner.LocalRunner(evaluator_config=evaluator())
        self.builder = builder or ms.builder.LocalBuilder(
            max_workers=2, timeout_sec=BUILD_TIMEOUT_S, initializer=register_all_tensor_intrinsics)
        self.name = name

    @classmethod
    def rpc(cls, host: str, port: int, key: str, *, session_timeout_s: int = 60,
            builder=None) -> "MetaScheduleRunner":
        """Time on the devices a TVM RPC tracker at ``host:port`` serves under ``key``."""
        from tvm.s_tir import meta_schedule as ms

        config = ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=key,
                                     session_timeout_sec=session_timeout_s)
        return cls(ms.runner.RPCRunner(rpc_config=config, evaluator_config=evaluator()), builder, name="rpc")

    def measure(self, jobs: Sequence[MeasureJob], target: tvm.target.Target) -> list[MeasureOutcome]:
        """Build every job alone for ``target``, then time the ones that built."""
        from tvm.s_tir import meta_schedule as ms

        if not jobs:
            return []
        built = self.builder.build([ms.builder.BuilderInput(tvm.IRModule({"main": _entry(j.func)}), target)
                                    for j in jobs])
        outcomes: dict[int, MeasureOutcome] = {}
        inputs, where = [], []
        for i, (job, result) in enumerate(zip(jobs, built)):
            if result.error_msg:
                outcomes[i] = MeasureOutcome(job, error=f"build failed: {result.error_msg.splitlines()[-1][:300]}")
                continue
            inputs.append(ms.runner.RunnerInput(result.artifact_path, device_type(target),
                                                ms.arg_info.ArgInfo.from_prim_func(job.func)))
            where.append(i)
        for i, future in zip(where, self.runner.run(inputs)):
            result = future.result()
            if result.error_msg:
                outcomes[i] = MeasureOutcome(jobs[i], error=f"run failed: {result.error_msg.splitlines()[-1][:300]}")
            else:
                secs = [float(s) for s in result.run_secs]
                outcomes[i] = MeasureOutcome(jobs[i], latency_s=statistics.median(secs))
        return [outcomes[i] for i in range(len(jobs))]


def evaluator():
    """Repeats of one measurement: 3 runs of at least 50 ms each, median kept."""
    from tvm.s_tir import meta_schedule as ms

    return ms.runner.EvaluatorConfig(number=3, repeat=3, min_repeat_ms=50, enable_cpu_cache_flush=False)


def device_type(target: tvm.target.Target) -> str:
    """The runtime device name of ``target``'s kind (``llvm`` code runs on ``cpu``)."""
    kind = str(target.kind.name)
    return "cpu" if kind in ("llvm", "c") else kind


def _entry(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` as the module's entry ``main`` (MetaSchedule builds and looks up ``main``)."""
    return func.with_attr("global_symbol", "main")


def measure_jobs(build: "StagedBuild") -> list[MeasureJob]:
    """The planned kernels of ``build`` (PrimFuncs with a plan, as scheduled), each once."""
    jobs = []
    graph_funcs = {gv.name_hint: f for gv, f in build.graph.functions_items()}
    for gv, func in build.scheduled.functions_items():
        if not isinstance(func, tirx.PrimFunc) or func.attrs is None or PLAN_ATTR not in func.attrs:
            continue
        name = gv.name_hint
        kernel = describe_scheduled(graph_funcs.get(name, func), func)
        if kernel.key:
            jobs.append(MeasureJob(name, func, kernel))
    return jobs


def record_outcomes(outcomes: Sequence[MeasureOutcome], database: Database, device: str, source: str) -> int:
    """Add a record per measured outcome to ``database``; the number added."""
    added = 0
    for out in outcomes:
        if out.latency_s is None:
            logger.info("%s not measured: %s", out.job.name, out.error)
            continue
        database.add(measurement_record(out.job.kernel, device, out.latency_s, source))
        added += 1
    return added


__all__ = ["BUILD_TIMEOUT_S", "MeasureJob", "MeasureOutcome", "MetaScheduleRunner", "NullRunner", "Runner", "device_type", "evaluator",
           "measure_jobs", "record_outcomes"]
