"""Graph connecting (Welder Fig. 7): which edges of a graph become on-chip connections.

For every edge between two kernels, :func:`connect_graph` prices the edge at ``global`` (the two
kernels, as before) and at its on-chip level (:func:`~tvm_ext.tilegraph.planning.edge_level`:
register or shared), and connects the edge with the largest saving by the cost model, then the
next, until no connection saves anything (Welder keeps the level its profiler finds fastest, edge
by edge in topological order; see :func:`connect_graph` for why the order differs).

Connecting the edge merges the two kernels (groups) it joins; the merged group is planned by
:mod:`~tvm_ext.tilegraph.planning`, and its tile kernel is the cheaper by the cost model of its
ranked plan (:func:`~tvm_ext.tilegraph.planning.plan_group`) and its whole-reduction plan
(:func:`~tvm_ext.tilegraph.planning.whole_reduction_plan`). A group alone is priced as the cheaper
of its tile kernel and, for a single node, dlight's kernel of it (what the selector would take
instead).

Example
-------
>>> groups = connect_graph(ctx, MeasuredCostModel())
>>> [(g.nodes, g.plan.output_tile) for g in groups if len(g.nodes) > 1][:1]
[((3, 4, 5, 6), (1, 1, 16, 64))]
"""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass

from ..select.candidate import Candidate, CodePath, LaunchShape, boundary_bytes
from ..select.context import SelectionContext
from ..select.emit import EmitError
from .planning import GROUP_UNITS, injective, is_planned, plan_group, whole_reduction_plan
from .plans import TilePlan

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectedGroup:
    """One kernel of the connected graph: its nodes (topological order), plan and price."""

    nodes: tuple[int, ...]
    plan: TilePlan | None
    seconds: float
    #: A group of the final connected graph (False: a saving merge the search did not keep).
    kept: bool = True


def tile_candidate(ctx: SelectionContext, members: tuple[int, ...], plan: TilePlan, provenance: str) -> Candidate:
    """The selector's candidate of a planned group."""
    members = ctx.ordered(members)
    launch = LaunchShape(grid=plan.grid, threads=plan.threads, shared_bytes=plan.shared_bytes)
    cand = Candidate.of(ctx.graph, members, plan, launch=launch, code_path=CodePath(plan.code_path),
                        global_bytes=plan.traffic_bytes, unique_bytes=boundary_bytes(ctx.graph, members),
                        provenance=provenance, key=ctx.kernel_key(members, plan))
    return dataclasses.replace(cand, flops=cand.flops + plan.padding_flops) if plan.padding_flops else cand


class _Pricer:
    """Seconds of a group as one kernel: its tile kernel, or dlight's for a single node."""

    def __init__(self, ctx: SelectionContext, cost):
        from ..select.generator import get_generator  # noqa: PLC0415 (the registry imports generators)

        self.ctx, self.cost, self.dlight = ctx, cost, get_generator("dlight")

    def tile(self, members: tuple[int, ...]) -> tuple[TilePlan | None, float]:
        """The cheaper of the group's ranked plan and its whole-reduction plan, with its seconds."""
        best: tuple[TilePlan | None, float] = (None, float("inf"))
        for made in (plan_group(self.ctx, members), whole_reduction_plan(self.ctx, members)):
            if isinstance(made, TilePlan):
                cand = tile_candidate(self.ctx, members, made, "tile graph")
                seconds = self.cost.cost(cand, self.ctx.device).seconds
                if seconds < best[1]:
                    best = (made, seconds)
        return best

    def alone(self, members: tuple[int, ...]) -> tuple[TilePlan | None, float]:
        plan, seconds = self.tile(members)
        if len(members) == 1:
            try:
                single = self.dlight.candidate(self.ctx, members, "single", "node alone")
                seconds = min(seconds, self.cost.cost(single, self.ctx.device).seconds)
            except EmitError:
                pass
        return plan, seconds


