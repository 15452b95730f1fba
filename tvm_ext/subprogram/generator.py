"""The subprogram generator (SOUFFLE): merged multi-stage kernels as candidates.

Candidates come from the resource-bounded partition (:func:`~tvm_ext.subprogram.partition.partition`
with dlight's launch shapes): each subprogram is cut where the thread shape of its
compute-intensive nodes changes (every stage of a merged kernel runs with the same threads,
:mod:`tvm_ext.subprogram.uniform`), and every piece with a compute node and at least two nodes
is designed as one merged kernel (:func:`~tvm_ext.subprogram.kernel.design`, once per
structural signature: BERT's twelve layers are designed once). A piece that cannot be merged is
dropped and recorded; its nodes stay with the other generators.

Each candidate carries its stages (:class:`~tvm_ext.select.candidate.StageWork`), so the cost
model prices a merged kernel as one launch, its stages one after another and its grid barriers:
the selector picks it only where that is cheaper than the kernels it replaces.

Example
-------
>>> cands = SubprogramGenerator().candidates(ctx)
>>> cands[0].plan.summary()
'subprogram: 9 stages (4 compute), grid 264 x 512 threads, 8 grid barriers'
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

import tvm
from tvm import tirx

from ..errors import TVM_ERRORS
from ..hardware import DeviceSpec
from ..select.budget import BudgetMeter
from ..select.candidate import Candidate, CodePath, LaunchShape, StageWork, boundary_bytes, dominant_dtype
from ..select.context import SelectionContext
from ..select.describe import as_built_note, executed_ratios, scaled_stages
from ..select.emit import EmitError
from ..select.generator import ScheduledKernel, ScheduleRefused, register_generator
from .kernel import Design, build, design
from .partition import Subprogram, dlight_schedules, dlight_shapes, partition
from .plans import SubprogramPlan
from .stages import StageError, is_gemm_like, stage_function, statement_block, statements
from .te_graph import TEGraph
from .uniform import ThreadShape, thread_shape

logger = logging.getLogger(__name__)


def is_gemm_node(func: tirx.PrimFunc) -> bool:
    """Whether a node's PrimFunc holds a GEMM-like block (a compute stage of a merged kernel)."""
    try:
        return any(is_gemm_like(statement_block(s)) for s in statements(func))
    except StageError:
        return False


def _thread_shapes(schedules: dict[int, tirx.PrimFunc], nodes) -> dict[int, ThreadShape | None]:
    """The thread shape of each of ``nodes`` in its dlight schedule (None: not one (x, y) shape)."""
    out: dict[int, ThreadShape | None] = {}
    for i in nodes:
        try:
            out[i] = thread_shape(schedules[i])
        except StageError:
            out[i] = None
    return out


def pieces(part: Subprogram, threads: dict[int, ThreadShape | None]) -> list[tuple[int, ...]]:
    """``part`` cut before every compute node whose thread shape differs from the piece's so far
    (a compute node without one shape is a cut on both sides)."""
    out: list[list[int]] = [[]]
    current: ThreadShape | None = None
    for n in part.nodes:
        if n in threads:
            shape = threads[n]
            if shape is None or (current is not None and shape != current):
                out.append([])
            current = shape
            if shape is None:
                out[-1].append(n)
                out.append([])
                continue
        out[-1].append(n)
    return [tuple(p) for p in out if p]


def _design_key(ctx: SelectionContext, members: tuple[int, ...]) -> tuple:
    """The build-wide memo key of a piece's design (by structure)."""
    return "subprogram", ctx.signature(members)


def _stage_nodes(ctx: SelectionContext, members: tuple[int, ...], plan: SubprogramPlan) -> list[list[int]]:
    """The members behind each stage (``FuseTIR`` writes the members' statements in binding order)."""
    owner: list[int] = []
    for n in ctx.in_binding_order(members):
        owner += [n] * len(statements(ctx.graph.nodes[n].func))
    stages: list[list[int]] = []
    for spec in plan.stages:
        if max(spec.statements) >= len(owner):
            raise StageError("the fused function has more statements than its members")
        stages.append(list(dict.fromkeys(owner[i] for i in spec.statements)))
    return stages


