"""TileGraph: Welder's tile-level data-flow graph over a convex set of OpGraph nodes (Welder §3.1).

Nodes are operator-tiles (one OpGraph node computing one output tile); edges are the tensors
flowing between member nodes, each with a *connect level*: ``global`` (level 0, DRAM: the
producer stores the tensor and the consumer loads it, i.e. two kernels), ``shared`` (level 1:
the reuse tile stays in shared memory) or ``register`` (level 2: the reuse tile stays in
registers, an inlined producer). The Welder scheduling API maps onto methods:

* ``SetConnect(edge, level)``  -> :meth:`TileGraph.set_connect`;
* ``Propagate(g, config)``     -> :meth:`TileGraph.propagate` (output tile + optional rstep);
* ``MemTraffic(g)``            -> :meth:`TileGraph.mem_traffic` (global bytes);
* ``MemFootprint(g)``          -> :meth:`TileGraph.mem_footprint` (bytes per level);
* ``ExtractSubgraph(n, L)``    -> :meth:`TileGraph.subgraphs` / :meth:`TileGraph.hierarchy`.

Example (Welder §2: A[98304x64] x B[64x128] -> softmax, FP32)
-------
>>> tg = TileGraph(graph, [0, 1])
>>> tg.set_connect("C", "shared")
>>> tg.propagate((16, 128)); tg.mem_traffic() / 2**20
264.0
>>> tg.set_connect("C", "global"); tg.mem_traffic() / 2**20     # + C stored and loaded again
360.0
"""
from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..analysis import (FootprintReport, Region, TileSpec, TrafficReport, group_members, output_tile_regions,
                        plan_best_fit, propagate, tile_buffers, traffic)
from ..errors import AnalysisError
from ..graph import OpGraph, components
from .reduction import matmul_nodes, rstep_regions

logger = logging.getLogger(__name__)

#: Shared-memory buffer alignment when a kernel holds a TensorCore node: Welder §4.2 ("aligning to
#: 32 bytes to avoid misaligned address access" for TensorCore operations).
TENSOR_CORE_ALIGNMENT_BYTES = 32


class TileGraphError(AnalysisError):
    """A tile graph was given an invalid node set, edge, level or tile."""


class NonConvexError(TileGraphError):
    """A node set (or a sub-graph joined by on-chip edges) has a path that leaves it and re-enters."""


class UnknownEdgeError(TileGraphError):
    """An edge key names no edge between two member nodes of the tile graph."""


class ConnectLevel(enum.IntEnum):
    """Memory level at which an edge's reuse tile lives (Welder Table 1: 0 = the lowest, DRAM)."""

    GLOBAL = 0
    SHARED = 1
    REGISTER = 2

    @property
    def label(self) -> str:
        """Lower-case name: ``"global"``, ``"shared"`` or ``"register"``."""
        return self.name.lower()

    @classmethod
    def parse(cls, level: "ConnectLevel | str | int") -> "ConnectLevel":
        """A level from its enum value, its name (any case) or its number.

        Examples
        --------
        >>> ConnectLevel.parse("shared"), ConnectLevel.parse(2)
        (<ConnectLevel.SHARED: 1>, <ConnectLevel.REGISTER: 2>)
        """
        if isinstance(level, cls):
            return level
        if isinstance(level, str) and level.upper() in cls.__members__:
            return cls[level.upper()]
        if isinstance(level, int) and not isinstance(level, bool) and level in {m.value for m in cls}:
            return cls(level)
        raise TileGraphError(f"unknown connect level {level!r}; use one of {[m.label for m in cls]}")


@dataclass(frozen=True, order=True)
class Edge:
    """A tensor from one member node to another: ``producer --tensor--> consumer``."""

    tensor: str
    producer: int
    consumer: int


@dataclass(frozen=True)
class TileConfig:
    """Result of :meth:`TileGraph.propagate`: the tile of every tensor and node for one output tile.

    ``regions`` are interior regions (a representative tile away from the borders); ``rstep`` is the
    reduction step of matmul-like nodes (None: the whole reduction axis at once).
    """

    output_tiles: Mapping[str, tuple[int, ...]]
    regions: Mapping[str, Region]
    node_tiles: Mapping[int, tuple[int, ...]]
    rstep: int | None = None

    def tile(self, tensor: str) -> tuple[int, ...]:
        """Tile shape (extents) of ``tensor``."""
        if tensor not in self.regions:
            raise TileGraphError(f"tensor '{tensor}' is not part of the tile graph")
        return self.regions[tensor].extents


