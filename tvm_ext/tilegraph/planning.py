"""Planning a group of nodes as one tile kernel (Welder §3-4): connect levels, tiles, buildability.

Each edge inside a group is connected at a level (:func:`edge_level`):

* an edge out of an injective node (elementwise, broadcast, layout) is a **register** connection:
  the producer is inlined into the kernel that reads it, unless it computes and feeds a GEMM;
* any other edge is a **shared** connection: the producer's tile is computed per block into
  shared memory.

A group must stay convex, have escaping outputs of one shape (the schedule builder tiles every
output it stores alike), fuse into one PrimFunc and get a tile: :func:`plan_group` ranks its output
tiles with :func:`~tvm_ext.tilegraph.enumerate_tiles` (Welder's top-k by traffic and waves) and
keeps, of those the builder can realize, the one recomputing least (then the best ranked), with its
thread count by the gcd rule; a group holding a zero-size tensor is not planned. Enumeration also
offers the tiles that recompute no reduction whatever their rank (a layer norm whole across the
columns of the GEMM it feeds); the best of those that recompute nothing is
:func:`whole_reduction_plan`. Graph connecting (:mod:`~tvm_ext.tilegraph.connect`) prices both and
keeps the cheaper.

Identical sub-graphs are planned once: plans are memoized by the group's structural signature
(``SelectionContext.shared_memo``; the connect levels follow from it), so BERT's layers 2-12 reuse
layer 1's plans (Welder's sub-graph signature cache), and the build's later graph-stage runs reuse
the first one's. Each group planned charges the tile configurations it priced and the schedules it
built to the generator's planning budget (:func:`planning_units`,
``SelectionContext.meter("tilegraph")``, :mod:`tvm_ext.select.budget`).

Example
-------
>>> plan = plan_group(ctx, (3, 4, 5, 6))
>>> plan.output_tile, plan.code_path
((1, 1, 16, 64), 'wmma_tile')
"""
from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import tvm_ffi

from ..analysis import num_tiles
from ..errors import AnalysisError
from ..graph import is_reduction, sblocks
from ..select.context import SelectionContext
from ..select.emit import EmitError
from .enumerate import MMA_FRAGMENT as FRAGMENT, TileCandidate, enumerate_tiles
from .padding import paddable, padding_flops
from .plans import TilePlan
from .block_work import BlockWork, TileWork, gcd_threads
from .schedule import WARP, TileScheduleError
from .tensor_core import Misaligned, Unfit, stepped_reduction
from .tile_graph import ConnectLevel, TileGraph

#: Output tiles of a group tried (best first) before it counts as unplannable: Welder profiles
#: the top 20 per sub-graph; here each is checked for what the builder can realize (shared
#: memory, warps) and the least recomputing kept (a tile that divides the output computes nothing
#: twice; one that does not computes its cut border tiles' padding).
TILES_TRIED = 20
#: *assumed*: how many times a block may compute each of its outputs over the grid. Welder's
#: propagation recomputes halos (a 3x3 convolution's producer tile grows by its border: 1.56x for
#: an 8x8 tile); more than this means TVM's region inference could not invert an index map and
#: every block would compute far more than its tile needs.
MAX_RECOMPUTE = 2.0
#: Enumeration bound per group (evaluated tiles); *assumed*: planning time, not quality, is the
#: reason (each evaluation propagates the whole group once).
MAX_VISITS = 96
#: Work units a tile schedule built costs against one tile configuration priced (the tile graph's
#: planning budget, :func:`planning_units`). *Measured*: a group's planning seconds fitted by least
#: squares on the two counts, per group planned, on this 2-core machine with two other builds
#: running: a schedule costs 34 configurations on ResNet-50 (219 groups), 39 on MobileNet-V2
#: (211), 19 on BERT-base s128 (132); about their geometric mean.
SCHEDULE_UNITS = 30.0
#: Work units of asking for one group's plan and price (connecting's trial of a merge: the fused
#: function, the candidate and its price, whether or not the plan is remembered). *Measured*: the
#: tile graph's seconds over 13 seed models' ``full`` builds, two builds at a time, fitted by least
#: squares on groups asked and units charged: 4.3 ms a group, 0.13 ms a unit (residuals within 3 s;
#: LSTM's 6541 small groups took 35 s for 50000 units, ResNet-50's 606 took 10 s).
GROUP_UNITS = 32.0