def _moves(ctx: SelectionContext, edges: list[tuple[int, int]], group_of: dict,
           neighbourhoods: bool) -> list[tuple[tuple[int, ...], ...]]:
    """The merges one step of :func:`connect_graph` may make, each as the groups it joins: the two
    ends of an edge or, with ``neighbourhoods``, a group holding a reduction (a contraction's
    included) with every group it shares an edge with."""
    pairs: dict = {}
    around: dict = {}
    for n, c in edges:
        a, b = group_of[n], group_of[c]
        if a == b:
            continue
        pairs.setdefault(tuple(sorted((a, b))), None)
        around.setdefault(a, {}).setdefault(b, None)
        around.setdefault(b, {}).setdefault(a, None)
    if not neighbourhoods:
        return list(pairs)
    grown = (tuple(sorted((group, *others))) for group, others in around.items()
             if len(others) > 1 and any(not injective(ctx, n) for n in group))
    return list(dict.fromkeys(grown))


def connect_graph(ctx: SelectionContext, cost, *, also_explored: bool = False) -> list[ConnectedGroup]:
    """Welder's ``GraphConnecting`` over ``ctx.graph`` priced by ``cost`` (see the module docstring).

    Edges are connected best gain first (the saving of one kernel over the two it replaces), not
    in topological order as in Fig. 7: in topological order a GEMM's layout epilogue (BERT's V
    projection with its reshape and transpose) is connected before the attention that reads it,
    and the attention can then no longer take its PV product. Ties go to the earlier edge.

    When no pair of groups saves anything, a step may merge a group holding a reduction (a GEMM's
    included) with all its neighbouring groups at once: merging pair by pair can cost more at every
    step than it saves in the end. The QK^T product of an attention alone is cheaper as a dlight
    kernel than as a tile kernel, yet the whole attention core as one tensor-core kernel can be
    cheaper than its three kernels; NAFNet's layer norm over 512 channels of a 16x16 image stops
    in four pieces (14.7 us modelled) when merged pair by pair, and is one kernel of 7.8 us when its
    second mean takes both neighbours. Only then, so that a neighbourhood is planned for groups that
    pairs no longer change (planning every neighbourhood at every step doubled Segformer-B0's
    connecting time).

    Returns every group of the final connected graph (single nodes included), in topological order;
    with ``also_explored``, followed by every merge the search planned and found saving that is not
    a final group: those it did not take (a greedy step can take a merge that blocks better ones
    later) and those it took and merged further (a layer norm's group before it took the GEMM after
    it: the selector may price that GEMM lower in a kernel of another generator, with its
    epilogue). The selector, pricing them all, picks the cover.

    The search plans from ``ctx.meter("tilegraph")`` (:mod:`tvm_ext.select.budget`). A step plans
    its moves in the order of the global traffic each removes (most first; the choice among them is
    the same as in edge order), so a budget spent in a step leaves the merges that save least
    unplanned. Once it is exhausted no group is planned that the build has not planned already:
    connecting goes on with the merges already priced, nodes never priced alone are returned with
    ``plan`` None and ``seconds`` inf, and a note in ``ctx.notes`` says after how many of the groups
    asked for it stopped.
    """
    meter = ctx.meter("tilegraph")
    pricer = _Pricer(ctx, cost)
    calls = ctx.call_nodes()
    group_of: dict[int, tuple[int, ...]] = {n: (n,) for n in calls}
    price: dict[tuple[int, ...], tuple[TilePlan | None, float]] = {}
    trials: dict[tuple[int, ...], tuple[TilePlan | None, float]] = {}
    saving: dict[tuple[int, ...], None] = {}      # merges that saved when tried: by step, in edge order
    edges = [(n, c) for n in calls for c in ctx.ordered(c for c in ctx.graph.consumers(n) if c in group_of)]

    planned = [0]

    def charge(members: tuple[int, ...]) -> None:
        """A group asked for: its fixed cost, unless the build has planned it (that stays free)."""
        if not is_planned(ctx, members):
            meter.spend(GROUP_UNITS)

    def priced(members: tuple[int, ...]) -> tuple[TilePlan | None, float]:
        if members not in price:
            charge(members)
            price[members] = pricer.alone(members)
            planned[0] += 1
        return price[members]

    def trial(merged: tuple[int, ...]) -> tuple[TilePlan | None, float]:
        if merged not in trials:
            charge(merged)
            trials[merged] = pricer.tile(merged) if ctx.graph.is_convex(merged) else (None, float("inf"))
            planned[0] += 1
        return trials[merged]

    planned_before: dict[tuple[int, ...], bool] = {}     # asked only once the budget is spent: then fixed

    def free(members: tuple[int, ...]) -> bool:
        """Whether pricing ``members`` plans nothing new (this run or an earlier one of the build did)."""
        if members in price or members in trials:
            return True
        if members not in planned_before:
            planned_before[members] = is_planned(ctx, members) or not ctx.graph.is_convex(members)
        return planned_before[members]

    value: dict[tuple[int, ...], int] = {}

    def saved_bytes(parts: tuple[tuple[int, ...], ...]) -> int:
        """Global traffic a merge removes (its parts' boundaries less its own): the order in which
        a step plans its moves, so that a spent budget leaves the least valuable ones unplanned."""
        if parts not in value:
            value[parts] = (sum(ctx.graph.boundary_bytes(p) for p in parts)
                            - ctx.graph.boundary_bytes(sum(parts, ())))
        return value[parts]

    unplanned: set[tuple[int, ...]] = set()     # merges the spent budget left unplanned
    # A move's parts are groups of the current graph, whose prices never change, and its merge is
    # priced once: what a move was found to gain stays true at every later step (a step re-reads
    # the moves it leaves alone instead of pricing them again; 1000-node graphs take ~900 steps).
    evaluated: dict[tuple[tuple[int, ...], ...], tuple] = {}
    best = None

    def consider(k: int, merged: tuple[int, ...], plan: TilePlan | None, seconds: float, gain: float,
                 savers: list) -> None:
        nonlocal best
        if plan is not None and gain > 0:
            savers.append((k, merged))
            # the largest gain; of equal gains the earliest move (the edge order)
            if best is None or (gain, -k) > (best[0], -best[1]):
                best = (gain, k, merged, plan, seconds)

    while True:
        best = None
        for neighbourhoods in (False, True):       # neighbourhoods only once no pair saves anything
            moves = _moves(ctx, edges, group_of, neighbourhoods)
            savers: list = []
            fresh = []
            for k, parts in enumerate(moves):
                if parts in evaluated:
                    consider(k, *evaluated[parts], savers)
                else:
                    fresh.append(k)
            for k in sorted(fresh, key=lambda k: (-saved_bytes(moves[k]), k)):
                parts = moves[k]
                merged = ctx.ordered(sum(parts, ()))
                if meter.exhausted and not all(free(g) for g in (merged, *parts)):
                    unplanned.add(merged)
                    continue
                plan, seconds = trial(merged)
                evaluated[parts] = (merged, plan, seconds, sum(priced(p)[1] for p in parts) - seconds)
                consider(k, *evaluated[parts], savers)
            for _, saver in sorted(savers):
                saving[saver] = None
            if best is not None:
                break
        if best is None:
            break
        gain, _, merged, plan, seconds = best
        price[merged] = (plan, seconds)
        for m in merged:
            group_of[m] = merged
        logger.debug("connected %s: %.3g s, %.3g s saved", [ctx.graph.nodes[m].name for m in merged], seconds, gain)
    groups = list(dict.fromkeys(group_of[n] for n in calls))
    unplanned -= trials.keys()
    if unplanned:
        ctx.notes.append(meter.note(planned[0], planned[0] + len(unplanned)))
        logger.warning(ctx.notes[-1])
    kept = [ConnectedGroup(g, *(priced(g) if not meter.exhausted or free(g) else (None, math.inf))) for g in groups]
    if not also_explored:
        return kept
    final = set(groups)
    return kept + [ConnectedGroup(m, *trials[m], kept=False) for m in saving if m not in final]


__all__ = ["ConnectedGroup", "connect_graph", "tile_candidate"]