@dataclass(frozen=True)
class KernelTile:
    """One level-0 sub-graph (a kernel): its members, output tiles, traffic and footprint."""

    members: tuple[int, ...]
    output_tiles: Mapping[str, tuple[int, ...]]
    traffic: TrafficReport
    shared: FootprintReport
    register_bytes: int
    step_regions: Mapping[str, Region]

    @property
    def num_tiles(self) -> int:
        """Tiles (thread blocks) of this kernel's grid."""
        return self.traffic.num_tiles

    @property
    def global_bytes(self) -> int:
        """Global bytes this kernel loads and stores."""
        return self.traffic.global_bytes


class TileGraph:
    """A tile graph over a convex set of OpGraph nodes (see the module docstring).

    Parameters
    ----------
    graph : OpGraph
        The operator graph.
    members : int or iterable of int
        Node indices of the sub-graph; the set must be convex.
    level : ConnectLevel or str or int
        Initial connect level of every edge (Welder's default is 0: ``global``).

    Raises
    ------
    NonConvexError
        If a path leaves the node set and re-enters it.
    AnalysisError
        If the set is empty or holds an invalid index.
    """

    def __init__(self, graph: OpGraph, members: int | Iterable[int],
                 level: ConnectLevel | str | int = ConnectLevel.GLOBAL):
        order = group_members(graph, members)
        if not graph.is_convex(order):
            names = [graph.nodes[i].name for i in order]
            raise NonConvexError(f"node set {order} ({names}) is not convex: a path leaves it and re-enters")
        self.graph = graph
        self.members: tuple[int, ...] = tuple(order)
        inside = set(order)
        self.edges: tuple[Edge, ...] = tuple(
            Edge(t, p, c) for p in order for t in graph.nodes[p].outputs
            for c in sorted(set(graph.tensors[t].consumers)) if c in inside)
        start = ConnectLevel.parse(level)
        self._levels: dict[Edge, ConnectLevel] = {e: start for e in self.edges}
        self.config: TileConfig | None = None
        # enumeration propagates each tile once per reduction step tried; neither the regions of a
        # tile nor a kernel's traffic depend on the step (nor on levels: a kernel is keyed by its nodes)
        self._regions: dict[tuple[int, ...], tuple[dict, dict]] = {}
        self._traffic: dict[tuple, TrafficReport] = {}
        # enumeration asks for the kernel tiles of a tile once to rank it and again to size it
        self._kernel_tiles: dict[tuple, list[KernelTile]] = {}
        self._config_key: tuple | None = None
        #: Tile configurations priced so far (each a propagation or a pricing of every kernel's
        #: traffic and footprint not remembered from before): the effort planning charges.
        self.evaluations = 0
        self._check_partitions()

    # ------------------------------------------------------------------ structure
    @property
    def inputs(self) -> list[str]:
        """Tensors the tile graph loads from outside."""
        return self.graph.boundary(self.members)[0]

    @property
    def outputs(self) -> list[str]:
        """Tensors the tile graph produces for the outside (its escaping outputs)."""
        return self.graph.boundary(self.members)[1]

    def resolve(self, key: Edge | str | tuple[int, int]) -> tuple[Edge, ...]:
        """The edges a key names: an :class:`Edge`, a tensor name (all its member consumers) or a
        ``(producer, consumer)`` index pair (all tensors between them).

        Raises
        ------
        UnknownEdgeError
            If the key names no edge of this tile graph.
        """
        if isinstance(key, Edge):
            found = tuple(e for e in self.edges if e == key)
        elif isinstance(key, str):
            found = tuple(e for e in self.edges if e.tensor == key)
        elif isinstance(key, tuple) and len(key) == 2 and all(isinstance(k, int) for k in key):
            found = tuple(e for e in self.edges if (e.producer, e.consumer) == key)
        else:
            raise UnknownEdgeError(f"an edge key is an Edge, a tensor name or a (producer, consumer) pair, "
                                   f"not {key!r}")
        if not found:
            known = [f"{e.tensor}: {e.producer}->{e.consumer}" for e in self.edges] or ["none"]
            raise UnknownEdgeError(f"no edge {key!r} between member nodes {list(self.members)}; "
                                   f"edges: {', '.join(known)}")
        return found

    def connect_level(self, key: Edge | str | tuple[int, int]) -> ConnectLevel:
        """Connect level of an edge (the lowest one if the key names several edges)."""
        return min(self._levels[e] for e in self.resolve(key))

    def set_connect(self, key: Edge | str | tuple[int, int], level: ConnectLevel | str | int) -> None:
        """Set the connect level of the edge(s) ``key`` names (Welder ``SetConnect``).

        Raises
        ------
        UnknownEdgeError
            If ``key`` names no edge.
        NonConvexError
            If the change makes a sub-graph joined by on-chip edges non-convex (it is undone).
        """
        self.set_connects({key: level})

    def set_connects(self, levels: Mapping[Edge | str | tuple[int, int], ConnectLevel | str | int]) -> None:
        """Set the connect levels of several edges at once, then check the sub-graphs once.

        Edge by edge, a convex end state can pass through a non-convex one: with a skip edge
        ``a -> d`` beside ``a -> b -> c -> d``, connecting ``a -> d`` first joins ``a`` and ``d``
        while the path through ``b`` and ``c`` still leaves them (NAFNet's blocks).

        Raises
        ------
        UnknownEdgeError
            If a key names no edge.
        NonConvexError
            If the new levels make a sub-graph joined by on-chip edges non-convex (all are undone).
        """
        new = {e: ConnectLevel.parse(level) for key, level in levels.items() for e in self.resolve(key)}
        old = {e: self._levels[e] for e in new}
        self._levels.update(new)
        try:
            self._check_partitions()
        except NonConvexError:
            self._levels.update(old)
            raise
        logger.debug("set_connect %s", {f"{e.tensor}:{e.producer}->{e.consumer}": lv.label for e, lv in new.items()})

    def subgraphs(self, level: ConnectLevel | str | int) -> list[tuple[int, ...]]:
        """Node groups whose tiles live at ``level`` (Welder ``ExtractSubgraph``, hierarchical tile graph).

        ``global``: the groups joined by any edge (the whole tile graph if it is connected);
        ``shared``: the groups joined by ``shared`` or ``register`` edges (one kernel each);
        ``register``: the groups joined by ``register`` edges (inlined producers).
        Each group is in topological order; groups are ordered by their first member.
        """
        lvl = ConnectLevel.parse(level)
        joined = [(e.producer, e.consumer) for e in self.edges if self._levels[e] >= lvl]
        return [tuple(g) for g in components(self.members, joined)]   # members are in topological order

    def kernels(self) -> list[tuple[int, ...]]:
        """Level-0 sub-graphs: the kernels (groups joined by shared or register edges)."""
        return self.subgraphs(ConnectLevel.SHARED)

    def hierarchy(self) -> dict[str, list[tuple[int, ...]]]:
        """The hierarchical tile graph: :meth:`subgraphs` for every level, by level name."""
        return {lvl.label: self.subgraphs(lvl) for lvl in ConnectLevel}

    def _check_partitions(self) -> None:
        for lvl in (ConnectLevel.SHARED, ConnectLevel.REGISTER):
            for group in self.subgraphs(lvl):
                if not self.graph.is_convex(group):
                    raise NonConvexError(f"the {lvl.label}-level sub-graph {list(group)} is not convex: "
                                         f"a path through a global edge leaves it and re-enters")

    # ------------------------------------------------------------------ tiles
    def propagate(self, output_tile: TileSpec | Mapping[str, TileSpec], rstep: int | None = None) -> TileConfig:
        """Tile of every tensor and node for one output tile (Welder ``Propagate``); stored as :attr:`config`.

        Parameters
        ----------
        output_tile : tile shape, Region, or mapping of output name to either
            As for :func:`tvm_ext.analysis.propagate`: a bare tile applies to every output.
        rstep : int, optional
            Reduction step of matmul-like nodes (elements of the reduction axis per load).

        Returns
        -------
        TileConfig
        """
        if rstep is not None and (isinstance(rstep, bool) or not isinstance(rstep, int) or rstep <= 0):
            raise TileGraphError(f"rstep must be a positive int or None, got {rstep!r}")
        key = tuple(output_tile) if isinstance(output_tile, (tuple, list)) else None
        if key is not None and key in self._regions:
            regions, requested = self._regions[key]
        else:
            self.evaluations += 1
            regions = propagate(self.graph, self.members, output_tile, interior=True)
            # an output read inside the graph may be computed over more than its tile; its tile is stored
            requested = output_tile_regions(self.graph, self.members, output_tile)
            if key is not None:
                self._regions[key] = (regions, requested)
        outs = {o: (requested[o] if o in requested else regions[o]).extents for o in self.outputs if o in regions}
        nodes = {i: regions[self.graph.nodes[i].outputs[0]].extents
                 for i in self.members if self.graph.nodes[i].outputs}
        self.config = TileConfig(outs, regions, nodes, rstep)
        self._config_key = None if key is None else (key, rstep)
        return self.config

    def _require_config(self) -> TileConfig:
        if self.config is None:
            raise TileGraphError("no tile configuration yet; call propagate(output_tile) first")
        return self.config

    def _register_tensors(self, group: tuple[int, ...]) -> set[str]:
        """Tensors produced in ``group`` whose every edge is at register level (held in registers)."""
        inside = set(group)
        escaping = set(self.graph.boundary(group)[1])
        by_tensor: dict[str, list[ConnectLevel]] = {}
        for e in self.edges:
            if e.producer in inside and e.consumer in inside:
                by_tensor.setdefault(e.tensor, []).append(self._levels[e])
        return {t for t, lv in by_tensor.items()
                if t not in escaping and all(x == ConnectLevel.REGISTER for x in lv)}

    def kernel_tiles(self) -> list[KernelTile]:
        """Traffic and footprint of every kernel (level-0 sub-graph) under the current config.

        A kernel's output tile is the propagated tile of each tensor it stores; tensors on
        shared/register edges stay on chip. Raises :class:`TileGraphError` if there is no config,
        or if a kernel's outputs get tiles that disagree in tile count (Welder §3.1 does not
        connect such an output).
        """
        config = self._require_config()
        cache_key = None if self._config_key is None else (self._config_key, tuple(self._levels.values()))
        if cache_key is not None and cache_key in self._kernel_tiles:
            return list(self._kernel_tiles[cache_key])
        self.evaluations += 1
        result = []
        for group in self.kernels():
            outs = self.graph.boundary(group)[1]
            tiles = {o: config.output_tiles.get(o, config.regions[o].extents) for o in outs}
            empty = sorted(o for o, t in tiles.items() if 0 in t)
            if empty:
                raise TileGraphError(f"kernel {list(group)}: outputs {empty} get an empty tile")
            key = (group, tuple(sorted(tiles.items())))
            if key not in self._traffic:
                try:
                    self._traffic[key] = traffic(self.graph, group, tiles)
                except AnalysisError as err:
                    raise TileGraphError(f"kernel {list(group)} cannot be tiled by {tiles}: {err}") from err
            report = self._traffic[key]
            regions = {n: t.region for n, t in report.tensors.items()}
            steps = rstep_regions(self.graph, group, regions, config.rstep)
            buffers = tile_buffers(self.graph, group, steps)
            in_regs = self._register_tensors(group)
            tensor_core = any(m.tensor_core for m in matmul_nodes(self.graph, group))
            align = TENSOR_CORE_ALIGNMENT_BYTES if tensor_core else 1
            shared = plan_best_fit([b for b in buffers if b.name not in in_regs], align)
            reg_bytes = sum(b.size for b in buffers if b.name in in_regs)
            result.append(KernelTile(group, tiles, report, shared, reg_bytes, steps))
        if cache_key is not None:
            self._kernel_tiles[cache_key] = result
        return list(result)

    def mem_traffic(self) -> int:
        """Global-memory bytes of the current config (Welder ``MemTraffic``).

        The sum over kernels of (input tiles loaded + output tiles stored) x tiles; a tensor on a
        ``global`` edge is stored by its producer kernel and loaded by its consumer kernel, a
        tensor on a ``shared``/``register`` edge costs nothing.
        """
        return sum(k.global_bytes for k in self.kernel_tiles())

    def mem_footprint(self) -> dict[str, int]:
        """Bytes per memory level of the current config (Welder ``MemFootprint``).

        ``shared``: the largest best-fit shared-memory footprint of one tile over the kernels
        (inputs, outputs and shared-level reuse tiles; per-step input tiles with ``rstep``);
        ``register``: the largest per-tile bytes of register-level reuse tiles over the kernels;
        ``global``: bytes of the intermediates materialized in global memory (on global edges).
        """
        kernels = self.kernel_tiles()
        materialized = {e.tensor for e in self.edges if self._levels[e] == ConnectLevel.GLOBAL}
        return {"global": sum(self.graph.tensors[t].nbytes for t in materialized),
                "shared": max(k.shared.peak_bytes for k in kernels),
                "register": max(k.register_bytes for k in kernels)}

    def _repr_html_(self) -> str:
        """The notebook view (:func:`tvm_ext.inspect.tile_graph_view.tile_graph_html`)."""
        from ..inspect.tile_graph_view import tile_graph_html

        return tile_graph_html(self)

    def __repr__(self) -> str:
        edges = ", ".join(f"{e.tensor}:{e.producer}->{e.consumer}@{self._levels[e].label}" for e in self.edges)
        return f"TileGraph(members={list(self.members)}, edges=[{edges}])"