def injective(ctx: SelectionContext, node: int) -> bool:
    """Whether ``node`` computes every output element from its inputs alone (no reduction block)."""
    func = ctx.graph.nodes[node].func
    return func is not None and not any(is_reduction(b) for b, _ in sblocks(func))


def _has_gemm(ctx: SelectionContext, node: int) -> bool:
    """Whether ``node`` has a contraction block (a GEMM or convolution)."""
    return ctx.graph.nodes[node].contracts


def edge_level(ctx: SelectionContext, producer: int, consumer: int) -> ConnectLevel:
    """The on-chip level of the edge ``producer -> consumer`` (see the module docstring).

    An injective producer is inlined (register), except one that computes (``flops > 0``) into a
    contraction: the contraction reads each of its elements once per output column, so inlining
    recomputes it that often (measured: a GELU inlined into BERT's FFN-down GEMM made it 3.6x
    slower than the same GEMM alone); such an edge is a shared connection.
    """
    graph = ctx.graph
    if not injective(ctx, producer):
        return ConnectLevel.SHARED
    computes = graph.nodes[producer].flops > 0
    return ConnectLevel.SHARED if computes and _has_gemm(ctx, consumer) else ConnectLevel.REGISTER


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
            if is_reduction(block) or (last and keeps_output):
                continue
            if last and any(edge_level(ctx, n, c) != ConnectLevel.REGISTER
                            for c in ctx.graph.consumers(n) if c in members):
                continue
            names.append(name)
    return tuple(names)


def plan_group(ctx: SelectionContext, members: tuple[int, ...]) -> TilePlan | str:
    """The tile plan of ``members`` as one kernel from Welder's ranked tiles, or why there is none
    (memoized by signature)."""
    return _group_plans(ctx, members)[0]


def _plan_key(ctx: SelectionContext, members: tuple[int, ...]) -> tuple:
    """The build-wide memo key of a group's plans (by structure: its signature)."""
    return "tilegraph", ctx.signature(ctx.ordered(members))


def is_planned(ctx: SelectionContext, members: tuple[int, ...]) -> bool:
    """Whether the build has planned a group of ``members``' structure (planning it again is free)."""
    return ctx.has_shared(_plan_key(ctx, members))


def whole_reduction_plan(ctx: SelectionContext, members: tuple[int, ...]) -> TilePlan | None:
    """The plan of ``members`` in the best tile, ranked or offered by enumeration outside its
    ranking, that recomputes no reduction (a layer norm -> GEMM whole across the GEMM's columns) and
    nothing else either; None if there is none or it is :func:`plan_group`'s. Connecting prices it
    against :func:`plan_group`'s and keeps the cheaper: Welder's ranking weighs traffic and waves
    only, the cost model also what recomputing costs and the few blocks a whole tile has."""
    return _group_plans(ctx, members)[1]


def _group_plans(ctx: SelectionContext, members: tuple[int, ...]) -> tuple[TilePlan | str, TilePlan | None]:
    """(:func:`plan_group`, :func:`whole_reduction_plan`), memoized by signature."""
    members = ctx.ordered(members)

    effort: dict = {}       # the tile graph and schedules this planning priced and built

    def plans() -> tuple[TilePlan | str, TilePlan | None]:
        try:
            return plan()
        finally:
            ctx.meter("tilegraph").spend(planning_units(effort.get("tiles"), effort.get("works")))

    def plan() -> tuple[TilePlan | str, TilePlan | None]:
        graph = ctx.graph
        empty = sorted({t for n in members for t in (*graph.nodes[n].inputs, *graph.nodes[n].outputs)
                        if t in graph.tensors and 0 in graph.tensors[t].shape})
        if empty:
            return f"zero-size tensors {empty} have no tile", None
        try:
            tg = effort["tiles"] = TileGraph(graph, members)
            tg.set_connects({e: edge_level(ctx, e.producer, e.consumer) for e in tg.edges})
            # Welder's footprint counts every input tile as staged in shared memory; this builder
            # reads inputs from global (through L1), so enumeration prunes only what no block could
            # hold and the builder's own buffers are checked against the static limit below.
            # Enumeration refuses outputs of several shapes before the group is fused.
            ranked = enumerate_tiles(tg, ctx.device, top_k=TILES_TRIED, max_visits=MAX_VISITS,
                                     shared_capacity=ctx.device.max_shared_memory_per_block_optin,
                                     builder_checks_shared=True)
            func = ctx.fused_function(members)
            inline = _inline_blocks(ctx, members)
        except (AnalysisError, EmitError) as err:      # TileGraphError is an AnalysisError
            return str(err), None
        limit = ctx.device.max_shared_memory_per_block_optin
        levels = tuple((e.tensor, tg.connect_level(e).label) for e in tg.edges)
        works = effort["works"] = _TileWorks(ctx, func, inline)     # each tile's schedule built once per build
        shape = tuple(graph.tensors[tg.outputs[0]].shape)     # the outputs share one shape (enumeration)
        best = _best_buildable([c for c in ranked if not c.offered], works, limit, shape)
        ranked_plan = best if isinstance(best, str) else _plan_of(ctx, func, best, inline, levels)
        whole = _best_buildable([c for c in ranked if c.whole_reductions], works, limit, shape, recompute_free=True)
        if isinstance(whole, str) or (isinstance(best, _Buildable) and whole.cand == best.cand):
            return ranked_plan, None
        return ranked_plan, _plan_of(ctx, func, whole, inline, levels)

    return ctx.shared_memo(_plan_key(ctx, members), plans)


