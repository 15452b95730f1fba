"""SOUFFLE's global tensor-expression dependency graph (§4, §5), over OpGraph and AccessMap.

A thin layer: nodes are :class:`~tvm_ext.graph.OpGraph` nodes (one legalized operator, SOUFFLE's
TE), edges are their (input tensor, output tensor) pairs with the access maps of
:mod:`tvm_ext.analysis`. What SOUFFLE adds, and this module computes:

* **Intra-TE dependence** (§5.2) per edge: *one-relies-on-one* when no access of the input uses
  a reduction iterator (elementwise, broadcast, slice, transpose, reshape: a quasi-affine map),
  *one-relies-on-many* when one does (GEMM, reductions, convolution), *opaque* for
  data-dependent reads (gather) and calls we cannot see into.
* **Intensity** (§5.3): arithmetic operations per element accessed (elements read + written;
  :attr:`OpNode.flops` counts the arithmetic). At or above :data:`INTENSITY_THRESHOLD` (3) a node
  is compute-intensive (CI), below memory-intensive (MI). This counts *elements*, as the paper
  does; :attr:`OpNode.memory_intensive` uses the same threshold per *byte*.
* **Reuse** (§5.1): tensors read by more than one node. *Spatial* when the readers are mutually
  independent (Q/K/V reading one activation: the horizontal transform's input), *temporal* when
  one reader depends on another (an LSTM's weights read at every step: the reuse cache's input).
* **Live range** of a tensor: its producer's and last reader's positions in topological order.

Example
-------
>>> teg = TEGraph(OpGraph.from_module(legalized))
>>> [r.tensor for r in teg.reuse() if r.kind is ReuseKind.SPATIAL]
['lv9']
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cached_property

from ..analysis import AccessMap, node_access_maps
from ..analysis.dependency import vars_of
from ..graph import OpGraph, TensorKind

#: SOUFFLE §5.3: below this many arithmetic operations per element accessed a TE is memory-intensive.
INTENSITY_THRESHOLD = 3.0


class Dependence(str, enum.Enum):
    """SOUFFLE's intra-TE dependence class of one (input, output) edge."""

    ONE_ON_ONE = "one_relies_on_one"
    ONE_ON_MANY = "one_relies_on_many"
    OPAQUE = "opaque"


class ReuseKind(str, enum.Enum):
    """Spatial: readers independent of each other; temporal: some reader depends on another."""

    SPATIAL = "spatial"
    TEMPORAL = "temporal"


@dataclass(frozen=True)
class TEEdge:
    """One (input tensor -> output tensor) edge of node ``consumer``; ``producer`` is None for
    graph inputs and constants."""

    tensor: str
    output: str
    producer: int | None
    consumer: int
    dependence: Dependence


@dataclass(frozen=True)
class Reuse:
    """A tensor read by several nodes (``readers`` in topological order).

    ``independent`` partitions the readers into sets of mutually independent nodes (greedily, in
    topological order): BERT's ``lv9`` is read by Q, K, V and, after them, the residual add, so
    its reuse is temporal and ``independent`` is ``((q, k, v), (add,))``; the sets of two or more
    are the horizontal transform's opportunities.
    """

    tensor: str
    readers: tuple[int, ...]
    kind: ReuseKind
    independent: tuple[tuple[int, ...], ...]

    @property
    def spatial_sets(self) -> tuple[tuple[int, ...], ...]:
        """The sets of two or more mutually independent readers."""
        return tuple(s for s in self.independent if len(s) > 1)


def edge_dependence(am: AccessMap, name: str) -> Dependence:
    """Dependence class of input ``name`` of one output's access map.

    Examples
    --------
    >>> edge_dependence(node_access_maps(graph, 0)["lv"], "x")      # a matmul
    <Dependence.ONE_ON_MANY: 'one_relies_on_many'>
    """
    if not am.exact:
        return Dependence.OPAQUE
    free = set(am.free_vars)
    accesses = am.accesses[name]
    if any(a.data_dependent for a in accesses):
        return Dependence.OPAQUE
    if any(vars_of(e) & free for a in accesses for e in a.indices):
        return Dependence.ONE_ON_MANY
    return Dependence.ONE_ON_ONE


