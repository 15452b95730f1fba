"""Global-memory traffic of a node group executed as a grid of output tiles (Welder §2, §3.1).

Each tile loads the regions of the group's external inputs from global memory, computes all
member nodes with the intermediates held on chip (reuse tiles, no global traffic), and stores
its output tiles. Traffic = number of tiles x (input region bytes + output tile bytes).
Every tile is charged as a representative interior tile (regions not cut by a border; the
last partial tile of a dimension is charged in full), as in Welder's cost model.

Example (Welder §2: A[98304x64] x B[64x128] -> softmax, FP32)
-------
>>> traffic(graph, [0, 1], (4, 128)).global_bytes / 2**20
840.0
>>> traffic(graph, [0, 1], (16, 128)).global_bytes / 2**20
264.0
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..errors import AnalysisError
from ..graph import OpGraph
from .footprint import FootprintReport, plan_best_fit, tile_buffers
from .propagate import TileSpec, group_members, output_tile_regions, propagate
from .region import Region, num_tiles


@dataclass(frozen=True)
class TensorTraffic:
    """One tensor of the group: its per-tile region and its share of global traffic.

    ``role`` is ``"input"`` (loaded per tile), ``"output"`` (stored per tile; it may also be read
    in the group) or ``"intermediate"`` (on chip only).
    """

    name: str
    role: str
    region: Region
    tile_bytes: int
    global_bytes: int


@dataclass(frozen=True)
class TrafficReport:
    """Traffic and footprint of one tiling of a node group.

    ``global_bytes`` = ``load_bytes + store_bytes`` over all ``num_tiles`` tiles; ``shared_bytes``
    is the best-fit on-chip footprint of one tile; ``lower_bound_bytes`` is the group's traffic
    with every external input read once and every output written once. The footprint and the
    lower bound are computed when first read: the tile graph weighs thousands of tilings by
    their traffic and plans each kernel's buffers itself, per reduction step.
    """

    members: tuple[int, ...]
    output_tiles: Mapping[str, tuple[int, ...]]
    num_tiles: int
    load_bytes: int
    store_bytes: int
    tensors: Mapping[str, TensorTraffic]
    plan_footprint: Callable[[], FootprintReport] = field(repr=False, compare=False)
    group_bound: Callable[[], int] = field(repr=False, compare=False)
    shared_capacity: int | None = None

    @cached_property
    def footprint(self) -> FootprintReport:
        """Best-fit on-chip buffers of one tile."""
        return self.plan_footprint()

    @property
    def shared_bytes(self) -> int:
        """Peak bytes of :attr:`footprint`."""
        return self.footprint.peak_bytes

    @cached_property
    def lower_bound_bytes(self) -> int:
        """The group's traffic with every external input read once and every output written once."""
        return self.group_bound()

    @property
    def global_bytes(self) -> int:
        """Bytes loaded from and stored to global memory by all tiles."""
        return self.load_bytes + self.store_bytes

    @property
    def fits_shared(self) -> bool | None:
        """Whether one tile's footprint fits the device's shared memory per block (None: no device)."""
        return None if self.shared_capacity is None else self.shared_bytes <= self.shared_capacity

    @property
    def levels(self) -> dict[str, int]:
        """Bytes per memory level: global traffic and shared-memory footprint."""
        return {"global": self.global_bytes, "shared": self.shared_bytes}


def _shared_capacity(device: Any) -> int | None:
    if device is None:
        return None
    capacity = getattr(device, "max_shared_memory_per_block", None)
    if capacity is None:
        raise AnalysisError(f"device {device!r} has no 'max_shared_memory_per_block'")
    return int(capacity)


def _tile_count(graph: OpGraph, tiles: Mapping[str, Region]) -> int:
    counts = {name: num_tiles(graph.tensors[name].shape, r.extents) for name, r in tiles.items()
              if not r.is_empty}
    if not counts:
        raise AnalysisError("no non-empty output tile given")
    if len(set(counts.values())) != 1:
        raise AnalysisError(f"output tiles give different tile counts {counts}; align them")
    return next(iter(counts.values()))


def traffic(graph: OpGraph, members: int | Iterable[int],
            output_tiles: TileSpec | Mapping[str, TileSpec], device: Any = None, *,
            alignment: int = 1, include_scratch: bool = False) -> TrafficReport:
    """Global traffic and on-chip footprint of a node group tiled by ``output_tiles``.

    Parameters
    ----------
    graph : OpGraph
        The operator graph.
    members : int or iterable of int
        The node group (executed as one kernel).
    output_tiles : tile shape, Region, or mapping of output name to either
        The output tile (see :func:`~tvm_ext.analysis.propagate.propagate`). All tiled outputs
        must give the same number of tiles.
    device : DeviceSpec, optional
        Anything with ``max_shared_memory_per_block`` (bytes); sets ``fits_shared``.
    alignment, include_scratch
        Passed to the footprint planner (:func:`~tvm_ext.analysis.footprint.footprint`).

    Returns
    -------
    TrafficReport

    Examples
    --------
    >>> r = traffic(graph, [0, 1], (16, 128))
    >>> r.num_tiles, r.global_bytes == 6144 * (16*64 + 64*128 + 16*128) * 4
    (6144, True)
    """
    order = group_members(graph, members)
    inputs, outputs = graph.boundary(order)
    tiles = output_tile_regions(graph, order, output_tiles)
    count = _tile_count(graph, tiles)
    regions = propagate(graph, order, output_tiles, interior=True)
    per_tensor: dict[str, TensorTraffic] = {}
    load = store = 0
    for name, region in regions.items():
        tile_bytes = region.nbytes(graph.tensors[name].dtype)
        if name in inputs:
            role, moved = "input", count * tile_bytes
            load += moved
        elif name in outputs:     # its tile is stored; readers in the group may need (and compute) more
            stored = tiles[name].nbytes(graph.tensors[name].dtype) if name in tiles else tile_bytes
            role, moved = "output", count * stored
            store += moved
        else:
            role, moved = "intermediate", 0
        per_tensor[name] = TensorTraffic(name, role, region, tile_bytes, moved)
    return TrafficReport(members=tuple(order), output_tiles={n: r.extents for n, r in tiles.items()},
                         num_tiles=count, load_bytes=load, store_bytes=store, tensors=per_tensor,
                         plan_footprint=lambda: plan_best_fit(tile_buffers(graph, order, regions, include_scratch),
                                                              alignment),
                         group_bound=lambda: group_traffic_default(graph, order),
                         shared_capacity=_shared_capacity(device))


def group_traffic_default(graph: OpGraph, members: int | Iterable[int]) -> int:
    """Traffic of a fused group without tile information: each external input read once and
    each escaping output written once (intermediates stay on chip).

    Examples
    --------
    >>> group_traffic_default(graph, [0, 1]) == (98304*64 + 64*128 + 98304*128) * 4
    True
    """
    return graph.boundary_bytes(group_members(graph, members))


def min_traffic(graph: OpGraph, members: int | Iterable[int]) -> int:
    """Lower bound of global traffic when every member runs as its own (unfused) kernel:
    for each node, its distinct inputs read once plus its outputs written once.

    For a single node this equals :func:`group_traffic_default`; for several nodes every
    intermediate is counted twice (written by its producer, read by its consumer kernel).

    Examples
    --------
    >>> min_traffic(graph, [0, 1]) - group_traffic_default(graph, [0, 1]) == 2 * 98304 * 128 * 4
    True
    """
    order = group_members(graph, members)
    return sum(graph.nodes[i].bytes_read + graph.nodes[i].bytes_written for i in order)