def planning_units(tiles: TileGraph | None, works: "_TileWorks | None") -> float:
    """Work units of planning one group (the tile graph's charge to its planning budget, besides
    the :data:`GROUP_UNITS` connecting charges per group it asks for): one per tile configuration
    priced (:attr:`TileGraph.evaluations`), :data:`SCHEDULE_UNITS` per tile schedule built, at
    least one. Counts, not seconds, so where the budget stops is the same on any machine and
    under any load."""
    priced = tiles.evaluations if tiles is not None else 0
    built = works.built if works is not None else 0
    return max(1.0, priced + SCHEDULE_UNITS * built)


def _plan_of(ctx: SelectionContext, func, best: "_Buildable", inline: tuple[str, ...],
             levels: tuple[tuple[str, str], ...]) -> TilePlan:
    """The :class:`TilePlan` of a buildable tile."""
    work = best.work
    tensor_core = tuple(w.name for w in work if w.tensor_core)
    code_path = "simt_contraction" if best.simt else "wmma_tile" if tensor_core else "simt"
    shared = sum(w.shared_bytes() for w in work)
    return TilePlan(output_tile=best.cand.output_tile, threads=gcd_threads(work), inline=inline,
                    grid=work[-1].tiles, shared_bytes=shared, traffic_bytes=best.cand.global_bytes,
                    levels=levels, code_path=code_path, tensor_core=tensor_core,
                    dynamic_shared=shared > ctx.device.max_shared_memory_per_block,
                    padded=best.padded, padding_flops=padding_flops(func, work, best.padded), kstep=best.kstep)


class _Buildable(NamedTuple):
    """A ranked tile the builder can realize, with the block work of the option that builds."""

    rank: int           # Welder's rank
    cand: TileCandidate
    work: list[BlockWork]
    padded: tuple[str, ...] = ()    # contractions padded to whole fragments
    kstep: int = 0                  # tensor-core operands staged in reduction steps

    @property
    def overlap(self) -> float:
        """Recomputation apart from padding (:func:`_overlap`)."""
        return _overlap(self.work)

    @property
    def simt(self) -> int:
        """Contractions left one output per thread."""
        return sum(1 for w in self.work if w.wmma is not None and not w.tensor_core)

    @property
    def unfit(self) -> int:
        """Contractions no tile puts on tensor cores (:class:`~.tensor_core.Unfit`): SIMT in every
        tile, so no tile of the kernel has fewer than this many :attr:`simt`."""
        return sum(1 for w in self.work if isinstance(w.wmma, Unfit))

    @property
    def padding(self) -> float:
        """``tiles x tile / output`` of the output block (1.0: the tile divides the output)."""
        return self.work[-1].recompute

    def key(self) -> tuple:
        """The least recomputation, then the fewest SIMT GEMMs (Welder's ranking sees neither), then
        Welder's score times the padding of cut border tiles (208/197 for 16 of ViT's 197 tokens;
        *assumed*: the predicated-off threads idle as if the grid were that much larger), then rank."""
        return self.overlap, self.simt, self.cand.score * self.padding, self.rank


