"""Roller-style output-tile enumeration for a tile graph (Welder §3.2 ``EnumerateSubtiles``, §4.1).

Starting from the minimal hardware-aligned output tile, tiles grow one dimension at a time to the
next aligned size, only along the directions that cut the modelled traffic most (best first).
Every grown tile is propagated through the :class:`~tvm_ext.tilegraph.TileGraph`; the largest
aligned reduction step (``rstep``) whose shared footprint fits a block's shared memory is kept,
and a tile for which no step fits is pruned together with everything grown from it (a larger
tile never needs less memory). The survivors are ranked by ``(cost + 1) x waves`` (the Welder
candidate priority), where ``cost`` is the global traffic with Welder's penalties:

* uncoalesced access (§4.1): a tensor tile whose contiguous run is shorter than a memory
  transaction is charged whole transactions;
* low parallelism (§4.1): a kernel with fewer tiles than SMs has its traffic scaled by
  ``sm_count / tiles`` (the inverse of the core utilisation).

Tiles that cut no reduction: where a member holding a reduction does not depend on an output
dimension (a layer norm's row statistics under the GEMM columns it feeds), every tile along that
dimension recomputes it, and Welder's score, which prices traffic and waves only, can rank the
tile whole along it (13 blocks of 16 x 768 for a 197 x 768 layer norm -> GEMM) below every tile
that recomputes the norm 2-48 times. Growth also starts from the smallest such tile, and those
that fit are returned after the ranked ones, so the planner can always weigh a kernel that
computes every reduction once.

Alignment: the innermost output dimension grows in steps of one transaction; with a TensorCore
node (a 16-bit matmul) the last two output dimensions and the reduction step are multiples of
the MMA fragment (or the full dimension when smaller).

Example
-------
>>> tg = TileGraph(graph, [0, 1]); tg.set_connect("C", "shared")
>>> best = enumerate_tiles(tg, load_device("h100"))[0]
>>> best.output_tile, best.rstep, best.global_bytes / 2**20
((32, 128), 32, 168.0)
"""
from __future__ import annotations

import dataclasses
import heapq
import logging
import math
from collections.abc import Sequence

from ..analysis import element_bytes
from ..graph import is_reduction, sblocks
from ..hardware import DeviceSpec, device_from_target, occupancy
from .reduction import matmul_nodes
from .tile_graph import KernelTile, TileGraph, TileGraphError

logger = logging.getLogger(__name__)

#: Candidates returned: Welder §5.3 profiles "20 per subgraph" (Table 5 discussion).
DEFAULT_TOP_K = 20
#: MMA fragment edge for M, N and K: Welder §4.1 (tile axes "an integral multiple of the fragment
#: size of the MMA operations"); CUDA C++ Programming Guide, "Warp Matrix Functions": m16n16k16 for
#: __half / __nv_bfloat16 (also PTX ISA mma.m16n8k16: M and K are 16, N = 8 divides 16).
MMA_FRAGMENT = 16
#: *assumed*: threads per block before any schedule exists. Welder §4.1 falls back to the hardware
#: parallelism (128 threads on V100: 4 warp schedulers x 32) when the tiles give no common block size.
ASSUMED_THREADS_PER_BLOCK = 128
#: *assumed*: registers per thread for the occupancy estimate; no kernel is compiled yet, so 32
#: (the default of :func:`tvm_ext.hardware.occupancy`, a simple streaming kernel) stands in.
ASSUMED_REGISTERS_PER_THREAD = 32
#: *assumed*: traffic-cutting growth directions expanded per tile. Welder §4.1 expands only "the
#: dimensions that can reduce traffic the most"; keeping the best two lets a 2-D tile reach
#: balanced shapes without exploring every dimension.
DEFAULT_BRANCH = 2
#: *assumed*: bound on evaluated tiles, so a graph with many dimensions stays cheap (each
#: evaluation is one propagation, a few milliseconds).
DEFAULT_MAX_VISITS = 256