def _stage_work(ctx: SelectionContext, nodes: list[int], made: Design, k: int) -> StageWork:
    stage = made.stages[k]
    path = CodePath.WMMA if stage.tensor_cores else CodePath.SIMT
    moved = boundary_bytes(ctx.graph, nodes)
    return StageWork(flops=int(sum(ctx.graph.nodes[n].flops for n in nodes)), global_bytes=moved,
                     launch=LaunchShape(grid=stage.grid, threads=made.plan.threads.threads,
                                        shared_bytes=stage.shared_bytes),
                     code_path=path, dtype=dominant_dtype(ctx.graph, nodes))


#: Planning-budget units of a tensor-core stage, in statements (:mod:`tvm_ext.select.budget`: a
#: piece designed costs its statements and this per tensor-core stage). *Measured*
#: (``scripts/planning_units.py``, records in ``bench/planning_units.jsonl``): least
#: squares on the seconds of 84 pieces the ``subprogram`` preset designed on 6 seed models
#: (YOLOv5s, Swin-T, LSTM, ConvNeXt-T, BERT-base s128, MobileNet-V2; fp16, this project's 2-core
#: machine, one build at a time): 13.4 ms a statement, 241 ms a tensor-core stage (dlight's
#: tensor-core rules). Validated on 99 pieces of 5 others (DETR-R50, NAFNet, Segformer-B0,
#: EfficientNet-B0, ResNet-50; their own fit: 16.0): 8.6-17.5 ms a unit per model. The node count
#: it replaces priced DETR-R50's 195-node piece (13 s) at 195 units, its 7-node pieces (0.2 s) at 7.
TENSOR_CORE_STAGE_UNITS = 18


def piece_units(statements: int, tensor_core_stages: int) -> float:
    """The planning-budget charge of designing one piece (:data:`TENSOR_CORE_STAGE_UNITS`)."""
    return float(statements + TENSOR_CORE_STAGE_UNITS * tensor_core_stages)


