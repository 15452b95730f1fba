"""Graph connecting (Welder Fig. 7): which edges of a graph become on-chip connections.

For every node in topological order and every edge to a consumer, :func:`connect_graph` tries the
edge at ``global`` (two kernels, as before) and at its on-chip level, and keeps the cheaper by the
cost model, as Welder keeps the level its profiler finds fastest:

* an edge out of an injective node (elementwise, broadcast, layout) is a **register** connection:
  the producer is inlined into the kernel that reads it;
* an edge out of a reduction or contraction is a **shared** connection: the producer's tile is
  computed per block into shared memory.

Connecting the edge merges the two kernels (groups) it joins. A merged group must stay convex,
have one escaping output (the schedule builder's kernels store one tensor), fuse into one PrimFunc
and get a tile: :func:`plan_group` ranks its output tiles with
:func:`~tvm_ext.tilegraph.enumerate_tiles` (Welder's top-k by traffic and waves) and keeps the first
one the builder can realize, with its thread count by the gcd rule. A group alone is priced as
the cheaper of its tile kernel and, for a single node, dlight's kernel of it (what the selector
would take instead).

Identical sub-graphs are planned once: plans are memoized by the group's structural signature
and connect levels (``SelectionContext.memo``), so BERT's layers 2-12 reuse layer 1's plans
(Welder's sub-graph signature cache).

Example
-------
>>> groups = connect_graph(ctx, MeasuredCostModel())
>>> [(g.nodes, g.plan.output_tile) for g in groups if len(g.nodes) > 1][:1]
[((3, 4, 5, 6), (1, 1, 16, 64))]
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from tvm import tirx

from ..graph import sblocks
from ..select.candidate import Candidate, CodePath, LaunchShape, boundary_bytes
from ..select.context import SelectionContext
from ..select.emit import EmitError
from .enumerate import enumerate_tiles
from .plans import TilePlan
from .schedule import TileScheduleError, gcd_threads, tile_work
from .tile_graph import ConnectLevel, TileGraph, TileGraphError

logger = logging.getLogger(__name__)

#: Output tiles of a group tried (best first) before it counts as unplannable: Welder profiles
#: about 20 per sub-graph; the builder needs a tile that divides the output, usually among the first.
TILES_TRIED = 8
#: Enumeration bound per group (evaluated tiles); *assumed*: planning time, not quality, is the
#: reason (each evaluation propagates the whole group once).
MAX_VISITS = 96


@dataclass(frozen=True)
class ConnectedGroup:
    """One kernel of the connected graph: its nodes (topological order), plan and price."""

    nodes: tuple[int, ...]
    plan: TilePlan | None
    seconds: float


def _is_reduction(block) -> bool:
    return any(iv.iter_type == tirx.IterVar.CommReduce for iv in block.iter_vars)


def injective(ctx: SelectionContext, node: int) -> bool:
    """Whether ``node`` computes every output element from its inputs alone (no reduction block)."""
    func = ctx.graph.nodes[node].func
    return func is not None and not any(_is_reduction(b) for b, _ in sblocks(func))


def edge_level(ctx: SelectionContext, producer: int) -> ConnectLevel:
    """The on-chip level of the edges out of ``producer`` (see the module docstring)."""
    return ConnectLevel.REGISTER if injective(ctx, producer) else ConnectLevel.SHARED


def _inline_blocks(ctx: SelectionContext, members: tuple[int, ...]) -> tuple[str, ...]:
    """Block names of the fused function to inline: every block of an injective member whose
    output stays inside, and the injective inner blocks of other members (softmax's ``exp``)."""
    escaping = set(ctx.graph.boundary(members)[1])
    names: list[str] = []
    blocks = [b.name_hint for b, _ in sblocks(ctx.fused_function(members))]
    position = 0
    for n in ctx.in_binding_order(members):      # FuseTIR writes the members' blocks in binding order
        node = ctx.graph.nodes[n]
        own = [b for b, _ in sblocks(node.func)]
        mine = blocks[position:position + len(own)]
        position += len(own)
        keeps_output = any(t in escaping for t in node.outputs)
        for k, (block, name) in enumerate(zip(own, mine)):
            last = k == len(own) - 1
            if _is_reduction(block) or (last and keeps_output):
                continue
            if last and not injective(ctx, n):
                continue
            names.append(name)
    return tuple(names)


def plan_group(ctx: SelectionContext, members: tuple[int, ...]) -> TilePlan | str:
    """The tile plan of ``members`` as one kernel, or why there is none (memoized by signature)."""
    members = ctx.ordered(members)

    def plan() -> TilePlan | str:
        graph = ctx.graph
        if len(graph.boundary(members)[1]) != 1:
            return "a tile kernel stores one output; this group has " + str(len(graph.boundary(members)[1]))
        try:
            tg = TileGraph(graph, members)
            for e in tg.edges:
                tg.set_connect(e, edge_level(ctx, e.producer))
            func = ctx.fused_function(members)
            inline = _inline_blocks(ctx, members)
            ranked = enumerate_tiles(tg, ctx.device, max_visits=MAX_VISITS)
        except (TileGraphError, EmitError) as err:
            return str(err)
        refused = "no output tile fits shared memory"
        for cand in ranked[:TILES_TRIED]:
            try:
                work = tile_work(func, cand.output_tile, inline)
            except TileScheduleError as err:
                refused = str(err)
                continue
            return TilePlan(output_tile=cand.output_tile, threads=gcd_threads(work), inline=inline,
                            grid=sum(cand.num_tiles), shared_bytes=cand.shared_bytes, traffic_bytes=cand.global_bytes,
                            levels=tuple((e.tensor, tg.connect_level(e).label) for e in tg.edges))
        return refused

    return ctx.memo(("tilegraph", ctx.signature(members)), plan)


def tile_candidate(ctx: SelectionContext, members: tuple[int, ...], plan: TilePlan, provenance: str) -> Candidate:
    """The selector's candidate of a planned group."""
    members = ctx.ordered(members)
    launch = LaunchShape(grid=plan.grid, threads=plan.threads, shared_bytes=plan.shared_bytes)
    return Candidate.of(ctx.graph, members, plan, launch=launch, code_path=CodePath.SIMT,
                        global_bytes=plan.traffic_bytes, unique_bytes=boundary_bytes(ctx.graph, members),
                        provenance=provenance, key=ctx.kernel_key(members, plan))


class _Pricer:
    """Seconds of a group as one kernel: its tile kernel, or dlight's for a single node."""

    def __init__(self, ctx: SelectionContext, cost):
        from ..select.generator import get_generator  # noqa: PLC0415 (the registry imports generators)

        self.ctx, self.cost, self.dlight = ctx, cost, get_generator("dlight")

    def tile(self, members: tuple[int, ...]) -> tuple[TilePlan | None, float]:
        made = plan_group(self.ctx, members)
        if isinstance(made, str):
            return None, float("inf")
        cand = tile_candidate(self.ctx, members, made, "tile graph")
        return made, self.cost.cost(cand, self.ctx.device).seconds

    def alone(self, members: tuple[int, ...]) -> tuple[TilePlan | None, float]:
        plan, seconds = self.tile(members)
        if len(members) == 1:
            try:
                single = self.dlight.candidate(self.ctx, members, "single", "node alone")
                seconds = min(seconds, self.cost.cost(single, self.ctx.device).seconds)
            except EmitError:
                pass
        return plan, seconds


def connect_graph(ctx: SelectionContext, cost) -> list[ConnectedGroup]:
    """Welder's ``GraphConnecting`` over ``ctx.graph`` priced by ``cost`` (see the module docstring).

    Returns every group of the final connected graph (single nodes included), in topological order.
    """
    pricer = _Pricer(ctx, cost)
    calls = ctx.call_nodes()
    group_of: dict[int, tuple[int, ...]] = {n: (n,) for n in calls}
    price: dict[tuple[int, ...], tuple[TilePlan | None, float]] = {}

    def priced(members: tuple[int, ...]) -> tuple[TilePlan | None, float]:
        if members not in price:
            price[members] = pricer.alone(members)
        return price[members]

    for n in calls:
        for c in ctx.ordered(c for c in ctx.graph.consumers(n) if c in group_of):
            a, b = group_of[n], group_of[c]
            if a == b:
                continue
            merged = ctx.ordered(a + b)
            if not ctx.graph.is_convex(merged):
                continue
            plan, seconds = pricer.tile(merged)
            if plan is None or seconds >= priced(a)[1] + priced(b)[1]:
                continue
            price[merged] = (plan, seconds)
            for m in merged:
                group_of[m] = merged
            logger.debug("connected %s (%s): %.3g s", list(merged), edge_level(ctx, n).label, seconds)
    groups = list(dict.fromkeys(group_of[n] for n in calls))
    return [ConnectedGroup(g, *priced(g)) for g in groups]


__all__ = ["TILES_TRIED", "MAX_VISITS", "ConnectedGroup", "connect_graph", "edge_level", "plan_group",
           "tile_candidate"]