@dataclasses.dataclass(frozen=True)
class TileCandidate:
    """One ranked output tile of a tile graph.

    Attributes
    ----------
    output_tile : tuple of int
        Tile of the tile graph's output(s).
    rstep : int or None
        Reduction step of matmul-like nodes (None: no matmul-like node).
    global_bytes : int
        Modelled global traffic (:meth:`TileGraph.mem_traffic`).
    cost : float
        ``global_bytes`` with the uncoalesced and parallelism penalties.
    uncoalesced_bytes : float
        Extra bytes charged for accesses shorter than a transaction.
    shared_bytes, register_bytes : int
        Largest per-kernel shared footprint and register-level reuse bytes of one tile.
    num_tiles : tuple of int
        Tiles (thread blocks) of each kernel.
    blocks_per_sm : tuple of int
        Estimated resident blocks per SM of each kernel.
    waves : int
        Sum over kernels of ``ceil(tiles / (sm_count x blocks_per_sm))``.
    score : float
        ``(cost + 1) x waves``; lower is better.
    whole_reductions : bool
        Some member's reduction does not depend on an output dimension, and the tile is whole
        along every such dimension: no block recomputes a reduction another computes.
    offered : bool
        Returned outside the top-k, as such a tile, whatever its score (see :func:`enumerate_tiles`).
    """

    output_tile: tuple[int, ...]
    rstep: int | None
    global_bytes: int
    cost: float
    uncoalesced_bytes: float
    shared_bytes: int
    register_bytes: int
    num_tiles: tuple[int, ...]
    blocks_per_sm: tuple[int, ...]
    waves: int
    score: float
    whole_reductions: bool = False
    offered: bool = False


def coalesced_run(tile: Sequence[int], shape: Sequence[int]) -> int:
    """Contiguous elements of a row-major tile: the innermost extent, times the next ones while the
    tile spans whole dimensions (Roller's ``coalesced_factor``).

    Examples
    --------
    >>> coalesced_run((4, 8), (100, 128)), coalesced_run((4, 128), (100, 128))
    (8, 512)
    """
    run = 1
    for t, s in zip(reversed(tuple(tile)), reversed(tuple(shape))):
        run *= t
        if t != s:
            break
    return run


def uncoalesced_extra(kernel: KernelTile, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str],
                      transaction_bytes: int) -> float:
    """Extra bytes a kernel moves because some tensor tiles have runs shorter than a transaction.

    A run of ``r`` elements of ``b`` bytes costs ``ceil(r*b / T)`` transactions of ``T`` bytes.
    """
    extra = 0.0
    for t in kernel.traffic.tensors.values():
        if t.global_bytes == 0 or t.region.is_empty:
            continue
        run_bytes = coalesced_run(t.region.extents, shapes[t.name]) * element_bytes(dtypes[t.name])
        charged = math.ceil(run_bytes / transaction_bytes) * transaction_bytes
        extra += t.global_bytes * (charged / run_bytes - 1.0)
    return extra


def _ladder(dim: int, step: int) -> list[int]:
    """Aligned sizes of one dimension: ``step * 2**j`` below ``dim``, then ``dim`` itself."""
    sizes, size = [], step
    while size < dim:
        sizes.append(size)
        size *= 2
    return sizes + [dim]


