"""The stitch generator (AStitch): memory-intensive groups as candidate kernels.

Candidates, in the order a priority selector should take them:

1. the groups of the stitch scope (:func:`~tvm_ext.stitch.scope.stitch_scope`): row-reduction
   prologues computed inside their GEMM, stitched groups of memory-intensive nodes (remote
   stitching included), and single memory-intensive nodes with several blocks or a reduction
   (softmax, layer norm);
2. the alternatives a cost-based selector may prefer: the scope's groups without GEMM prologues
   (the softmax group as its own kernel), and, when a library generator ran before, the scope
   formed around the library kernels instead of ``FuseOps``-like epilogues: the epilogue ops a
   library kernel cannot take (ConvNeXt's layer scale, YOLO's residual after SiLU, a cast) then
   join the memory-intensive group that follows instead of running as kernels of their own.

Each candidate is planned on its fused PrimFunc (:func:`~tvm_ext.stitch.planner.plan_prim_func`,
or :func:`~tvm_ext.stitch.prologue_schedule.plan_prologue_tiles` for a prologue), once per
structural signature; a group that cannot be planned is dropped and recorded. The schedule
stage builds the plan it finds on the kernel (:meth:`StitchGenerator.schedule`).

Example
-------
>>> cands = StitchGenerator().candidates(ctx)
>>> [c.plan.group for c in cands][:3]
['stitch', 'prologue', 'single']
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

import tvm
from tvm import tirx

from ..analysis.work import executed_work, function_work
from ..frontend.split_slices import SplitToSlices
from ..graph import sblocks
from ..hardware import DeviceSpec
from ..select.budget import BudgetMeter
from ..select.candidate import Candidate, CodePath, LaunchShape, boundary_bytes
from ..select.context import SelectionContext
from ..select.describe import as_built_note, executed_ratios
from ..select.emit import EmitError
from ..select.generator import ScheduledKernel, ScheduleRefused, register_generator
from .planner import PlanOptions, StitchPlan, StitchPlanError, plan_prim_func
from .plans import StitchKernelPlan, realize
from .prologue_schedule import build_prologue_schedule, plan_prologue_tiles
from ..tir import promote_workspace
from .schedule import StitchScheduleError, build_schedule
from .scope import ScopeGroup, is_stitchable, stitch_scope

logger = logging.getLogger(__name__)


#: Executed transcendentals or flops per block, as a multiple of what the whole function plans,
#: above which a stitched kernel is not proposed. Planned is the function after the plan's inlining,
#: which holds the recomputation the plan means (softmax's ``exp`` in its sum and normalisation).
#: Up to this bound the excess is *replication*: each block derives a value every block needs
#: (AStitch's regional scheme: a squeeze-excite gate's reduced vector computed by every block that
#: reads it), which is priced: a candidate is priced from what its kernel executes, as the report
#: prices the built kernel (:func:`~tvm_ext.select.describe.executed_ratios`, past its
#: ``EXECUTED_MARGIN``, as for every generator). Past it, a block recomputes more than the whole
#: function needs: a chain re-derived along the serial path (the H200's stitched LSTM, built before
#: the inlining bound of :mod:`.dominance`, recomputed its recurrence from step 0 at every step and
#: ran 18.4 ms against 0.97 for baseline), which the cost model cannot price. Issue 34: "within
#: 1.5x of its planned work, or the kernel is not selected".
RECOMPUTE_PER_BLOCK = 1.0


@dataclasses.dataclass(frozen=True)
class BuiltWork:
    """What the kernel a stitch plan builds executes, against what it plans."""

    #: Executed / planned arithmetic and global loads the candidate is priced with (the ratios of
    #: :func:`~tvm_ext.select.describe.executed_ratios`, which the report prices the kernel with).
    flops_ratio: float = 1.0
    loads_ratio: float = 1.0
    #: Why the kernel is not proposed ('' when it is).
    refused: str = ""


def built_work(func: tirx.PrimFunc, plan: StitchPlan) -> BuiltWork:
    """Build ``plan`` on ``func`` and count what the kernel executes (see :data:`RECOMPUTE_PER_BLOCK`)."""
    scheduled = build_schedule(plan)
    executed = executed_work(scheduled)
    if plan.inlined_func is not None:
        planned = function_work(plan.inlined_func)
        over = {name: done / want for name, done, want in (
            ("transcendentals", executed.transcendentals, planned.transcendentals),
            ("flops", executed.flops, planned.flops)) if want > 0 and done > RECOMPUTE_PER_BLOCK * plan.grid * want}
        if over:
            what = ", ".join(f"{ratio:.0f}x the {name}" for name, ratio in over.items())
            return BuiltWork(refused=f"the built kernel executes {what} its plan does over {plan.grid} blocks: "
                                     "a block recomputes more than the whole function needs")
    return BuiltWork(*executed_ratios(func, scheduled, executed=executed))


def worth_own_schedule(func: tirx.PrimFunc) -> bool:
    """Whether a single node gets a stitched kernel: it has several blocks or a reduction."""
    blocks = sblocks(func)
    return len(blocks) > 1 or any(iv.iter_type == tirx.IterVar.CommReduce for b, _ in blocks for iv in b.iter_vars)


def _global_round_trips(plan: StitchKernelPlan) -> int:
    """Bytes a plan's global-scheme intermediates write and read back (workspaces)."""
    p = plan.stitch
    if p is None or p.graph is None:
        return 0
    from ..analysis import element_bytes

    total = 0
    for name in p.ops_with_scheme("global"):
        op = p.graph.op(name)
        total += 2 * op.num_elements * element_bytes(op.dtype)
    return total


