"""Measure a model's planned kernels and store the times for the cost model: ``tvm-ext measure``.

The model is built with the one driver (:func:`~tvm_ext.driver.stages.build`), its planned
kernels are timed by a :class:`~tvm_ext.select.runner.Runner` (this machine's GPU, or the GPUs
behind a TVM RPC tracker), and every time becomes a record of the measurement database; the next
build that reads the database (``$TVM_EXT_DATABASE``) prices those kernels as *measured*.

Example
-------
>>> result = measure_model("model.onnx", "tvm_ext/h100", "full", runner=MetaScheduleRunner.rpc("tracker", 9190, "h100"),
...                        database=Database("measurements.jsonl"))
>>> result.added, len(result.outcomes)
(37, 37)
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tvm

from ..errors import TvmExtError
from ..hardware import device_from_target, is_gpu_target, load_device, resolve_target
from ..select.analytic import AnalyticCostModel
from ..select.database import Database
from ..select.runner import MeasureOutcome, MetaScheduleRunner, Runner, measure_jobs, record_outcomes
from .pipeline import load_module
from .stages import build


@dataclass
class MeasureResult:
    """What :func:`measure_model` measured: outcomes per kernel, records added, the device name."""

    device: str
    outcomes: list[MeasureOutcome] = field(default_factory=list)
    added: int = 0

    def rows(self) -> list[list[str]]:
        """Per kernel: name, generator, analytic (modelled) and measured time, or why not measured.

        The analytic time is priced with a stream launch, as the runner launches each kernel (a
        preset that replays CUDA graphs selects with the graph launch cost instead)."""
        model, spec = AnalyticCostModel(), load_device(self.device)
        rows = []
        for out in self.outcomes:
            kernel = out.job.kernel
            measured = f"{out.latency_s * 1e6:.2f} us" if out.latency_s is not None else f"- ({out.error})"
            rows.append([out.job.name, kernel.generator, f"{model.cost(kernel, spec).seconds * 1e6:.2f} us", measured])
        return rows


def local_runner(target: tvm.target.Target) -> Runner:
    """MetaSchedule's local runner when this machine can run ``target``'s code.

    Raises
    ------
    TvmExtError
        A GPU target without a CUDA GPU here (use an RPC tracker instead).
    """
    from ..toolchain import gpu_available

    if is_gpu_target(target) and not gpu_available():
        raise TvmExtError("no CUDA GPU on this machine: measure through a TVM RPC tracker (--rpc HOST:PORT:KEY) "
                          "or run this on the GPU machine")
    return MetaScheduleRunner()


def measure_model(model: Any, target: str | tvm.target.Target, preset: str, *, runner: Runner | None = None,
                  database: Database, shapes: Mapping[str, Sequence[int]] | None = None,
                  fp16: bool = False, bind: Mapping[str, Any] | None = None,
                  source: str | None = None) -> MeasureResult:
    """Build ``model`` with ``preset`` for ``target``, time its planned kernels with ``runner``
    (default: :func:`local_runner`) and add a record per measured kernel to ``database``."""
    tgt = resolve_target(target)
    runner = runner or local_runner(tgt)
    device = device_from_target(tgt).name
    staged = build(load_module(model, shapes=shapes, fp16=fp16, bind=bind), tgt, preset)
    outcomes = runner.measure(measure_jobs(staged), tgt)
    added = record_outcomes(outcomes, database, device, source or runner.name)
    return MeasureResult(device, outcomes, added)


def parse_rpc(text: str) -> tuple[str, int, str]:
    """``"host:9190:h100"`` -> ``("host", 9190, "h100")``.

    Raises
    ------
    TvmExtError
        Not three colon-separated parts with an integer port.
    """
    parts = text.rsplit(":", 2)
    if len(parts) != 3 or not parts[0] or not parts[2] or not parts[1].isdigit():
        raise TvmExtError(f"bad --rpc value {text!r}: expected HOST:PORT:KEY, e.g. tracker.local:9190:h100")
    return parts[0], int(parts[1]), parts[2]


__all__ = ["MeasureResult", "local_runner", "measure_model", "parse_rpc"]
