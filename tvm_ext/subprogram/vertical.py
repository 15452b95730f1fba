"""Vertical transform (SOUFFLE §6.2): chains of one-relies-on-one TEs composed into one index map.

A one-relies-on-one TE reads each input element through a quasi-affine map ``v -> M v + c``
(``floordiv``/``floormod`` by constants allowed: reshapes). A chain ``te_0 -> ... -> te_n`` whose
intermediates have one reader each is one TE: its output element ``v`` reads the chain's source
at ``f_0(f_1(...f_n(v)))``. The composition starts from the consumer (:meth:`IndexMap.compose`
substitutes the consumer's read indices into the producer's): SOUFFLE's Eq. 2 misprints
``M_{i+1}(M_i + c_i)``, and its Fig. 4 multiplies the matrices in the wrong order, giving
``A[j, 2*i]`` where ``D[i, j] = C[j, i] = B[2*j, i]`` is ``relu(A[2*j, i])`` (see the digest).

In TVM the composed TE is what inlining produces: :func:`inline_one_to_one` runs
``compute_inline`` on every non-reduction intermediate block of a PrimFunc, so the last block
reads the chain's source directly; on a fused PrimFunc holding a GEMM and its chain, that source
is the GEMM's output and the chain becomes one epilogue block (*attached* to the compute
producer; the tile generators place it in the GEMM's tile). :func:`vertical_chains` finds the
chains of a whole graph, their composed maps and the compute-intensive producer each attaches to.

Example
-------
>>> [c.index_map for c in vertical_chains(teg)][0]
IndexMap((o0, o1) -> (o1 * 2, o0))
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ..analysis import AccessMap, node_access_maps
from ..graph import TensorKind, sblocks
from .te_graph import Dependence, TEGraph, edge_dependence

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class IndexMap:
    """Which input element an output element reads: ``out[out_vars] <- in[indices]``."""

    out_vars: tuple
    out_shape: tuple[int, ...]
    indices: tuple

    @classmethod
    def identity(cls, out_vars: tuple, out_shape: tuple[int, ...]) -> "IndexMap":
        """The map of an elementwise TE."""
        return cls(tuple(out_vars), tuple(out_shape), tuple(out_vars))

    def _analyzer(self) -> tvm.sym.Analyzer:
        analyzer = tvm.sym.Analyzer()
        for var, extent in zip(self.out_vars, self.out_shape):
            analyzer.bind(var, tvm.ir.Range.from_min_extent(tirx.const(0, str(var.ty)), tirx.const(extent, str(var.ty))))
        return analyzer

    def compose(self, producer: "IndexMap") -> "IndexMap":
        """Read through the producer: this map's output to the *producer's* input.

        ``self`` is the consumer's read of the producer's output; ``producer`` is the producer's
        read of its input (``producer.out_vars`` range over the producer's output).
        """
        if len(producer.out_vars) != len(self.indices):
            raise ValueError(f"consumer reads {len(self.indices)} dimensions of a producer of rank "
                             f"{len(producer.out_vars)}")
        binding = {v: e if str(e.ty) == str(v.ty) else tirx.Cast(str(v.ty), e)
                   for v, e in zip(producer.out_vars, self.indices)}
        remap = (tvm.ir.Var, lambda v: binding.get(v, v))
        analyzer = self._analyzer()
        return IndexMap(self.out_vars, self.out_shape,
                        tuple(analyzer.simplify(tvm_ffi.structural_map(e, remap)) for e in producer.indices))

    def matrix(self) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]] | None:
        """``(M, c)`` with ``indices = M @ out_vars + c`` (rows: input dimensions), or None when the
        map is quasi-affine but not affine (a reshape's ``floordiv``)."""
        rows, consts = [], []
        for e in self.indices:
            coeffs = tvm.sym.detect_linear_equation(e, list(self.out_vars))
            if len(coeffs) == 0 or not all(isinstance(c, tirx.IntImm) for c in coeffs):
                return None
            rows.append(tuple(int(c.value) for c in coeffs[:-1]))
            consts.append(int(coeffs[-1].value))
        return tuple(rows), tuple(consts)

    def __call__(self, *point: int) -> tuple[int, ...]:
        """The input element read by output element ``point``."""
        binding = {v: tirx.const(int(p), str(v.ty)) for v, p in zip(self.out_vars, point)}
        remap = (tvm.ir.Var, lambda v: binding.get(v, v))
        analyzer = tvm.sym.Analyzer()
        return tuple(int(analyzer.simplify(tvm_ffi.structural_map(e, remap)).value) for e in self.indices)

    def __repr__(self) -> str:
        return (f"IndexMap(({', '.join(map(str, self.out_vars))}) -> "
                f"({', '.join(map(str, self.indices))}))")


def index_map(am: AccessMap, name: str) -> IndexMap | None:
    """The quasi-affine map of input ``name`` of an access map, or None when the edge is not
    one-relies-on-one or the input is read at several places."""
    if edge_dependence(am, name) is not Dependence.ONE_ON_ONE or len(am.accesses[name]) != 1:
        return None
    return IndexMap(am.out_vars, am.output_shape, am.accesses[name][0].indices)


@dataclass(frozen=True)
class VerticalChain:
    """One-relies-on-one nodes ``nodes`` (producer first) composed into one TE.

    ``index_map`` maps the chain's output to its ``source`` tensor; ``side_reads`` holds the
    composed maps of every other tensor the chain reads (biases, residuals). ``attach`` is the
    compute-intensive node producing ``source`` (the chain is its epilogue), or None.
    """

    nodes: tuple[int, ...]
    source: str
    output: str
    index_map: IndexMap
    side_reads: dict
    attach: int | None


def _vertical_map(teg: TEGraph, index: int) -> AccessMap | None:
    """The access map of a node that can join a chain (one output, every input one-on-one, read once)."""
    node = teg.graph.nodes[index]
    if len(node.outputs) != 1 or node.func is None:
        return None
    am = node_access_maps(teg.graph, index)[node.outputs[0]]
    if not am.inputs or any(index_map(am, t) is None for t in am.inputs):
        return None
    return am


def vertical_chains(teg: TEGraph) -> list[VerticalChain]:
    """Maximal chains of one-relies-on-one nodes whose intermediates have one reader each; a
    single node counts when it attaches to a compute-intensive producer.

    Examples
    --------
    >>> chain = vertical_chains(TEGraph(graph))[0]
    >>> chain.index_map((1, 3))            # Fig. 4: D[1, 3] = relu(A[6, 1])
    (6, 1)
    """
    graph = teg.graph
    maps = {i: am for i in teg.order if (am := _vertical_map(teg, i)) is not None}
    nxt: dict[int, int] = {}
    prev: dict[int, int] = {}
    for i, am in maps.items():
        out = graph.tensors[graph.nodes[i].outputs[0]]
        readers = set(out.consumers)
        if out.kind == TensorKind.OUTPUT or len(readers) != 1:
            continue
        (j,) = readers
        if j in maps and j not in prev:
            nxt[i], prev[j] = j, i
    chains = []
    for head in (i for i in teg.order if i in maps and i not in prev):
        nodes = [head]
        while nodes[-1] in nxt:
            nodes.append(nxt[nodes[-1]])
        chains.append(_compose_chain(teg, nodes, maps))
    return [c for c in chains if len(c.nodes) > 1 or c.attach is not None]


def _compose_chain(teg: TEGraph, nodes: list[int], maps: dict) -> VerticalChain:
    graph = teg.graph
    tail = maps[nodes[-1]]
    through = IndexMap.identity(tail.out_vars, tail.output_shape)  # tail output -> current node's output
    reads: dict[str, IndexMap] = {}
    for k in range(len(nodes) - 1, -1, -1):
        am = maps[nodes[k]]
        chain_in = graph.nodes[nodes[k - 1]].outputs[0] if k > 0 else None
        for name in am.inputs:
            if name != chain_in:
                reads.setdefault(name, through.compose(index_map(am, name)))
        if chain_in is not None:
            through = through.compose(index_map(am, chain_in))
    head_inputs = maps[nodes[0]].inputs
    producers = {t: graph.tensors[t].producer for t in head_inputs}
    compute = [t for t in head_inputs if producers[t] is not None and teg.compute_intensive(producers[t])]
    source = compute[0] if compute else head_inputs[0]
    return VerticalChain(tuple(nodes), source, graph.nodes[nodes[-1]].outputs[0], reads.pop(source), reads,
                         producers[source] if compute else None)


def inline_one_to_one(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every non-reduction block that writes an intermediate buffer inlined into its
    readers (the vertical transform inside one kernel). Blocks TVM refuses to inline stay, logged."""
    sch = s_tir.Schedule(func)
    params = set(func.params)
    for block, _ in sblocks(func):
        if any(iv.iter_type != tirx.IterVar.DataPar for iv in block.iter_vars):
            continue
        stores: list = []
        tvm_ffi.structural_walk(block.body, (tirx.BufferStore, stores.append))
        if any(st.buffer in params for st in stores):
            continue
        try:
            sch.compute_inline(sch.get_sblock(block.name_hint))
        except s_tir.ScheduleError as err:
            logger.info("vertical: block %s not inlined: %s", block.name_hint, str(err).splitlines()[0])
    return sch.mod["main"]


__all__ = ["IndexMap", "VerticalChain", "index_map", "inline_one_to_one", "vertical_chains"]