class SubprogramGenerator:
    """SOUFFLE's merged kernels as candidates (see the module docstring)."""

    name = "subprogram"
    kernel_kind = "tir"
    #: Lower each merged kernel alone in the schedule stage; one TVM rejects runs as dlight kernels.
    verify_lowering = True

    def prepare_passes(self, target: tvm.target.Target) -> list:  # noqa: D102 - protocol
        return []

    def plan_from_json(self, data: dict[str, Any]) -> SubprogramPlan:  # noqa: D102 - protocol
        return SubprogramPlan.from_json(data)

    def candidates(self, ctx: SelectionContext) -> list[Candidate]:  # noqa: D102 - protocol
        teg = TEGraph(ctx.graph)
        funcs = {i: ctx.graph.nodes[i].func for i in teg.order}
        gemms = [i for i in teg.order if funcs[i] is not None and is_gemm_node(funcs[i])]
        compute = [i for i in teg.order if teg.compute_intensive(i)]
        schedules = dlight_schedules(teg, ctx.target, dict.fromkeys(gemms + compute))
        threads = _thread_shapes(schedules, gemms)
        out = []
        meter = ctx.meter(self.name)        # in statements designed (see TENSOR_CORE_STAGE_UNITS)
        asked = designed = 0
        for part in partition(teg, ctx.device, dlight_shapes(teg, ctx.target, schedules)):
            if part.external:
                continue
            for members in pieces(part, threads):
                if len(members) < 2 or not any(threads.get(n) for n in members):
                    continue
                asked += 1
                if meter.exhausted and not ctx.has_shared(_design_key(ctx, members)):
                    continue
                designed += 1
                cand = self._candidate(ctx, members, meter)
                if cand is not None:
                    out.append(cand)
        if designed < asked:
            ctx.notes.append(meter.note(designed, asked, "pieces"))
            logger.warning(ctx.notes[-1])
        return out

    def _candidate(self, ctx: SelectionContext, members: tuple[int, ...], meter: BudgetMeter) -> Candidate | None:
        def make() -> Design | str:
            fused = ctx.fused_function(members)
            meter.spend(piece_units(len(statements(fused)), 0))     # charged if the design fails too
            try:
                made = design(fused, ctx.device, ctx.target)
            except (StageError, EmitError) as err:
                return str(err)
            except TVM_ERRORS as err:
                return f"TVM refused a stage: {str(err).splitlines()[0][:200]}"
            meter.spend(piece_units(0, sum(1 for stage in made.stages if stage.tensor_cores)))
            return made

        made = ctx.shared_memo(_design_key(ctx, members), make)     # by structure, build-wide
        if isinstance(made, str):
            ctx.drop(self.name, members, made)
            logger.info("subprogram piece %s not merged: %s", list(members), made)
            return None
        try:
            stage_nodes = _stage_nodes(ctx, members, made.plan)
        except StageError as err:
            ctx.drop(self.name, members, str(err))
            return None
        planned = tuple(_stage_work(ctx, nodes, made, k) for k, nodes in enumerate(stage_nodes))
        plan = dataclasses.replace(made.plan, work=planned)
        # priced from what the merged kernel executes, spread over its stages, as the report
        # prices the built kernel (describe_scheduled): a padded GEMM stage, a softmax's doubled exp
        flops_ratio, loads_ratio = ctx.shared_memo(
            ("subprogram-executed", _design_key(ctx, members)),
            lambda: executed_ratios(ctx.fused_function(members), made.merged.func))
        stages = scaled_stages(planned, flops_ratio, loads_ratio)
        tensor = any(s.code_path == CodePath.WMMA for s in stages)
        launch = LaunchShape(grid=plan.grid, threads=plan.threads.threads,
                             shared_bytes=max(s.launch.shared_bytes for s in stages), grid_syncs=plan.grid_syncs)
        total = sum(s.global_bytes for s in stages)
        cand = Candidate.of(ctx.graph, members, plan, launch=launch, global_bytes=total,
                            code_path=CodePath.WMMA if tensor else CodePath.SIMT,
                            provenance=f"subprogram: {len(stages)} stages merged, {plan.grid_syncs} grid barriers"
                                       + as_built_note(flops_ratio, loads_ratio),
                            key=ctx.kernel_key(members, plan), stages=stages)
        # its flops are its stages' (each rounded): the whole is their sum, as it is planned
        return dataclasses.replace(cand, flops=sum(s.flops for s in stages)) if flops_ratio > 1.0 else cand

    def stage_functions(self, func: tirx.PrimFunc, plan: SubprogramPlan) -> list[tirx.PrimFunc]:
        """The unscheduled function of each stage of ``plan`` on ``func``, in order (the kernel check
        recomputes each from the merged kernel's own intermediates:
        :func:`tvm_ext.checks.thread_serial.compare_stages`)."""
        return [stage_function(func, spec) for spec in plan.stages]

    def schedule(self, func: tirx.PrimFunc, plan: SubprogramPlan, device: DeviceSpec) -> ScheduledKernel:
        """Build ``plan`` on ``func`` (:func:`~tvm_ext.subprogram.kernel.build`)."""
        target = tvm.target.Target.current(allow_none=False)
        try:
            merged = build(func, plan, target)
        except StageError as err:
            raise ScheduleRefused(f"subprogram: {err}") from None
        rule = "merged+grid_sync" if merged.grid_syncs else "merged"
        return ScheduledKernel(merged.func, workspaces=merged.workspaces, rule=rule)


register_generator(SubprogramGenerator())

__all__ = ["SubprogramGenerator", "is_gemm_node", "pieces"]
