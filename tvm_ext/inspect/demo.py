"""The end-to-end demo: bundled BERT layer -> CUDA with ``baseline`` and a preset -> checked -> compared.

Steps of :func:`run_demo` (no GPU needed), for ``baseline`` (TVM's own pipeline) and the preset
(by default :data:`~tvm_ext.driver.presets.DEFAULT_PRESET`), side by side:

1. compile the bundled model (:data:`tvm_ext.models.BUNDLED_FILE`, a BERT encoder layer) for
   the CUDA target and build the report (:func:`tvm_ext.inspect.inspect`);
2. compile the generated CUDA source with nvcc for the target's arch, when nvcc exists;
3. check the graph-level result on the CPU against onnxruntime (:func:`tvm_ext.testing.check_model`);
4. speed: the measured latency when a CUDA GPU is present; otherwise the *modelled* time (the
   cost model's) and the measured latency of the checked CPU (llvm) build.

The output is the preset's full report, then one table of both (launches, distinct kernels,
modelled traffic, modelled time, compile time) and each one's checks. ``tvm-ext demo`` and
``scripts/run_demo.py`` print :meth:`DemoResult.render`.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from ..driver.presets import DEFAULT_PRESET
from ..hardware import DEFAULT_TARGET
from ..toolchain import NvccResult, compile_cuda_source, gpu_available, nvcc_available
from .compare import Comparison
from .render import human_seconds
from .report import Report, inspect

#: Steps reported to the ``progress`` callback of :func:`run_demo`, in order (once per preset).
DEMO_STEPS = ("compile for CUDA + report", "nvcc kernel check", "CPU check vs onnxruntime", "latency")


@dataclass
class PresetRun:
    """What the demo found for one preset; ``ok`` is the numerical check's verdict."""

    report: Report
    nvcc: NvccResult | None
    nvcc_note: str
    check: Any  # tvm_ext.testing.CheckResult
    gpu_latency_s: float | None
    cpu_latency_s: float | None

    @property
    def ok(self) -> bool:
        """Whether the CPU check against onnxruntime passed."""
        return bool(self.check.ok)

    def lines(self) -> list[str]:
        """Checks and speed of this preset, each number labelled measured / modelled."""
        name = self.report.preset
        out = [f"[{name}] nvcc kernel check: {self.nvcc_note}",
               f"[{name}] CPU check vs onnxruntime: {self.check.message()}"]
        if self.gpu_latency_s is not None:
            out.append(f"[{name}] latency on {self.report.device} GPU (measured): {human_seconds(self.gpu_latency_s)}")
        else:
            out.append(f"[{name}] no CUDA GPU here: latency on {self.report.device} modelled, not measured: "
                       f"{human_seconds(self.report.modelled_time_s)}")
        if self.cpu_latency_s is not None:
            out.append(f"[{name}] latency of the checked CPU (llvm) build (measured on this CPU): "
                       f"{human_seconds(self.cpu_latency_s)}")
        return out

    def to_json(self) -> dict[str, Any]:
        """JSON-serialisable form (the report plus check, nvcc and speed)."""
        return {
            "preset": self.report.preset,
            "report": self.report.to_json(),
            "nvcc": None if self.nvcc is None else {"arch": self.nvcc.arch, "seconds": round(self.nvcc.seconds, 3),
                                                     "binary_bytes": self.nvcc.binary_bytes},
            "nvcc_note": self.nvcc_note,
            "check": {"ok": self.ok, "max_rel_err": float(self.check.max_rel_err),
                      "max_abs_err": float(self.check.max_abs_err), "rtol": self.check.rtol, "atol": self.check.atol},
            "gpu_latency_s_measured": self.gpu_latency_s,
            "modelled_time_s": self.report.modelled_time_s,
            "roofline_bound_s": self.report.roofline_bound_s,
            "cpu_latency_s_measured": self.cpu_latency_s,
            "ok": self.ok,
        }


