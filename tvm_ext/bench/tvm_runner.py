"""Measure the TVM builds of one bundled model with the TVM runtime alone.

For each build (``DIR/lib/<model>__<system>.so``): load it into a
``tvm.runtime.vm.VirtualMachine``, turn the regenerated weights into the parameters of
``main`` (through ``main_transform_params`` when the build lifted weight-only work into
it), check the numerics on the two check input sets (outputs of the first poisoned with
NaN before the second runs), then time ``main`` over the rotating timing sets.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BenchError
from .manifest import BuildEntry, ModelEntry
from .model_data import ModelData
from .numerics import OutputCheck, poison_value, summarize
from .timing import measure
from .weights import checked_weights

log = logging.getLogger(__name__)


@dataclass
class Measurement:
    """What one system of one model produced: numerics, timings (both rounds), extras."""

    system: str
    samples_ms: list[float] = field(default_factory=list)
    repeat_samples_ms: list[float] = field(default_factory=list)
    numerics: dict = field(default_factory=dict)
    kernels: int | None = None
    error: str | None = None
    extra: dict = field(default_factory=dict)


def flatten(value: Any) -> list:
    """VM results (a tensor or nested tuples of tensors) as a flat list, in order."""
    if hasattr(value, "numpy") and hasattr(value, "shape"):
        return [value]
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return [t for item in value for t in flatten(item)]
    raise BenchError(f"unexpected VM result of type {type(value).__name__}")


def upload_weights(tvm: Any, entry: ModelEntry, dev: Any, verify: bool = True) -> list:
    """Regenerate the weights of ``entry`` (or read them from the run's cache), check their digest,
    and copy them to ``dev``."""
    start = time.perf_counter()
    arrays = checked_weights(entry.weights, entry.weights_seed, entry.weights_digest if verify else None, entry.name)
    tensors = [tvm.runtime.tensor(array, dev) for array in arrays]
    log.info("%s: %d weights (%.1f MB) ready in %.1f s", entry.name, len(tensors),
             entry.weight_bytes / 1e6, time.perf_counter() - start)
    return tensors


class TvmModel:
    """One loaded build: the VM, the parameters of ``main`` and its device input sets."""

    def __init__(self, tvm: Any, bundle: Path, entry: ModelEntry, build: BuildEntry, dev: Any,
                 raw_weights: list, data: ModelData):
        if build.library is None:
            raise BenchError(f"{entry.name}/{build.system}: the build has no library")
        path = bundle / build.library
        if not path.is_file():
            raise BenchError(f"{entry.name}/{build.system}: library {path} is missing")
        self.tvm, self.dev, self.entry, self.data = tvm, dev, entry, data
        self.vm = tvm.runtime.vm.VirtualMachine(tvm.runtime.load_module(str(path)), dev)
        if entry.transform_params:
            self.params = list(self.vm["main_transform_params"](raw_weights))
        else:
            self.params = list(raw_weights)
        self.main = self.vm["main"]
        self.timing_args = [self._args(s) for s in data.timing_inputs]

    def _args(self, arrays: dict[str, np.ndarray]) -> list:
        return [self.tvm.runtime.tensor(arrays[s.name], self.dev) for s in self.entry.inputs] + self.params

    def check_numerics(self) -> list[OutputCheck]:
        """Run every check set (poisoning the previous outputs first) and compare with the reference."""
        checks: list[OutputCheck] = []
        previous: list = []
        for pos, arrays in enumerate(self.data.check_inputs):
            for t in previous:  # an element the next run does not write stays NaN
                t.copyfrom(np.full(tuple(t.shape), poison_value(str(t.dtype)), dtype=str(t.dtype)))
            outs = flatten(self.main(*self._args(arrays)))
            checks += self.data.check(pos, [t.numpy() for t in outs])
            previous = outs
        return checks

    def call(self, k: int) -> Any:
        """Run ``main`` on timing set ``k``."""
        return self.main(*self.timing_args[k])


def measure_builds(tvm: Any, bundle: Path, entry: ModelEntry, dev: Any, data: ModelData, *, warmup: int,
                   runs: int, make_timer: Callable, repeat: bool = True,
                   systems: set[str] | None = None) -> list[Measurement]:
    """Check and time every successful build of ``entry`` (each timed twice when ``repeat``).

    A failing build gives a :class:`Measurement` with ``error`` set; the others go on.
    """
    builds = [b for b in entry.builds if systems is None or b.system in systems]
    results = {b.system: Measurement(b.system, kernels=b.kernels) for b in builds}
    try:
        raw = upload_weights(tvm, entry, dev) if builds else []
    except BenchError as err:  # wrong weights: no numbers for any build of this model
        for m in results.values():
            m.error = str(err)
        return list(results.values())
    loaded: dict[str, TvmModel] = {}
    for build in builds:
        m = results[build.system]
        if build.status != "ok":
            m.error = f"build failed: {build.error}"
            continue
        try:
            model = TvmModel(tvm, bundle, entry, build, dev, raw, data)
            m.numerics = summarize(model.check_numerics(), entry.dtype) if data.references else {}
            m.samples_ms = measure(model.call, len(model.timing_args), warmup, runs, make_timer)
            loaded[build.system] = model
        except (BenchError, RuntimeError, ValueError, TypeError) as err:  # TVM raises RuntimeError/ValueError
            m.error = f"{type(err).__name__}: {' '.join(str(err).split())[:500]}"
            log.warning("%s/%s failed: %s", entry.name, build.system, m.error)
    if repeat:  # the same versions timed again, after the others: the spread is the noise
        for system, model in loaded.items():
            results[system].repeat_samples_ms = measure(model.call, len(model.timing_args), warmup, runs,
                                                        make_timer)
    return [results[b.system] for b in builds]


__all__ = ["Measurement", "TvmModel", "flatten", "measure_builds", "upload_weights"]