class _TileWorks:
    """:class:`~tvm_ext.tilegraph.block_work.TileWork` of one fused function, each (tile, padded
    contractions, reduction step) built once per build: a schedule per call (milliseconds);
    the ranked and whole-reduction lists of a group share their tiles, and groups of other
    signatures fuse into the same function (keyed by its structural hash)."""

    def __init__(self, ctx: SelectionContext, func, inline: tuple[str, ...]):
        self.ctx, self.func, self.inline = ctx, func, inline
        self._key = ("tile_work", tvm_ffi.structural_hash(func), tuple(inline))
        self._work = TileWork(func, inline)
        self.built = 0      # schedules built here (not remembered from another group)

    def __call__(self, tile: tuple[int, ...], padded: tuple[str, ...] = (), kstep: int = 0) -> list[BlockWork]:
        """The blocks' work of ``tile`` (raises :class:`TileScheduleError` as ``tile_work`` does)."""
        def build() -> list[BlockWork] | str:
            self.built += 1
            try:
                return self._work(tile, padded, kstep)
            except TileScheduleError as err:
                return str(err)

        built = self.ctx.shared_memo((*self._key, tuple(tile), tuple(padded), kstep), build)
        if isinstance(built, str):
            raise TileScheduleError(built)
        return built


def border_padding(shape: tuple[int, ...], tile: tuple[int, ...]) -> float:
    """``tiles x tile / output``: how much of the grid's output tiles lies past ``shape`` (1.0: the
    tile divides it), what :attr:`_Buildable.padding` measures on the built kernel."""
    return math.prod(tile) * num_tiles(shape, tile) / math.prod(shape)


def _bound(cand: TileCandidate, shape: tuple[int, ...]) -> float:
    """The lowest third component of :meth:`_Buildable.key` any option of ``cand`` can have."""
    return cand.score * border_padding(shape, cand.output_tile)


def _cannot_beat(best: "_Buildable", cand: TileCandidate, shape: tuple[int, ...]) -> bool:
    """Whether no option of ``cand`` can come before ``best`` by :meth:`_Buildable.key`: ``best``
    recomputes nothing and leaves no GEMM to SIMT that some tile could put on tensor cores (a
    depthwise convolution, a GEMM reading an inlined producer are SIMT in every tile), and
    ``cand``'s padded score is no lower than ``best``'s (a tie goes to the earlier rank, and tiles
    are tried in that order). Such a tile is not built at all (exact: the choice is the one
    building every tile makes)."""
    return (best.overlap == 1.0 and best.simt == best.unfit
            and _bound(cand, shape) >= best.cand.score * best.padding)


def _best_buildable(ranked: list[TileCandidate], works: _TileWorks, shared_limit: int, shape: tuple[int, ...], *,
                    recompute_free: bool = False) -> "_Buildable | str":
    """The best of ``ranked`` the builder can realize (by :meth:`_Buildable.key`), or why none; with
    ``recompute_free``, only tiles that recompute nothing but their border tile's padding count
    (the tiles offered as recomputing no reduction: one with a halo is no better placed than the
    ranked ones to weigh less halo against Welder's score).

    Tiles are built in the order of the lowest key they could have (their score times their border
    padding over the output ``shape``, then rank), and the search stops at the first tile that cannot
    beat the best so far (:func:`_cannot_beat`): no later one can either. Where the output ``shape``
    does not give the padding the built kernel has, every tile is built."""
    refused = "no output tile fits shared memory"
    best: _Buildable | None = None
    exact = True                # the border padding from ``shape`` is the built kernel's
    for rank, cand in sorted(enumerate(ranked), key=lambda rc: (_bound(rc[1], shape), rc[0])):
        if exact and best is not None and _cannot_beat(best, cand, shape):
            break
        try:
            work = works(cand.output_tile)
        except TileScheduleError as err:
            refused = str(err)
            continue
        exact = exact and work[-1].recompute == border_padding(shape, cand.output_tile)
        problem = ""
        options = [(work, ())]
        if any(w.tensor_core for w in work):
            options.append((_simt(work), ()))
        padded = _padded_option(works, cand.output_tile, work)
        if padded:
            options.insert(0, padded)
        for option, pads in options:
            problem = _unbuildable(option, shared_limit)
            kstep = 0
            if problem and _staging_overflows(option, shared_limit):
                stepped = _stepped_option(works, cand.output_tile, pads, option, shared_limit)
                if stepped is not None:
                    (option, kstep), problem = stepped, ""
            if not problem and recompute_free and _overlap(option) > 1.0:
                problem = f"it recomputes {_overlap(option)}x (a halo)"
            if not problem:
                found = _Buildable(rank, cand, option, pads, kstep)
                if best is None or found.key() < best.key():
                    best = found
                break
        if problem:
            refused = f"tile {cand.output_tile}: {problem}"
    return best if best is not None else refused