@dataclass
class DemoResult:
    """The runs of the demo, ``baseline`` first; ``ok`` when every CPU check passed."""

    runs: list[PresetRun] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every preset's CPU check passed."""
        return all(r.ok for r in self.runs)

    def comparison(self) -> Comparison:
        """The runs' reports side by side."""
        return Comparison(self.runs[-1].report.model, [r.report for r in self.runs])

    def render(self) -> str:
        """The demo's text output."""
        parts = [self.runs[-1].report.to_table(), "", self.comparison().to_table(), ""]
        for run in self.runs:
            parts.extend(run.lines())
        parts.append(f"demo: {'PASS' if self.ok else 'FAIL'}")
        return "\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        """JSON-serialisable form: every run and the comparison."""
        return {"runs": [r.to_json() for r in self.runs], "comparison": self.comparison().to_json(), "ok": self.ok}


def measure_latency(executable: tvm.runtime.Executable, inputs: Mapping[str, np.ndarray], dev: tvm.runtime.Device,
                    *, number: int = 10, repeat: int = 3) -> float:
    """Mean seconds of one call of ``main`` on ``dev`` (inputs in ``main``'s parameter order)."""
    from tvm import relax

    vm = relax.VirtualMachine(executable, dev)
    args = [tvm.runtime.tensor(np.ascontiguousarray(v), dev) for v in inputs.values()]
    vm["main"](*args)  # warm up (and, on a GPU, load the kernels)
    return float(vm.time_evaluator("main", dev, number=number, repeat=repeat)(*args).mean)


def _cpu_latency(mod: tvm.IRModule, preset: str, inputs: Mapping[str, np.ndarray]) -> float:
    from ..testing.oracle import build_cpu

    vm = build_cpu(mod, preset)
    args = [tvm.runtime.tensor(np.ascontiguousarray(v)) for v in inputs.values()]
    vm["main"](*args)
    return float(vm.time_evaluator("main", tvm.cpu(), number=1, repeat=3)(*args).mean)


def run_demo(target: str = DEFAULT_TARGET, preset: str = DEFAULT_PRESET, *, model: str | Path | None = None,
             progress: Callable[[str], None] | None = None, measure_cpu: bool = True) -> DemoResult:
    """Run the demo (see the module docstring) for ``baseline`` and ``preset``.

    Parameters
    ----------
    target : str
        GPU target, e.g. ``"tvm_ext/h100"``.
    preset : str
        The preset shown beside ``baseline`` (``baseline`` itself: one run).
    model : path, optional
        ONNX model; default the bundled BERT layer.
    progress : callable, optional
        Called with ``"<preset>: <step>"`` (steps of :data:`DEMO_STEPS`) before each starts.
    measure_cpu : bool
        Measure the CPU build's latency when there is no GPU.
    """
    from ..frontend import from_onnx
    from ..models import BUNDLED_FILE

    path = Path(model) if model is not None else BUNDLED_FILE
    mod = from_onnx(path)
    presets = ["baseline"] if preset == "baseline" else ["baseline", preset]
    return DemoResult([_run_preset(mod, path, target, p, progress, measure_cpu) for p in presets])


def _run_preset(mod: tvm.IRModule, path: Path, target: str, preset: str, progress, measure_cpu: bool) -> PresetRun:
    from ..frontend import random_inputs
    from ..testing.oracle import check_model

    def step(name: str) -> None:
        if progress is not None:
            progress(f"{preset}: {name}")

    step(DEMO_STEPS[0])
    report = inspect(mod, target, preset, keep_source=True)
    report.model = path.name

    step(DEMO_STEPS[1])
    nvcc_result = None
    if nvcc_available():
        nvcc_result = compile_cuda_source(report.cuda_source or "", report.build.target)
        note = (f"ok: {report.distinct_kernels} kernels compiled for {nvcc_result.arch} "
                f"in {nvcc_result.seconds:.2f} s")
    else:
        note = "skipped (nvcc not found)"

    step(DEMO_STEPS[2])
    check = check_model(str(path), preset)

    step(DEMO_STEPS[3])
    inputs = random_inputs(mod, seed=0)
    gpu_s = cpu_s = None
    if gpu_available():
        gpu_s = measure_latency(report.executable, inputs, tvm.cuda(0))
    elif measure_cpu:
        cpu_s = _cpu_latency(mod, preset, inputs)
    return PresetRun(report=report, nvcc=nvcc_result, nvcc_note=note, check=check, gpu_latency_s=gpu_s,
                     cpu_latency_s=cpu_s)


__all__ = ["DEMO_STEPS", "DemoResult", "PresetRun", "measure_latency", "run_demo"]