def _elements(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class TEGraph:
    """The dependency graph of one :class:`OpGraph` (see the module docstring).

    Parameters
    ----------
    graph : OpGraph
        A legalized (fused or not) function's graph.
    threshold : float
        Intensity threshold (default SOUFFLE's 3).
    """

    def __init__(self, graph: OpGraph, threshold: float = INTENSITY_THRESHOLD):
        self.graph = graph
        self.threshold = threshold
        self.order = graph.topological_order()
        self.position = {n: k for k, n in enumerate(self.order)}

    @cached_property
    def edges(self) -> tuple[TEEdge, ...]:
        """Every (input, output) edge with its dependence class."""
        out = []
        for node in self.graph.nodes:
            for output, am in node_access_maps(self.graph, node.index).items():
                for name in am.inputs:
                    out.append(TEEdge(name, output, self.graph.tensors[name].producer, node.index,
                                      edge_dependence(am, name)))
        return tuple(out)

    def dependence(self, index: int) -> Dependence:
        """The node's class: the most demanding of its edges (OPAQUE > ONE_ON_MANY > ONE_ON_ONE)."""
        kinds = {e.dependence for e in self.edges if e.consumer == index}
        for kind in (Dependence.OPAQUE, Dependence.ONE_ON_MANY):
            if kind in kinds:
                return kind
        return Dependence.ONE_ON_ONE

    def intensity(self, index: int) -> float:
        """Arithmetic operations per element read and written by node ``index`` (§5.3)."""
        node = self.graph.nodes[index]
        names = dict.fromkeys(node.inputs + node.outputs)
        elements = sum(_elements(self.graph.tensors[t].shape) for t in names)
        return node.flops / elements if elements else 0.0

    def compute_intensive(self, index: int) -> bool:
        """Whether node ``index`` is compute-intensive (intensity at or above the threshold)."""
        return self.intensity(index) >= self.threshold

    @cached_property
    def _descendants(self) -> dict[int, int]:
        """Per node, a bit set of the nodes reachable from it (itself excluded)."""
        reach: dict[int, int] = {}
        for n in reversed(self.order):
            bits = 0
            for c in self.graph.consumers(n):
                bits |= (1 << c) | reach[c]
            reach[n] = bits
        return reach

    def depends(self, later: int, earlier: int) -> bool:
        """Whether node ``later`` (transitively) reads what node ``earlier`` writes."""
        return bool(self._descendants[earlier] >> later & 1)

    def reuse(self) -> list[Reuse]:
        """Tensors read by more than one node, spatial or temporal (§5.1), in graph order.

        Constants are one tensor per use in :class:`OpGraph`, so a constant weight shared by
        several readers is not seen here (pass weights as parameters to find their reuse).
        """
        found = []
        for name, info in self.graph.tensors.items():
            readers = sorted(set(info.consumers), key=self.position.__getitem__)
            if len(readers) < 2:
                continue
            sets: list[list[int]] = []
            for r in readers:
                home = next((s for s in sets if not any(self.depends(r, m) for m in s)), None)
                if home is None:
                    sets.append([r])
                else:
                    home.append(r)
            kind = ReuseKind.SPATIAL if len(sets) == 1 else ReuseKind.TEMPORAL
            found.append(Reuse(name, tuple(readers), kind, tuple(tuple(s) for s in sets)))
        return found

    def live_range(self, tensor: str) -> tuple[int, int]:
        """(first, last) topological positions where ``tensor`` is live: its producer (-1 for graph
        inputs and constants) to its last reader (the end of the graph for outputs)."""
        info = self.graph.tensors[tensor]
        start = -1 if info.producer is None else self.position[info.producer]
        ends = [self.position[c] for c in info.consumers]
        if info.kind == TensorKind.OUTPUT or not ends:
            ends.append(len(self.order))
        return start, max(ends)


__all__ = ["Dependence", "INTENSITY_THRESHOLD", "Reuse", "ReuseKind", "TEEdge", "TEGraph", "edge_dependence"]
