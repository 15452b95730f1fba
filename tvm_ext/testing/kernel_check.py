"""The kernel check of a preset's planned kernels: nvcc compiles them, and thread-serialized on the
CPU they compute what their unscheduled functions compute (no GPU needed).

For one module and target, the preset's graph and schedule stages run; every PrimFunc whose plan
came from ``generator`` is code-generated (TIR pipeline ``"tvm_ext"``) and the CUDA compiled with
nvcc for the target's arch; each is also run with its threads serialized against its unscheduled
form (:mod:`tvm_ext.checks.thread_serial`). A generator whose kernels have stages (merged
subprogram kernels) names their functions with ``stage_functions(func, plan)``: each stage is
then recomputed from the kernel's own intermediates
(:func:`~tvm_ext.checks.thread_serial.compare_stages`). A generator whose kernels use
intrinsics the CPU cannot run (tensor-core stages) gives their CPU form with
``cpu_schedule(func, plan)``, which is checked instead. A planned kernel that fell back to
dlight, or a device kernel with a grid barrier that is not marked for cooperative launch, is a
failure of the check. ``scripts/stitch_kernel_check.py`` runs it over the seed suite and the
shape variants (:data:`tvm_ext.models.VARIANTS`); a test runs it over the variants.

Example
-------
>>> result = check_planned_kernels(mod, tvm.target.Target("tvm_ext/h100"))
>>> result.ok, result.kernels, result.kinds
(True, 3, ['stitched', 'stitched+gemm_prologue'])
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import tvm

from ..checks.lowered import device_kernels
from ..checks.thread_serial import call_inputs, compare_scheduled, compare_stages
from ..driver import preset_passes
from ..driver.presets import Preset, get_preset
from ..errors import TVM_ERRORS
from ..select.attrs import planned_by
from ..select.generator import get_generator
from ..select.plan import plan_of
from ..tir import COOPERATIVE_TAG, PIPELINE_NAME, has_grid_sync, launch_params
from ..toolchain import compile_cuda_source


@dataclass
class KernelCheck:
    """What :func:`check_planned_kernels` found for one module and target.

    Attributes
    ----------
    kernels : int
        Planned kernels that were built from their plans.
    rules : dict
        Kernel -> its schedule rule (``"stitched"``, ``"stitched+grid_sync"``, ...).
    fallbacks : dict
        Planned kernels that fell back to dlight, with the reason.
    arch : str
        The arch nvcc compiled for ('' when there was nothing to compile).
    cpu_mismatch : list of str
        Kernels whose thread-serialized run differs from their unscheduled function.
    cpu_max_abs_err : float
        Largest absolute difference seen in the CPU comparison.
    uncooperative : list of str
        Device kernels with a grid barrier that the TIR pipeline did not mark for cooperative
        launch (launched normally, their barrier could deadlock).
    cpu_unchecked : dict
        Kernels TVM cannot build for the CPU (tensor-core stages), with the reason: compiled by
        nvcc, numerics unverified here.
    """

    kernels: int = 0
    rules: dict[str, str] = field(default_factory=dict)
    fallbacks: dict[str, str] = field(default_factory=dict)
    arch: str = ""
    nvcc_seconds: float = 0.0
    cpu_mismatch: list[str] = field(default_factory=list)
    cpu_max_abs_err: float = 0.0
    uncooperative: list[str] = field(default_factory=list)
    cpu_unchecked: dict[str, str] = field(default_factory=dict)

    @property
    def kinds(self) -> list[str]:
        """The distinct schedule rules of the built kernels."""
        return sorted(set(self.rules.values()))

    @property
    def ok(self) -> bool:
        """No fallback, no CPU mismatch, every grid barrier cooperatively launched (nvcc failures raise)."""
        return not self.fallbacks and not self.cpu_mismatch and not self.uncooperative

    def to_json(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {"kernels": self.kernels, "kinds": self.kinds, "rules": self.rules, "fallbacks": self.fallbacks, "arch": self.arch,
                "nvcc_seconds": round(self.nvcc_seconds, 1), "cpu_mismatch": self.cpu_mismatch,
                "cpu_max_abs_err": self.cpu_max_abs_err, "uncooperative": self.uncooperative, "cpu_unchecked": self.cpu_unchecked, "ok": self.ok}


def every_candidate(preset: str | Preset) -> Preset:
    """``preset`` with priority selection and no whole-graph rewrites: candidates are taken in the
    order its generators propose them wherever they do not overlap, so every candidate of its first
    generator is built, whatever the cost model would prefer (for checking a schedule builder)."""
    return dataclasses.replace(get_preset(preset), selector="priority", horizontal=False, fission=False)


def check_planned_kernels(mod: tvm.IRModule, target: tvm.target.Target, *, preset: str | Preset = "stitch",
                          generator: str = "stitch", cpu: bool = True) -> KernelCheck:
    """Run the kernel check (see the module docstring) on ``mod`` for ``target``.

    Raises
    ------
    KernelCompileError
        nvcc rejects the generated CUDA.
    """
    with target:
        stages = preset_passes(preset, target)
        fused = tvm.transform.Sequential(stages.graph)(mod)
        scheduled = tvm.transform.Sequential(stages.schedule)(fused)
    rules = planned_by(scheduled, generator)
    built = {name: scheduled[name].with_attr("global_symbol", name)
             for name, rule in rules.items() if not rule.startswith("fallback")}
    out = KernelCheck(kernels=len(built), rules={n: rules[n] for n in built},
                      fallbacks={n: r for n, r in rules.items() if r.startswith("fallback")})
    if built:
        with target:
            lib = tvm.tirx.build(tvm.IRModule(built), target=target, pipeline=PIPELINE_NAME)
        result = compile_cuda_source(lib.imports[0].inspect_source(), target)
        out.arch, out.nvcc_seconds = result.arch, result.seconds
        out.uncooperative = sorted(name for name, kernel in device_kernels(tvm.IRModule(built), target).items()
                                   if has_grid_sync(kernel) and COOPERATIVE_TAG not in launch_params(kernel))
    if cpu:
        checks = {}
        stage_functions = getattr(get_generator(generator), "stage_functions", None)
        cpu_schedule = getattr(get_generator(generator), "cpu_schedule", None)
        for name in built:
            try:
                plan = plan_of(fused[name])
                inputs = call_inputs(fused, name)
                if stage_functions is not None and plan is not None:   # a multi-stage kernel: stage by stage
                    parts = stage_functions(fused[name], plan)
                    checks[name] = compare_stages(fused[name], scheduled[name], parts, inputs=inputs)
                else:
                    kernel = scheduled[name] if cpu_schedule is None or plan is None else cpu_schedule(fused[name], plan)
                    checks[name] = compare_scheduled(fused[name], kernel, inputs=inputs)
            except TVM_ERRORS as err:   # e.g. tensor-core (WMMA) stages, which the CPU cannot run
                out.cpu_unchecked[name] = (str(err).strip().splitlines() or [""])[-1][:200]
        out.cpu_mismatch = sorted(name for name, c in checks.items() if not c.ok)
        out.cpu_max_abs_err = max((c.max_abs_err for c in checks.values()), default=0.0)
    return out


__all__ = ["KernelCheck", "check_planned_kernels", "every_candidate"]