def library_kernels(ctx: SelectionContext) -> list[list[int]]:
    """Per compute node that earlier library candidates cover, the largest such candidate's nodes
    (disjoint, topological order); the other compute nodes keep their compute groups."""
    from ..select.generator import get_generator
    from ..select.groups import compute_groups

    best: dict[int, tuple[int, ...]] = {}
    for cand in ctx.proposed:
        if get_generator(cand.generator).kernel_kind != "library":
            continue
        for n in cand.nodes:
            if n in best and len(best[n]) >= len(cand.nodes):
                continue
            best[n] = cand.nodes
    if not best:
        return []
    kernels: list[list[int]] = []
    taken: set[int] = set()
    for nodes in dict.fromkeys(best.values()):
        if taken.isdisjoint(nodes):
            kernels.append(list(nodes))
            taken.update(nodes)
    kernels += [g for g in compute_groups(ctx.graph) if taken.isdisjoint(g)]
    return kernels


class StitchGenerator:
    """AStitch's kernels as candidates (see the module docstring).

    Parameters
    ----------
    options : PlanOptions, optional
        Planner knobs.
    remote : bool
        Merge independent memory-intensive groups (remote stitching).
    gemm_prologues : bool
        Offer softmax-like groups computed inside the GEMM that reads them.
    max_group_nodes : int, optional
        Bound on the nodes of one stitch group.
    """

    name = "stitch"
    kernel_kind = "tir"
    #: Lower each stitched kernel alone in the schedule stage; one TVM rejects runs as dlight kernels.
    verify_lowering = True

    def __init__(self, options: PlanOptions | None = None, *, remote: bool = True, gemm_prologues: bool = True,
                 max_group_nodes: int | None = None):
        self.options = options or PlanOptions()
        self.remote = remote
        self.gemm_prologues = gemm_prologues
        self.max_group_nodes = max_group_nodes

    def prepare_passes(self, target: tvm.target.Target) -> list:
        """``SplitToSlices``: a split read part by part becomes slices the GEMMs read through."""
        return [SplitToSlices()]

    def plan_from_json(self, data: dict[str, Any]) -> StitchKernelPlan:  # noqa: D102 - protocol
        return StitchKernelPlan.from_json(data)

    def _groups(self, ctx: SelectionContext) -> list[ScopeGroup]:
        kwargs = dict(remote=self.remote, max_group_nodes=self.max_group_nodes)
        groups = list(stitch_scope(ctx.graph, gemm_prologues=self.gemm_prologues, **kwargs).groups)
        if self.gemm_prologues:
            groups += list(stitch_scope(ctx.graph, gemm_prologues=False, **kwargs).groups)
        library = library_kernels(ctx)
        if library:
            groups += list(stitch_scope(ctx.graph, gemm_prologues=False, compute_kernels=library, **kwargs).groups)
        seen: set[tuple[int, ...]] = set()
        out = []
        for group in groups:
            if group.nodes in seen or group.kind == "epilogue":
                continue
            seen.add(group.nodes)
            if group.kind == "single":
                node = ctx.graph.nodes[group.nodes[0]]
                if not is_stitchable(ctx.graph, node.index) or not worth_own_schedule(node.func):
                    continue
            out.append(group)
        return out

    def candidates(self, ctx: SelectionContext) -> list[Candidate]:  # noqa: D102 - protocol
        out = []
        meter = ctx.meter(self.name)        # a work unit: one node of a group planned
        groups = self._groups(ctx)
        planned = 0
        for group in groups:
            if meter.exhausted and not ctx.has_shared(self._plan_key(ctx, group)):
                continue
            planned += 1
            cand = self._candidate(ctx, group, meter=meter)
            if cand is not None:
                out.append(cand)
        if planned < len(groups):
            ctx.notes.append(meter.note(planned, len(groups), "groups"))
            logger.warning(ctx.notes[-1])
        return out

    def _plan_key(self, ctx: SelectionContext, group: ScopeGroup, recomputes: tuple[int, ...] = ()) -> tuple:
        """The build-wide memo key of ``group``'s plan: by structure (a later graph-stage run of the
        build, another graph choice or a re-selection round, reuses the plan and its built counts)."""
        return ("stitch", self.options, group.kind, group.parts, ctx.signature(ctx.ordered(group.nodes), recomputes))

    def plan_set(self, ctx: SelectionContext, nodes, provenance: str = "") -> Candidate | None:
        """A stitched kernel over any convex set of stitchable nodes (one part); None when the
        planner cannot plan it (recorded as dropped)."""
        cand = self._candidate(ctx, ScopeGroup(ctx.ordered(nodes), "stitch"))
        return dataclasses.replace(cand, provenance=provenance) if cand is not None and provenance else cand

    def extend(self, ctx: SelectionContext, cand: Candidate, recompute: tuple[int, ...]) -> Candidate | None:
        """``cand``'s stitched kernel also recomputing the nodes ``recompute``, planned anew (see
        :mod:`tvm_ext.select.recompute`); None for a GEMM-prologue kernel or a set stitch cannot plan."""
        if cand.plan.group == "prologue" or not all(is_stitchable(ctx.graph, n) for n in recompute):
            return None
        kind = "stitch" if cand.plan.group == "single" else cand.plan.group
        return self._candidate(ctx, ScopeGroup(ctx.ordered(cand.nodes + recompute), kind, cand.plan.parts),
                               tuple(sorted({*cand.recomputes, *recompute})))

    def _candidate(self, ctx: SelectionContext, group: ScopeGroup,
                   recomputes: tuple[int, ...] = (), meter: BudgetMeter | None = None) -> Candidate | None:
        members = ctx.ordered(group.nodes)

        def plan() -> tuple[StitchKernelPlan, BuiltWork] | str:
            if meter is not None:
                meter.spend(len(members))
            try:
                func = ctx.fused_function(members, recomputes)
                if group.kind == "prologue":
                    return StitchKernelPlan("prologue", tiles=plan_prologue_tiles(func, ctx.device)), BuiltWork()
                stitch = plan_prim_func(func, ctx.device, self.options)
                work = built_work(func, stitch)
                return work.refused or (StitchKernelPlan(group.kind, group.parts, stitch=stitch), work)
            except (StitchPlanError, StitchScheduleError, EmitError) as err:
                return str(err)

        built = ctx.shared_memo(self._plan_key(ctx, group, recomputes), plan)
        if isinstance(built, str):
            ctx.drop(self.name, members, built)
            logger.info("stitch group %s not planned: %s", list(members), built)
            return None
        made, work = built
        if made.tiles is not None:
            t = made.tiles
            launch = LaunchShape(grid=t.grid, threads=t.threads_x * t.threads_y, shared_bytes=t.shared_bytes)
        else:
            p = made.stitch
            launch = LaunchShape(grid=p.grid, threads=p.threads_per_block, shared_bytes=p.shared_bytes,
                                 registers=p.launch.register_cap, grid_syncs=made.grid_syncs)
        moved = boundary_bytes(ctx.graph, members, recomputes)
        why = f"stitch scope: {group.kind} group"
        if recomputes:
            why += "; recomputes " + ", ".join(ctx.graph.nodes[n].func_name for n in recomputes)
        why += as_built_note(work.flops_ratio, work.loads_ratio)
        cand = Candidate.of(ctx.graph, members, made, launch=launch, code_path=CodePath(made.code_path),
                            global_bytes=int((moved + _global_round_trips(made)) * work.loads_ratio),
                            unique_bytes=moved + _global_round_trips(made) // 2,
                            provenance=why, key=ctx.kernel_key(members, made, recomputes), recomputes=recomputes)
        return dataclasses.replace(cand, flops=int(cand.flops * work.flops_ratio)) if work.flops_ratio > 1.0 else cand

    def schedule(self, func: tirx.PrimFunc, plan: StitchKernelPlan, device: DeviceSpec) -> ScheduledKernel:
        """Build ``plan`` on ``func``: the prologue builder, or the stitch schedule builder on the
        plan realized on ``func``; global intermediates become workspace parameters."""
        try:
            if plan.tiles is not None:
                return ScheduledKernel(build_prologue_schedule(func, plan.tiles), rule="stitched+gemm_prologue")
            scheduled, workspaces = promote_workspace(build_schedule(realize(func, plan.stitch)))
        except (StitchPlanError, StitchScheduleError) as err:
            raise ScheduleRefused(f"stitch: {err}") from None
        rule = "stitched+grid_sync" if plan.stitch.needs_grid_sync else "stitched"
        return ScheduledKernel(scheduled, workspaces=workspaces, rule=rule)


register_generator(StitchGenerator())

__all__ = ["StitchGenerator", "worth_own_schedule"]
