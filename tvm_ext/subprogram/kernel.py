"""Designing and building a subprogram's merged kernel (issue 14, item 5).

:func:`design` cuts a fused function into stages (:func:`~tvm_ext.subprogram.stages.default_stages`),
schedules every compute stage with dlight's rules (a GEMM whose epilogue dlight cannot take in
one kernel is split from it), takes the thread shape of the compute stages doing the most work
(a GEMV-like compute stage dlight schedules with other threads runs as a memory stage at that
shape, :func:`_common_shape`), schedules the memory stages to it
(:mod:`tvm_ext.subprogram.uniform`), and sizes the launch: the largest
stage grid, capped at the blocks resident at once (occupancy calculator, with the stages'
largest shared memory and :data:`~tvm_ext.select.analytic.ASSUMED_REGISTERS` registers per
thread, which the launch bound then enforces), and checks that TVM lowers the merged kernel.
:func:`build` rebuilds exactly that from the
plan on the kernel and merges the stages (:func:`~tvm_ext.subprogram.merge.merge_stages`).

Not built (issue 14, item 6): cross-stage optimisation (prefetching the next stage's weights
with ``cp.async``, keeping a stage's output tile in shared memory for the next stage); every
value passed between stages goes through a global workspace.

Example
-------
>>> design_ = design(fused, load_device("h100"), target)
>>> design_.plan.summary()
'subprogram: 6 stages (5 compute), grid 1 x 128 threads, 3 grid barriers'
>>> merged = build(fused, design_.plan, target)
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import tirx

from ..dlight.rules import apply_rules
from ..graph import func_flops
from ..hardware import DeviceSpec, occupancy
from ..select.analytic import ASSUMED_REGISTERS
from ..select.launch import launch_shape, uses_tensor_cores
from ..checks.lowering import lowering_problem
from .merge import MergedKernel, merge_stages, stage_kernels
from .plans import SubprogramPlan
from .stages import StageError, StageSpec, check_cover, default_stages, split_compute, stage_function
from .uniform import ThreadShape, schedule_to_shape, thread_shape


@dataclass(frozen=True)
class ScheduledStage:
    """One stage as the design scheduled it."""

    spec: StageSpec
    func: tirx.PrimFunc
    scheduled: tirx.PrimFunc
    rule: str

    @property
    def grid(self) -> int:
        """Blocks of its kernels (summed over them)."""
        return launch_shape(self.scheduled).grid

    @property
    def shared_bytes(self) -> int:
        """Shared memory per block."""
        return launch_shape(self.scheduled).shared_bytes

    @property
    def tensor_cores(self) -> bool:
        """Whether it computes on tensor cores."""
        return uses_tensor_cores(self.scheduled)


@dataclass(frozen=True)
class Design:
    """A plan with the stages it was made from (for pricing)."""

    plan: SubprogramPlan
    stages: tuple[ScheduledStage, ...]
    merged: MergedKernel


def _schedule_compute(func: tirx.PrimFunc, spec: StageSpec, target: tvm.target.Target,
                      rule: str | None = None) -> ScheduledStage:
    stage = stage_function(func, spec)
    outcome = apply_rules(stage, target, only=rule)
    if outcome.rule in ("none", "Fallback") or launch_shape(outcome.func).kernels != 1:
        raise StageError(f"dlight schedules compute stage {list(spec.statements)} as {outcome.rule}, "
                         "not one GEMM kernel")
    stage_kernels(outcome.func)   # every statement one kernel (dlight may leave an epilogue unbound)
    if rule is not None and outcome.rule != rule:
        raise StageError(f"compute stage {list(spec.statements)}: plan says {rule}, dlight applied {outcome.rule}")
    return ScheduledStage(spec, stage, outcome.func, outcome.rule)


def _compute_stages(func: tirx.PrimFunc, target: tvm.target.Target) -> list[StageSpec | ScheduledStage]:
    out: list[StageSpec | ScheduledStage] = []
    for spec in default_stages(func):
        if spec.kind != "compute":
            out.append(spec)
            continue
        try:
            out.append(_schedule_compute(func, spec, target))
        except StageError:
            if len(spec.statements) == 1:
                raise
            gemm, epilogue = split_compute(spec)
            out += [_schedule_compute(func, gemm, target), epilogue]
    return out


def _memory(func: tirx.PrimFunc, spec: StageSpec, shape: ThreadShape) -> ScheduledStage:
    stage = stage_function(func, spec)
    return ScheduledStage(spec, stage, schedule_to_shape(stage, shape), "uniform")


def _launch(device: DeviceSpec, shape: ThreadShape, stages: list[ScheduledStage]) -> tuple[int, int]:
    """The grid (the largest stage's, capped at the blocks resident at once with
    :data:`ASSUMED_REGISTERS` registers per thread) and the blocks per SM its launch bound asks
    for: only as many as the grid needs resident, ``ceil(grid / SMs)``. Asking for the most that
    fit capped every thread at 32 registers, and a merged kernel of dlight GEMM stages, which use
    116-128, spilled 1.5-2 KB per thread where its grid fitted one block per SM."""
    shared = max(s.shared_bytes for s in stages)
    most = occupancy(device, shape.threads, ASSUMED_REGISTERS, shared).blocks_per_sm
    if most < 1:
        raise StageError(f"a block of {shape.threads} threads and {shared} B shared memory does not fit an SM")
    grid = min(max(s.grid for s in stages), most * device.sm_count)
    return grid, -(-grid // device.sm_count)


def _at_shape(func: tirx.PrimFunc, part: StageSpec | ScheduledStage, shape: ThreadShape) -> ScheduledStage:
    """A stage at ``shape`` threads: a compute stage dlight scheduled so as it is, any other part
    scheduled to ``shape`` as a memory stage."""
    if isinstance(part, ScheduledStage):
        if thread_shape(part.scheduled) == shape:
            return part
        part = StageSpec(part.spec.statements, "memory")
    return _memory(func, part, shape)


def _common_shape(compute: list[ScheduledStage]) -> ThreadShape:
    """The thread shape every stage will run with: that of the compute stages doing the most work.

    A compute stage dlight schedules differently is a GEMV-like contraction (dlight's ``GEMV`` /
    ``Reduction`` rules: memory-bound, a row reduction per output) and becomes a memory stage at
    that shape; a stage dlight schedules as a ``Matmul`` with another shape cannot (its tiles are
    made for its own threads).
    """
    work: dict[ThreadShape, int] = {}
    for s in compute:
        shape = thread_shape(s.scheduled)
        work[shape] = work.get(shape, 0) + func_flops(s.func) + 1
    shape = max(work, key=work.__getitem__)
    odd = sorted({(t.x, t.y) for t in work if t != shape})
    if odd and any(s.rule == "Matmul" and thread_shape(s.scheduled) != shape for s in compute):
        raise StageError(f"compute stages use different thread shapes {sorted([(shape.x, shape.y)] + odd)}")
    return shape


def design(func: tirx.PrimFunc, device: DeviceSpec, target: tvm.target.Target) -> Design:
    """The plan of ``func``'s merged kernel (module docstring).

    Raises
    ------
    StageError
        No compute stage, compute stages with different thread shapes, or a stage that cannot be
        scheduled or merged.
    """
    with target:
        parts = _compute_stages(func, target)
        compute = [p for p in parts if isinstance(p, ScheduledStage)]
        if not compute:
            raise StageError("no compute stage: nothing to merge around")
        shape = _common_shape(compute)
        stages = [_at_shape(func, p, shape) for p in parts]
        compute = [s for s in stages if s.spec.kind == "compute"]
    grid, blocks_per_sm = _launch(device, shape, stages)
    merged = merge_stages(func, [(s.scheduled, s.func) for s in stages], grid, blocks_per_sm)
    problem = lowering_problem(merged.func, "subprogram_check", target)
    if problem is not None:
        raise StageError(f"TVM cannot lower the merged kernel: {problem}")
    plan = SubprogramPlan(tuple(s.spec for s in stages), tuple(s.rule for s in compute), shape, grid,
                          blocks_per_sm, merged.grid_syncs)
    return Design(plan, tuple(stages), merged)


def build(func: tirx.PrimFunc, plan: SubprogramPlan, target: tvm.target.Target) -> MergedKernel:
    """Build exactly ``plan`` on ``func``.

    Raises
    ------
    StageError
        ``func`` does not have the statements the plan names, or a stage no longer schedules as
        the plan says.
    """
    check_cover(func, list(plan.stages))
    rules = iter(plan.rules)
    pairs = []
    with target:
        for spec in plan.stages:
            if spec.kind == "compute":
                stage = _schedule_compute(func, spec, target, next(rules, None))
                if thread_shape(stage.scheduled) != plan.threads:
                    raise StageError(f"compute stage {list(spec.statements)} no longer has the plan's threads")
            else:
                stage = _memory(func, spec, plan.threads)
            pairs.append((stage.scheduled, stage.func))
    return merge_stages(func, pairs, plan.grid, plan.blocks_per_sm)


__all__ = ["Design", "ScheduledStage", "build", "design"]
