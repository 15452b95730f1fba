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

from ..frontend.split_slices import SplitToSlices
from ..graph import sblocks
from ..hardware import DeviceSpec
from ..select.candidate import Candidate, CodePath, LaunchShape, boundary_bytes
from ..select.context import SelectionContext
from ..select.emit import EmitError
from ..select.generator import ScheduledKernel, ScheduleRefused, register_generator
from .planner import PlanOptions, StitchPlanError, plan_prim_func
from .plans import StitchKernelPlan, realize
from .prologue_schedule import build_prologue_schedule, plan_prologue_tiles
from ..tir import promote_workspace
from .schedule import StitchScheduleError, build_schedule
from .scope import ScopeGroup, is_stitchable, stitch_scope

logger = logging.getLogger(__name__)


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
        for group in self._groups(ctx):
            cand = self._candidate(ctx, group)
            if cand is not None:
                out.append(cand)
        return out

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
                   recomputes: tuple[int, ...] = ()) -> Candidate | None:
        members = ctx.ordered(group.nodes)

        def plan() -> StitchKernelPlan | str:
            try:
                func = ctx.fused_function(members, recomputes)
                if group.kind == "prologue":
                    return StitchKernelPlan("prologue", tiles=plan_prologue_tiles(func, ctx.device))
                return StitchKernelPlan(group.kind, group.parts, stitch=plan_prim_func(func, ctx.device, self.options))
            except (StitchPlanError, StitchScheduleError, EmitError) as err:
                return str(err)

        made = ctx.memo(("stitch", group.kind, group.parts, ctx.signature(members, recomputes)), plan)
        if isinstance(made, str):
            ctx.drop(self.name, members, made)
            logger.info("stitch group %s not planned: %s", list(members), made)
            return None
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
        return Candidate.of(ctx.graph, members, made, launch=launch, code_path=CodePath(made.code_path),
                            global_bytes=moved + _global_round_trips(made),
                            unique_bytes=moved + _global_round_trips(made) // 2,
                            provenance=why, key=ctx.kernel_key(members, made, recomputes), recomputes=recomputes)

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
