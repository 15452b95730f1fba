"""Tile propagation over a group of OpGraph nodes (Welder §3.1, ``Propagate``).

Given the tile of every output the group writes, walk the group's nodes in reverse
topological order and ask each node's :class:`~tvm_ext.analysis.access_map.AccessMap`
which region of each input that tile needs. A tensor read by several member nodes gets the
bounding box of all demands. The result holds a region for every tensor of the group:
external inputs, intermediates (the reuse tiles) and outputs.

Example
-------
>>> regions = propagate(graph, [0, 1], (4, 128))     # matmul -> softmax, output tile [4x128]
>>> regions["A"].extents, regions["B"].extents, regions["C"].extents
((4, 64), (64, 128), (4, 128))
"""
from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence

from ..errors import AnalysisError
from ..graph import OpGraph
from .access_map import node_access_maps
from .region import Region, tile_region

#: A tile of one output: a tile shape (at the origin, or at ``tile_index``) or an explicit region.
TileSpec = Region | Sequence[int]


def group_members(graph: OpGraph, members: int | Iterable[int]) -> list[int]:
    """Member node indices in topological order; ``members`` is one index or several.

    Linear in the group, not in the graph: it runs several times per tile evaluated, and a scan
    of the whole graph's order made tile enumeration quadratic in the model (Swin-T, 1.3k nodes).

    Examples
    --------
    >>> group_members(graph, {1, 0})
    [0, 1]
    """
    wanted = {members} if isinstance(members, int) else set(members)
    if not wanted:
        raise AnalysisError("the node set is empty")
    bad = sorted(i for i in wanted if not isinstance(i, int) or not 0 <= i < len(graph.nodes))
    if bad:
        raise AnalysisError(f"graph has {len(graph.nodes)} nodes; invalid indices {bad}")
    return graph.in_topological_order(wanted)


def escaping_outputs(graph: OpGraph, members: int | Iterable[int]) -> list[str]:
    """Tensors produced in the group and read outside it (or graph outputs).

    Examples
    --------
    >>> escaping_outputs(graph, [0, 1])       # matmul -> softmax: only D leaves the group
    ['D']
    """
    return graph.boundary(group_members(graph, members))[1]


def _tile(graph: OpGraph, name: str, spec: TileSpec, tile_index: Sequence[int] | None) -> Region:
    shape = graph.tensors[name].shape
    if isinstance(spec, Region):
        if spec.rank != len(shape) or not Region.full(shape).contains(spec):
            raise AnalysisError(f"region {spec.ranges} does not fit '{name}' of shape {shape}")
        return spec
    try:
        tile = tuple(operator.index(t) for t in spec)
    except TypeError as err:
        raise AnalysisError(f"tile {spec!r} for '{name}' must be a Region or a sequence of ints") from err
    if len(tile) != len(shape):
        raise AnalysisError(f"tile {tile} for '{name}' must have {len(shape)} entries (shape {shape})")
    index = (0,) * len(shape) if tile_index is None else tuple(tile_index)
    return tile_region(shape, tile, index)


def output_tile_regions(graph: OpGraph, members: int | Iterable[int],
                        output_tiles: TileSpec | Mapping[str, TileSpec],
                        tile_index: Sequence[int] | None = None) -> dict[str, Region]:
    """Normalize ``output_tiles`` to one :class:`Region` per named output.

    A bare tile (shape or Region) applies to every escaping output of the group; a mapping
    names outputs explicitly (any tensor produced by a member node).

    Examples
    --------
    >>> output_tile_regions(graph, [0, 1], (4, 128))
    {'D': Region(ranges=((0, 4), (0, 128)))}
    """
    order = group_members(graph, members)
    if isinstance(output_tiles, Mapping):
        produced = {t for i in order for t in graph.nodes[i].outputs}
        unknown = sorted(set(output_tiles) - produced)
        if unknown:
            raise AnalysisError(f"{unknown} are not produced by the group; it produces {sorted(produced)}")
        return {name: _tile(graph, name, spec, tile_index) for name, spec in output_tiles.items()}
    return {name: _tile(graph, name, output_tiles, tile_index)
            for name in graph.boundary(order)[1]}


def propagate(graph: OpGraph, members: int | Iterable[int],
              output_tiles: TileSpec | Mapping[str, TileSpec], *,
              tile_index: Sequence[int] | None = None, interior: bool = False) -> dict[str, Region]:
    """Regions of every tensor of a node group needed to compute the given output tiles.

    Parameters
    ----------
    graph : OpGraph
        The operator graph.
    members : int or iterable of int
        One node index or the node indices of the group.
    output_tiles : tile shape, Region, or mapping of output name to either
        A tile shape (tuple of ints) means the tile at the origin (or at ``tile_index``); a
        :class:`Region` gives explicit ranges. A bare tile applies to every escaping output.
        Every escaping output must get a tile, directly or through in-group consumers.
    tile_index : sequence of int, optional
        Which tile of the grid (one index per output dimension) tile shapes refer to.
    interior : bool
        Fit regions as for a tile away from every border (extent capped at the tensor, never
        cut by it): the representative tile used for traffic and footprint.

    Returns
    -------
    dict of str to Region
        One region per tensor read or written by the group (external inputs, intermediates,
        outputs), clamped to the tensor's shape.

    Examples
    --------
    >>> r = propagate(graph, conv, (1, 4, 2, 2), tile_index=(0, 0, 1, 1))   # stride 2, pad 1
    >>> r["x"].ranges      # interior tile: rows/cols 3..7
    ((0, 1), (0, 3), (3, 5), (3, 5))
    """
    order = group_members(graph, members)
    regions: dict[str, Region] = dict(output_tile_regions(graph, order, output_tiles, tile_index))
    escaping = set(graph.boundary(order)[1])
    for index in reversed(order):
        node = graph.nodes[index]
        maps = node_access_maps(graph, index)
        for out in node.outputs:
            if out not in regions:
                if out in escaping:
                    raise AnalysisError(f"escaping output '{out}' of node '{node.name}' has no tile; "
                                        f"give one in output_tiles")
                regions[out] = Region.empty(len(graph.tensors[out].shape))
                continue
            for name, region in maps[out].input_regions(regions[out], interior).items():
                regions[name] = regions[name].union(region) if name in regions else region
    return regions
