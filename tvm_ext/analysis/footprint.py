"""On-chip footprint of one tile of a node group: best-fit allocation over tile lifetimes.

Welder §3.1: "the minimum memory footprint for the tile-graph can be calculated using a
memory allocation algorithm (e.g., best-fit) by allocating all data tiles in a topological
order". Here the member nodes run in topological order; at each node's step the regions of
its not yet loaded external inputs and of its outputs are allocated, then every buffer whose
last in-group reader is this node is freed (escaping outputs stay until the final store).
A freed block is reused by the smallest free block that fits (best fit); the footprint is the
allocator's high-water mark.

Example
-------
>>> plan_best_fit([Buffer("a", 100, 0, 0), Buffer("b", 50, 1, 1)]).peak_bytes
100
"""
from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import AnalysisError
from ..graph import OpGraph
from .access_map import node_access_maps
from .propagate import TileSpec, group_members, propagate
from .region import Region


class BestFitAllocator:
    """A linear arena with best-fit reuse of freed blocks (adjacent free blocks coalesce).

    Examples
    --------
    >>> alloc = BestFitAllocator()
    >>> a, b, c = alloc.malloc(64), alloc.malloc(16), alloc.malloc(32)
    >>> alloc.free(a); alloc.free(c)          # holes: [0, 64) and [80, 112) -> top shrinks to 80
    >>> alloc.malloc(8), alloc.peak
    (0, 112)
    """

    def __init__(self, alignment: int = 1):
        if alignment <= 0:
            raise AnalysisError(f"alignment must be positive, got {alignment}")
        self.alignment = alignment
        self.top = 0
        self.peak = 0
        self._free: list[tuple[int, int]] = []  # (offset, size), sorted by offset
        self._live: dict[int, int] = {}

    def _round(self, size: int) -> int:
        return -(-size // self.alignment) * self.alignment

    def malloc(self, size: int) -> int:
        """Reserve ``size`` bytes (rounded up to the alignment); returns the offset."""
        if size < 0:
            raise AnalysisError(f"cannot allocate {size} bytes")
        size = self._round(size)
        fits = [(blk, off) for off, blk in self._free if blk >= size]
        if fits:
            blk, off = min(fits)
            self._free.remove((off, blk))
            if blk > size:
                bisect.insort(self._free, (off + size, blk - size))
        else:
            off = self.top
            self.top += size
            self.peak = max(self.peak, self.top)
        self._live[off] = size
        return off

    def free(self, offset: int) -> None:
        """Release the block at ``offset`` (merged with free neighbours; the arena top shrinks)."""
        if offset not in self._live:
            raise AnalysisError(f"no live block at offset {offset}")
        size = self._live.pop(offset)
        if size == 0:
            return
        bisect.insort(self._free, (offset, size))
        merged: list[tuple[int, int]] = []
        for off, blk in self._free:
            if merged and merged[-1][0] + merged[-1][1] == off:
                merged[-1] = (merged[-1][0], merged[-1][1] + blk)
            else:
                merged.append((off, blk))
        if merged and merged[-1][0] + merged[-1][1] == self.top:
            self.top = merged.pop()[0]
        self._free = merged


@dataclass(frozen=True)
class Buffer:
    """A buffer to place: ``size`` bytes live from step ``first`` to step ``last`` (inclusive)."""

    name: str
    size: int
    first: int
    last: int


@dataclass(frozen=True)
class Placement:
    """Where a buffer went."""

    name: str
    offset: int
    size: int
    first: int
    last: int


@dataclass(frozen=True)
class FootprintReport:
    """Peak on-chip bytes of one tile and the placement of every buffer."""

    peak_bytes: int
    placements: tuple[Placement, ...]

    @property
    def total_bytes(self) -> int:
        """Sum of all buffer sizes (the footprint without any reuse)."""
        return sum(p.size for p in self.placements)

    def offset(self, name: str) -> int:
        """Offset of buffer ``name``."""
        for p in self.placements:
            if p.name == name:
                return p.offset
        raise KeyError(name)


def plan_best_fit(buffers: Sequence[Buffer], alignment: int = 1) -> FootprintReport:
    """Place buffers step by step: at each step allocate the buffers starting there (in the
    given order), then free those whose last step it is.

    Examples
    --------
    >>> plan_best_fit([Buffer("x", 8, 0, 1), Buffer("y", 8, 1, 1)]).peak_bytes
    16
    """
    for b in buffers:
        if b.last < b.first or b.size < 0:
            raise AnalysisError(f"invalid buffer {b}")
    alloc = BestFitAllocator(alignment)
    steps = sorted({b.first for b in buffers} | {b.last for b in buffers})
    offsets: dict[int, int] = {}
    for step in steps:
        for i, b in enumerate(buffers):
            if b.first == step:        # an empty buffer (a zero-size tensor) takes no memory
                offsets[i] = alloc.malloc(b.size) if b.size else 0
        for i, b in enumerate(buffers):
            if b.last == step and b.size:
                alloc.free(offsets[i])
    placements = tuple(Placement(b.name, offsets[i], alloc._round(b.size), b.first, b.last)
                       for i, b in enumerate(buffers))
    return FootprintReport(alloc.peak, placements)


def tile_buffers(graph: OpGraph, members: int | Iterable[int], regions: Mapping[str, Region],
                 include_scratch: bool = False) -> list[Buffer]:
    """Buffers (with lifetimes in member steps) for one tile of the group, given its regions.

    Examples
    --------
    >>> regions = propagate(graph, [0, 1], (4, 128), interior=True)
    >>> [(b.name, b.size, b.first, b.last) for b in tile_buffers(graph, [0, 1], regions)]
    [('A', 1024, 0, 0), ('B', 32768, 0, 0), ('C', 2048, 0, 1), ('D', 2048, 1, 1)]
    """
    order = group_members(graph, members)
    inside = set(order)
    escaping = set(graph.boundary(order)[1])
    last_step = len(order) - 1
    step_of = {index: s for s, index in enumerate(order)}
    buffers: list[Buffer] = []
    placed: set[str] = set()

    def last_use(name: str, default: int) -> int:
        readers = [step_of[c] for c in graph.tensors[name].consumers if c in inside]
        return max(readers, default=default)

    for step, index in enumerate(order):
        node = graph.nodes[index]
        for name in dict.fromkeys(node.inputs):
            if graph.tensors[name].producer not in inside and name not in placed:
                placed.add(name)
                size = regions[name].nbytes(graph.tensors[name].dtype)
                buffers.append(Buffer(name, size, step, last_use(name, step)))
        for name in node.outputs:
            placed.add(name)
            size = regions[name].nbytes(graph.tensors[name].dtype)
            end = last_step if name in escaping else last_use(name, step)
            buffers.append(Buffer(name, size, step, end))
        if include_scratch:
            for out in node.outputs:
                if regions[out].is_empty:
                    continue
                amap = node_access_maps(graph, index)[out]
                for buf, region in amap.scratch_regions(regions[out], interior=True).items():
                    size = region.nbytes(amap.scratch_dtypes[buf])
                    buffers.append(Buffer(f"{node.name}/{buf}", size, step, step))
    return buffers


def footprint(graph: OpGraph, members: int | Iterable[int],
              output_tiles: TileSpec | Mapping[str, TileSpec], *, alignment: int = 1,
              include_scratch: bool = False) -> FootprintReport:
    """On-chip bytes of one (interior) tile of a node group, best-fit over tile lifetimes.

    Parameters
    ----------
    graph, members, output_tiles
        As for :func:`~tvm_ext.analysis.propagate.propagate`.
    alignment : int
        Round every buffer up to this many bytes (e.g. 32 for TensorCore fragments).
    include_scratch : bool
        Also place each node's own intermediate buffers (softmax's max/exp/sum rows) for
        the duration of its step. Off by default: schedules usually inline them.

    Examples
    --------
    >>> footprint(graph, [0, 1], (4, 128)).peak_bytes    # A 1 KiB, B 32 KiB, C reused for D
    35840
    """
    regions = propagate(graph, members, output_tiles, interior=True)
    return plan_best_fit(tile_buffers(graph, members, regions, include_scratch), alignment)