class _Search:
    """State of one enumeration (see :func:`enumerate_tiles`)."""

    def __init__(self, tg: TileGraph, device: DeviceSpec, capacity: int, transaction_bytes: int):
        self.tg, self.device, self.capacity, self.trans = tg, device, capacity, transaction_bytes
        graph = tg.graph
        self.shapes = {n: t.shape for n, t in graph.tensors.items()}
        self.dtypes = {n: t.dtype for n, t in graph.tensors.items()}
        self.mma = matmul_nodes(graph, tg.members)
        outs = tg.outputs
        shapes = {graph.tensors[o].shape for o in outs}
        if len(shapes) != 1:
            raise TileGraphError(f"a tile kernel's outputs share one tile, so enumeration needs outputs of one shape; "
                                 f"{outs} have shapes {sorted(shapes)}")
        self.shape = shapes.pop()
        if not self.shape:
            raise TileGraphError("enumeration needs outputs of rank >= 1")
        steps = [1] * len(self.shape)
        elem = max(element_bytes(graph.tensors[o].dtype) for o in outs)
        steps[-1] = max(1, transaction_bytes // elem)   # one transaction along the innermost dim
        self.tensor_core = any(m.tensor_core for m in self.mma)
        if self.tensor_core:
            for d in range(max(0, len(steps) - 2), len(steps)):
                steps[d] = math.lcm(steps[d], MMA_FRAGMENT)
        self.ladders = [_ladder(s, min(st, s)) for s, st in zip(self.shape, steps)]
        kmax = max((m.reduce_extent for m in self.mma), default=0)
        kelem = max((element_bytes(m.dtype) for m in self.mma), default=4)
        kstep = MMA_FRAGMENT if self.tensor_core else max(1, transaction_bytes // kelem)
        # rsteps, largest first: None = the whole reduction axis per load
        self.rsteps: list[int | None] = [None]
        if self.mma:
            self.rsteps += [r for r in reversed(_ladder(kmax, min(kstep, kmax))) if r < kmax]
        self.visited: dict[tuple[int, ...], TileCandidate | None] = {}
        self.over_footprint: dict[tuple[int, ...], TileCandidate] = {}
        self._costs: dict[tuple[int, ...], tuple[float, int, list[KernelTile]]] = {}

    def traffic_cost(self, tile: tuple[int, ...]) -> tuple[float, int, list[KernelTile]]:
        """Growth key: traffic plus the uncoalesced penalty (no rstep: traffic does not depend on it)."""
        if tile in self._costs:
            return self._costs[tile]
        self.tg.propagate(tile)
        kernels = self.tg.kernel_tiles()
        raw = sum(k.global_bytes for k in kernels)
        extra = sum(uncoalesced_extra(k, self.shapes, self.dtypes, self.trans) for k in kernels)
        self._costs[tile] = (raw + extra, raw, kernels)
        return self._costs[tile]

    def aligned(self, tile: tuple[int, ...], rstep: int | None) -> bool:
        """TensorCore alignment: last two output axes and the reduction step of each 16-bit matmul."""
        regions = self.tg.config.regions if self.tg.config is not None else {}
        if not regions:
            return False
        for m in self.mma:
            if not m.tensor_core:
                continue
            shape, ext = self.shapes[m.output], regions[m.output].extents
            for e, s in list(zip(ext, shape))[-2:]:
                if e % MMA_FRAGMENT and e != s:
                    return False
            k = m.reduce_extent if rstep is None else min(rstep, m.reduce_extent)
            if k % MMA_FRAGMENT and k != m.reduce_extent:
                return False
        return True

    def evaluate(self, tile: tuple[int, ...]) -> TileCandidate | None:
        """The candidate for ``tile`` with the largest fitting rstep, or None if none fits."""
        if tile in self.visited:
            return self.visited[tile]
        cost, raw, _ = self.traffic_cost(tile)
        found = None
        for rstep in self.rsteps:
            self.tg.propagate(tile, rstep)
            kernels = self.tg.kernel_tiles()
            shared = max(k.shared.peak_bytes for k in kernels)
            if shared <= self.capacity and self.aligned(tile, rstep):
                found = self._candidate(tile, rstep, kernels, cost, raw)
                break
        self.visited[tile] = found
        logger.debug("tile %s -> %s", tile, "pruned" if found is None else f"score {found.score:.4g}")
        return found

    def _candidate(self, tile: tuple[int, ...], rstep: int | None, kernels: list[KernelTile], cost: float,
                   raw: int) -> TileCandidate:
        sm = self.device.sm_count
        counts, blocks, waves, penalized = [], [], 0, 0.0
        for k in kernels:
            # an offered tile over the capacity counts as holding all of it (its real buffers are the builder's)
            occ = occupancy(self.device, ASSUMED_THREADS_PER_BLOCK, ASSUMED_REGISTERS_PER_THREAD,
                            min(k.shared.peak_bytes, self.capacity))
            kcost = k.global_bytes + uncoalesced_extra(k, self.shapes, self.dtypes, self.trans)
            if k.num_tiles < sm:          # Welder §4.1: traffic scaled by the core utilisation
                kcost *= sm / k.num_tiles
            penalized += kcost
            counts.append(k.num_tiles)
            blocks.append(occ.blocks_per_sm)
            waves += occ.waves(k.num_tiles)
        return TileCandidate(
            output_tile=tile, rstep=rstep if self.mma else None, global_bytes=raw, cost=penalized,
            uncoalesced_bytes=cost - raw, shared_bytes=max(k.shared.peak_bytes for k in kernels),
            register_bytes=max(k.register_bytes for k in kernels), num_tiles=tuple(counts),
            blocks_per_sm=tuple(blocks), waves=waves, score=(penalized + 1.0) * waves)

    def whole_reduction_dims(self) -> tuple[int, ...]:
        """Output dimensions along which some member holding a reduction (a layer norm's mean, a
        GEMM feeding another) reads the same region whatever the tile's position: a tile that cuts
        such a dimension recomputes that reduction in every tile along it. Found by growing the
        minimal tile one step along each dimension and seeing which reduced tensors' (interior)
        regions do not grow."""
        graph, outs = self.tg.graph, set(self.tg.outputs)
        reduced = [t for n in self.tg.members if graph.nodes[n].func is not None
                   and any(is_reduction(b) for b, _ in sblocks(graph.nodes[n].func))
                   for t in graph.nodes[n].outputs if t not in outs]
        if not reduced:
            return ()
        start = tuple(ladder[0] for ladder in self.ladders)

        def volumes(tile: tuple[int, ...]) -> list[int]:
            regions = self.tg.propagate(tile).regions
            return [math.prod(regions[t].extents) for t in reduced]

        base = volumes(start)
        dims = []
        for d, ladder in enumerate(self.ladders):
            if len(ladder) > 1 and any(a == b for a, b in zip(volumes(start[:d] + (ladder[1],) + start[d + 1:]), base)):
                dims.append(d)
        return tuple(dims)

    def whole_reduction_seed(self, dims: tuple[int, ...]) -> tuple[int, ...]:
        """The smallest aligned tile whole along ``dims`` (see :meth:`whole_reduction_dims`)."""
        return tuple(ladder[-1] if d in dims else ladder[0] for d, ladder in enumerate(self.ladders))

    def offer(self, tile: tuple[int, ...]) -> TileCandidate | None:
        """:meth:`evaluate`, or where Welder's footprint prunes ``tile``, its candidate at the smallest
        aligned rstep anyway (kept in :attr:`over_footprint`, never grown). That footprint holds every
        input and output tile in shared memory; the builder keeps outputs in registers, reads
        other inputs through L1 and stages tensor-core operands in steps, and checks its own
        buffers (a layer norm -> 4096-wide GEMM in 16 x 4096 tiles: 324 KiB by Welder's count,
        160 KiB as built)."""
        found = self.evaluate(tile)
        if found is not None:
            return found
        cost, raw, _ = self.traffic_cost(tile)
        for rstep in reversed(self.rsteps):
            self.tg.propagate(tile, rstep)
            if self.aligned(tile, rstep):
                self.over_footprint[tile] = self._candidate(tile, rstep, self.tg.kernel_tiles(), cost, raw)
                break
        return None

    def grow(self, tile: tuple[int, ...]) -> list[tuple[int, ...]]:
        """One-step growths of ``tile`` along each dimension: the next aligned size and, where that
        does not divide the dimension, the next one that does (or the whole dimension). A size that
        cuts the dimension charges its border tile whole, so it can cost more than both its
        neighbours (512 of 768 columns): growth, which never adds traffic, would stop there."""
        out = []
        for d, size in enumerate(tile):
            bigger = [s for s in self.ladders[d] if s > size]
            dim = self.shape[d]
            dividing = [s for s in bigger if dim % s == 0]
            for s in dict.fromkeys(bigger[:1] + dividing[:1]):
                out.append(tile[:d] + (s,) + tile[d + 1:])
        return out


def enumerate_tiles(tile_graph: TileGraph, device: DeviceSpec | str, *, top_k: int = DEFAULT_TOP_K,
                    shared_capacity: int | None = None, transaction_bytes: int | None = None,
                    branch: int = DEFAULT_BRANCH, max_visits: int = DEFAULT_MAX_VISITS,
                    builder_checks_shared: bool = False) -> list[TileCandidate]:
    """Enumerate, prune and rank output tiles of a tile graph (Welder §3.2 / §4.1, Roller growth).

    Parameters
    ----------
    tile_graph : TileGraph
        The tile graph with its connect levels set; its :attr:`~TileGraph.config` is left at the
        best candidate (or at the last evaluated tile if none fits).
    device : DeviceSpec or str
        The device, or anything :func:`tvm_ext.hardware.device_from_target` accepts.
    top_k : int
        Candidates returned (Welder profiles 20).
    shared_capacity : int, optional
        Shared bytes one block may use; defaults to the device's ``max_shared_memory_per_block``
        (the limit without opt-in). At most ``max_shared_memory_per_block_optin``.
    transaction_bytes : int, optional
        Global-memory transaction width; defaults to the device's ``dram`` level
        ``transaction_bytes`` (the 32-byte L2/DRAM sector, sourced in the device file). Welder
        §4.1 quotes a 128-byte coalesced transaction (a whole line): pass 128 for that setting.
    branch, max_visits : int
        Growth directions expanded per tile, and the bound on evaluated tiles.
    builder_checks_shared : bool
        The caller checks the shared memory its builder needs: offer the smallest tile that
        recomputes no reduction even where Welder's footprint prunes it (:meth:`_Search.offer`).

    Returns
    -------
    list of TileCandidate
        At most ``top_k``, best (lowest score) first; then, outside those, at most ``top_k``
        fitting tiles that recompute no reduction (whole along every dimension a reducing member
        does not depend on), best first, and with ``builder_checks_shared`` the smallest such tile
        if Welder's footprint prunes it. Empty if no tile fits and none is offered.
    """
    spec = device if isinstance(device, DeviceSpec) else device_from_target(device)
    capacity = spec.max_shared_memory_per_block if shared_capacity is None else int(shared_capacity)
    if not 0 < capacity <= spec.max_shared_memory_per_block_optin:
        raise TileGraphError(f"shared capacity {capacity} must be in 1..{spec.max_shared_memory_per_block_optin} "
                             f"(the opt-in maximum of {spec.name})")
    trans = spec.level("dram").transaction_bytes if transaction_bytes is None else int(transaction_bytes)
    if trans <= 0 or top_k <= 0 or branch <= 0 or max_visits <= 0:
        raise TileGraphError("transaction_bytes, top_k, branch and max_visits must be positive")
    search = _Search(tile_graph, spec, capacity, trans)
    start = tuple(ladder[0] for ladder in search.ladders)
    whole = search.whole_reduction_dims()
    heap: list[tuple[float, tuple[int, ...]]] = []
    if search.evaluate(start) is not None:
        heapq.heappush(heap, (search.traffic_cost(start)[0], start))
    seed = search.whole_reduction_seed(whole)
    if whole and (search.offer(seed) if builder_checks_shared else search.evaluate(seed)) is not None:
        heapq.heappush(heap, (search.traffic_cost(seed)[0], seed))
    while heap and len(search.visited) < max_visits:
        cost, tile = heapq.heappop(heap)
        grown = []
        for nxt in search.grow(tile):
            if nxt in search.visited:
                continue
            ncost, _, kernels = search.traffic_cost(nxt)
            if ncost <= cost:      # only directions that do not add traffic; best first
                grown.append((ncost, sum(k.num_tiles for k in kernels), nxt))
        for ncost, _, nxt in sorted(grown)[:branch]:
            if search.evaluate(nxt) is not None:   # pruned tiles are never grown further
                heapq.heappush(heap, (ncost, nxt))
    found = sorted((c for c in search.visited.values() if c is not None),
                   key=lambda c: (c.score, c.global_bytes, c.output_tile))
    if whole:
        found = [dataclasses.replace(c, whole_reductions=all(c.output_tile[d] == search.shape[d] for d in whole))
                 for c in found]
    ranked = found[:top_k]
    # the tiles that recompute no reduction are offered whatever their rank
    extra = [c for c in found[top_k:] if c.whole_reductions][:top_k]
    over = [dataclasses.replace(c, whole_reductions=True) for c in search.over_footprint.values()]
    ranked += [dataclasses.replace(c, offered=True) for c in (*extra, *over)]
    logger.info("enumerated %d tiles for %r: %d fit, best %s", len(search.visited), tile_graph, len(found),
                ranked[0].output_tile if ranked else None)
    if ranked:
        tile_graph.propagate(ranked[0].output_tile, ranked[0].rstep)
    return ranked
