"""The tilegraph generator (Welder): connected sub-graphs as candidate kernels.

:func:`~tvm_ext.tilegraph.connect.connect_graph` connects the graph edge by edge where the cost
model prices one tile kernel below the kernels it replaces; every connected group of two or more
nodes becomes a candidate carrying its :class:`~tvm_ext.tilegraph.plans.TilePlan`, and so does every
merge the connecting found saving but did not keep (its greedy order can block a better cover,
which the selector then finds), and every such group less the epilogue nodes of a GEMM outside
it (:mod:`~tvm_ext.tilegraph.epilogues`: the GEMM's dlight kernel may take them). The schedule
stage builds the plan it finds on the kernel (:func:`~tvm_ext.tilegraph.schedule.build_tile_schedule`);
each kernel is lowered alone first (``verify_lowering``), and one TVM refuses runs as dlight
kernels instead, reported.

Example
-------
>>> cands = TileGraphGenerator().candidates(ctx)
>>> cands[0].plan.summary()
'tilegraph: tile 1x1x16x64, grid 96 x 512 threads, 12.5 KiB shared, 4 inlined'
"""
from __future__ import annotations

import logging
import time
from typing import Any

import tvm
from tvm import tirx

from ..frontend.split_slices import SplitToSlices
from ..hardware import DeviceSpec
from ..select.candidate import Candidate
from ..select.context import SelectionContext
from ..select.generator import ScheduledKernel, ScheduleRefused, register_generator
from ..select.measured import MeasuredCostModel
from .connect import connect_graph, tile_candidate
from .planning import is_planned, plan_group
from .epilogues import epilogue_owners, without_foreign_epilogues
from .plans import TilePlan
from .schedule import TileScheduleError, build_tile_schedule

logger = logging.getLogger(__name__)


class TileGraphGenerator:
    """Welder's connected kernels as candidates (see the module docstring).

    Parameters
    ----------
    cost : CostModel, optional
        What graph connecting prices with (default: measured, else learned, else analytic, as the
        selector prices).
    """

    name = "tilegraph"
    kernel_kind = "tir"
    #: Lower each tile kernel alone in the schedule stage; one TVM rejects runs as dlight kernels.
    verify_lowering = True

    def __init__(self, cost=None):
        self.cost = cost

    def prepare_passes(self, target: tvm.target.Target) -> list:
        """``SplitToSlices``: a split read part by part becomes slices, which connect to their readers
        (a multi-output split is no tile-graph node)."""
        return [SplitToSlices()]

    def plan_from_json(self, data: dict[str, Any]) -> TilePlan:  # noqa: D102 - protocol
        return TilePlan.from_json(data)

    def candidates(self, ctx: SelectionContext) -> list[Candidate]:
        """One candidate per connected group of two or more nodes, one per saving merge the greedy
        connecting planned but did not keep, and one per plannable part of those less the epilogues
        of GEMMs outside them (the selector picks among them)."""
        start = time.perf_counter()
        ctx.meter(self.name)        # the planning budget counts from here
        groups = connect_graph(ctx, self.cost or MeasuredCostModel(), also_explored=True)
        planned = [g for g in groups if len(g.nodes) > 1 and g.plan is not None]
        out = [tile_candidate(ctx, g.nodes, g.plan, f"tile graph: {len(g.nodes)} nodes, "
                              + ("connected" if g.kept else "a saving merge the greedy connecting did not keep"))
               for g in planned]
        trimmed = self._without_foreign_epilogues(ctx, [g.nodes for g in planned])
        out += [tile_candidate(ctx, nodes, plan, f"tile graph: {len(nodes)} nodes, a connected group less the "
                               "epilogue of a GEMM outside it") for nodes, plan in trimmed]
        kept = [g for g in planned if g.kept]
        ctx.notes.append(f"tilegraph: {len(kept)} connected groups of {sum(len(g.nodes) for g in kept)} nodes, "
                         f"{len(planned) - len(kept)} other saving merges and {len(trimmed)} groups less a GEMM's "
                         f"epilogue, connected in {time.perf_counter() - start:.1f} s")
        return out

    @staticmethod
    def _without_foreign_epilogues(ctx: SelectionContext, groups: list[tuple[int, ...]]) -> list[tuple]:
        """(nodes, plan) of each new plannable part of ``groups`` less foreign epilogues (once the
        planning budget is spent, only those the build has planned)."""
        owners = epilogue_owners(ctx.graph)
        seen = set(groups)
        found = []
        meter = ctx.meter("tilegraph")
        for group in groups:
            for part in without_foreign_epilogues(ctx, group, owners):
                if part in seen or (meter.exhausted and not is_planned(ctx, part)):
                    continue
                seen.add(part)
                plan = plan_group(ctx, part)
                if isinstance(plan, TilePlan):
                    found.append((part, plan))
                else:
                    logger.debug("tilegraph: %s less a GEMM's epilogue has no tile: %s", part, plan)
        return found

    def schedule(self, func: tirx.PrimFunc, plan: TilePlan, device: DeviceSpec) -> ScheduledKernel:
        """Build ``plan`` on ``func`` (:func:`~tvm_ext.tilegraph.schedule.build_tile_schedule`)."""
        try:
            rule = "tilegraph+tensor_core" if plan.tensor_core else "tilegraph"
            return ScheduledKernel(build_tile_schedule(func, plan), rule=rule)
        except TileScheduleError as err:
            raise ScheduleRefused(f"tilegraph: {err}") from None

    def cpu_schedule(self, func: tirx.PrimFunc, plan: TilePlan) -> tirx.PrimFunc:
        """The kernel :meth:`schedule` builds, with its tensor-core stages left as the 16x16x16
        loops the WMMA intrinsics replace: what the CPU runs thread-serialized to check it."""
        return build_tile_schedule(func, plan, tensorize=False)


register_generator(TileGraphGenerator())

__all__ = ["TileGraphGenerator"]