def _padded_option(works: _TileWorks, tile: tuple[int, ...],
                   work: list[BlockWork]) -> tuple[list[BlockWork], tuple[str, ...]] | None:
    """The tile's work with its contractions that miss tensor cores by their extents padded to
    whole fragments (:mod:`~tvm_ext.tilegraph.padding`), if that puts more of them on tensor
    cores; else None."""
    blocks = {b.name_hint: b for b, _ in sblocks(works.func)}
    names = tuple(w.name for w in work if isinstance(w.wmma, Misaligned) and w.name in blocks
                  and paddable(blocks[w.name]))
    if not names:
        return None
    try:
        padded = works(tile, names)
    except TileScheduleError:
        return None
    if sum(w.tensor_core for w in padded) <= sum(w.tensor_core for w in work):
        return None
    return padded, names


def _staging_overflows(work: list[BlockWork], shared_limit: int) -> bool:
    """Whether the kernel's shared memory exceeds ``shared_limit`` only with its tensor-core
    stages' staged operands."""
    staged = sum(w.wmma.staged_bytes for w in work if w.tensor_core)
    total = sum(w.shared_bytes() for w in work)
    return staged > 0 and total > shared_limit >= total - staged


def _stepped_option(works: _TileWorks, tile: tuple[int, ...], pads: tuple[str, ...],
                    work: list[BlockWork], shared_limit: int) -> tuple[list[BlockWork], int] | None:
    """The tile's work with its tensor-core stages staging their operands in reduction steps
    (:func:`~tvm_ext.tilegraph.tensor_core.stepped_reduction`): the largest step, a multiple of 16
    dividing a stage's reduction, with which the kernel builds; None if none does."""
    stages = [w.wmma for w in work if w.tensor_core and w.wmma.staged_bytes]
    other = sum(w.shared_bytes() for w in work) - sum(f.staged_bytes for f in stages)
    steps = sorted({k for f in stages for k in range(FRAGMENT, f.depth, FRAGMENT) if f.depth % k == 0}, reverse=True)
    for k in steps:
        # staged bytes are linear in the rows staged: the estimate picks the step, tile_work checks it
        if other + sum(f.staged_bytes * (k if stepped_reduction(k, f.depth) else f.depth) // f.depth
                       for f in stages) > shared_limit:
            continue
        try:
            stepped = works(tile, pads, k)
        except TileScheduleError:
            return None
        return (stepped, k) if not _unbuildable(stepped, shared_limit) else None
    return None


def _simt(work: list[BlockWork]) -> list[BlockWork]:
    """``work`` with every contraction one output per thread (its staged operands then not needed):
    the fallback of a tile whose tensor-core stages do not build (shared memory, warps)."""
    return [dataclasses.replace(w, wmma="the tile does not build with tensor-core stages") if w.tensor_core else w
            for w in work]


def _overlap(work: list[BlockWork]) -> float:
    """The most any block computes each of its outputs over the grid (1.0: no recomputation), apart
    from the padding of cut border tiles (the output block's own :attr:`BlockWork.recompute`, which
    every block computed per tile shares), to two decimals."""
    return round(max(w.recompute for w in work if not w.staging) / work[-1].recompute, 2)


def _unbuildable(work, shared_limit: int) -> str:
    """Why the kernel these blocks make is not worth building ('' if it is)."""
    for w in work:
        if w.recompute > MAX_RECOMPUTE and not w.staging:
            return (f"block '{w.name}' would compute {w.recompute:.1f}x its outputs (a tile that cuts what it "
                    "reads, an index map TVM's region inference does not invert, or border tiles mostly padding)")
    shared = sum(w.shared_bytes() for w in work)
    if shared > shared_limit:
        return f"{shared} B of shared memory per block exceed {shared_limit} B"
    warps = gcd_threads(work) // WARP
    uneven = [w.name for w in work if w.tensor_core and w.wmma.fragments % warps]
    if uneven:
        return f"the tensor-core fragments of {uneven} do not divide over {warps} warps"
    return ""


__all__ = ["TILES_TRIED", "MAX_VISITS", "MAX_RECOMPUTE", "edge_level", "injective", "is_planned", "plan_group",
           "whole_reduction_plan"]
