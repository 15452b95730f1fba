"""AccessMap: how an operator's output reads its inputs, from the PrimFunc's blocks.

For one output of a PrimFunc, every element ``out[o0, o1, ...]`` is described by the
*output iterators* ``o0, o1, ...`` and by *free iterators* (reduction iterators, and any
iterator the output index does not determine) with constant domains. Each input read is
an :class:`Access`: one index expression per input dimension, over those iterators.

Legalized functions such as softmax or layer_norm compute through intermediate
``alloc_buffers``; reads of an intermediate are composed through the block that writes
it, so the final output's iterators stay the reference. softmax's input ``x`` is reported
as ``x[o0, k]`` (max block), ``x[o0, o1]`` (exp block) and ``x[o0, k']`` (exp inside the
sum block): the union of all reads. An index that loads from a tensor (gather / take) is
data-dependent and marked ``None``: the region of a concrete tile is the whole dimension. The
representative tile (``interior=True``, the one traffic and footprint are priced on) reads only
as many entries of that dimension as the index takes values over the tile: ``table[ids[o0, o1], o2]``
for a tile of 4 x 768 outputs reads 4 rows of the table (where they lie is data; the region puts
them at the start).

Example
-------
>>> maps = node_access_maps(graph, graph.node("lv").index)     # a matmul node
>>> am = maps["lv"]
>>> am.kind("x"), am.input_region("x", Region.tile(am.output_shape, (4, 16))).extents
(<DependencyKind.REDUCTION: 'reduction'>, (4, 8))
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import tvm
from tvm import tirx

from ..errors import AnalysisError
from ..graph import OpGraph
from .compose import Access, Sink, Tracer, access_key, buffer_shape, const_like
from .dependency import DependencyKind, classify_access
from .region import Region

def _range(start: int, extent: int, var) -> tvm.ir.Range:
    return tvm.ir.Range.from_min_extent(const_like(start, var), const_like(extent, var))


@dataclass(frozen=True, eq=False)
class AccessMap:
    """Reads of every input of a node for one of its outputs (see the module docstring)."""

    output: str
    output_shape: tuple[int, ...]
    out_vars: tuple
    free_vars: Mapping  # tirx Var -> (min, extent): reduction and other free iterators
    accesses: Mapping[str, tuple[Access, ...]]
    input_shapes: Mapping[str, tuple[int, ...]]
    scratch: Mapping[str, tuple[Access, ...]] = field(default_factory=dict)
    scratch_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    scratch_dtypes: Mapping[str, str] = field(default_factory=dict)
    exact: bool = True
    #: Regions already derived, by (kind, output region, interior): tile enumeration and graph
    #: connecting propagate the same tiles through the same node many times.
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def inputs(self) -> tuple[str, ...]:
        """Names of the inputs this output reads."""
        return tuple(n for n, acc in self.accesses.items() if acc)

    def kind(self, name: str) -> DependencyKind:
        """Dependency kind of the edge ``name -> output``.

        Examples
        --------
        >>> softmax_map.kind("lv")
        <DependencyKind.REDUCTION: 'reduction'>
        """
        if name not in self.accesses or not self.accesses[name]:
            raise AnalysisError(f"'{self.output}' does not read '{name}'; it reads {list(self.inputs)}")
        if not self.exact:
            return DependencyKind.OPAQUE
        extents = self.output_shape
        return DependencyKind.combine(classify_access(a.indices, self.out_vars, extents, self.free_vars)
                                      for a in self.accesses[name])

    def kinds(self) -> dict[str, DependencyKind]:
        """Dependency kind of every input read by this output."""
        return {n: self.kind(n) for n in self.inputs}

    def _check_region(self, out_region: Region) -> None:
        if out_region.rank != len(self.output_shape):
            raise AnalysisError(f"region of rank {out_region.rank} given for '{self.output}' "
                                f"of shape {self.output_shape}")
        if not Region.full(self.output_shape).contains(out_region):
            raise AnalysisError(f"region {out_region.ranges} lies outside '{self.output}' {self.output_shape}")

    def _analyzer(self, out_region: Region) -> tvm.sym.Analyzer:
        analyzer = tvm.sym.Analyzer()
        for var, (start, extent) in zip(self.out_vars, out_region.ranges):
            analyzer.bind(var, _range(start, extent, var))
        for var, (start, extent) in self.free_vars.items():
            analyzer.bind(var, _range(start, extent, var))
        return analyzer

    @staticmethod
    def _gathered_count(iterators, analyzer) -> int | None:
        """Combinations of ``iterators`` over the bound tile: values a data-dependent index can take."""
        count = 1
        for var in iterators:
            b = analyzer.const_int_bound(var)
            if b.min_value <= tvm.sym.ConstIntBound.NEG_INF or b.max_value >= tvm.sym.ConstIntBound.POS_INF:
                return None
            count *= int(b.max_value) - int(b.min_value) + 1
        return count

    def _region(self, accesses, shape, analyzer, interior: bool) -> Region:
        region = Region.empty(len(shape))
        for access in accesses:
            bounds = []
            gathered = access.gathered or (None,) * len(shape)
            for dim, expr, iterators in zip(shape, access.indices, gathered):
                if expr is None:
                    count = self._gathered_count(iterators, analyzer) if interior and iterators is not None else None
                    bounds.append((0, dim - 1 if count is None else min(count, dim) - 1))
                    continue
                b = analyzer.const_int_bound(expr)
                lo, hi = int(b.min_value), int(b.max_value)
                if lo <= tvm.sym.ConstIntBound.NEG_INF or hi >= tvm.sym.ConstIntBound.POS_INF:
                    lo, hi = 0, dim - 1  # unbounded: conservative
                bounds.append((lo, hi))
            region = region.union(Region.from_bounds(bounds, shape, interior))
        return region

    def input_region(self, name: str, out_region: Region, interior: bool = False) -> Region:
        """Region of input ``name`` needed to compute ``out_region`` of the output.

        ``interior=True`` gives the extents of a tile away from every border (see
        :meth:`Region.from_bounds`).

        Examples
        --------
        >>> conv_map.input_region("x", Region(((0, 1), (0, 4), (1, 2), (1, 2)))).ranges
        ((0, 1), (0, 3), (1, 5), (1, 5))
        """
        return self.input_regions(out_region, interior)[name]

    def input_regions(self, out_region: Region, interior: bool = False) -> dict[str, Region]:
        """Region of every input (empty for inputs this output does not read)."""
        key = ("input", out_region, interior)
        if key not in self._memo:
            self._check_region(out_region)
            if out_region.is_empty:
                self._memo[key] = {n: Region.empty(len(s)) for n, s in self.input_shapes.items()}
            else:
                analyzer = self._analyzer(out_region)
                self._memo[key] = {n: self._region(self.accesses.get(n, ()), shape, analyzer, interior)
                                   for n, shape in self.input_shapes.items()}
        return dict(self._memo[key])

    def scratch_regions(self, out_region: Region, interior: bool = False) -> dict[str, Region]:
        """Regions of the function's intermediate buffers (softmax's max/exp/sum) for ``out_region``."""
        self._check_region(out_region)
        if out_region.is_empty:
            return {n: Region.empty(len(s)) for n, s in self.scratch_shapes.items()}
        analyzer = self._analyzer(out_region)
        return {n: self._region(acc, self.scratch_shapes[n], analyzer, interior)
                for n, acc in self.scratch.items()}

    @classmethod
    def opaque(cls, output: str, output_shape: Sequence[int],
               input_shapes: Mapping[str, Sequence[int]]) -> "AccessMap":
        """A map for a call we cannot see into: every input is read whole (OPAQUE)."""
        shapes = {n: tuple(s) for n, s in input_shapes.items()}
        outs = tuple(tirx.Var(f"o{d}", "int64") for d in range(len(output_shape)))
        accesses = {n: (Access(tuple(None for _ in s)),) for n, s in shapes.items()}
        return cls(output, tuple(output_shape), outs, {}, accesses, shapes, exact=False)


def func_access_maps(func: tirx.PrimFunc, names: Sequence[str] | None = None,
                     num_outputs: int | None = None) -> dict[str, AccessMap]:
    """One :class:`AccessMap` per output parameter of ``func``.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        A legalized (unscheduled) PrimFunc; its last ``num_outputs`` parameters are outputs.
    names : sequence of str, optional
        Tensor name of each parameter (positionally); defaults to the parameter names.
        Repeated names (one tensor passed twice) are merged.
    num_outputs : int, optional
        Defaults to the number of parameters written by the function.

    Examples
    --------
    >>> maps = func_access_maps(mod["softmax"])
    >>> [str(a) for a in maps["T_softmax_norm"].accesses["m"]][:1]
    ['[o0, o1]']
    """
    params = list(func.params)
    names = [p.name for p in params] if names is None else list(names)
    if len(names) != len(params):
        raise AnalysisError(f"{len(names)} names given for {len(params)} parameters")
    if num_outputs is None:
        tracer = Tracer(func, [])
        num_outputs = sum(1 for p in params if p in tracer.writers)
    n_in = len(params) - num_outputs
    if num_outputs <= 0 or n_in < 0:
        raise AnalysisError(f"invalid number of outputs {num_outputs} for {len(params)} parameters")
    tracer = Tracer(func, params[:n_in])
    input_shapes: dict[str, tuple[int, ...]] = {}
    for p, n in zip(params[:n_in], names):
        input_shapes.setdefault(n, buffer_shape(p))
    maps = {}
    for p, n in zip(params[n_in:], names[n_in:]):
        maps[n] = _build(tracer, p, n, params[:n_in], names[:n_in], input_shapes)
    return maps


def _simplifier(out_vars: tuple, shape: tuple[int, ...], free: Mapping):
    """Simplify composed indices (reshape chains leave ``o // 8 % 8`` ...) over the full iteration domain."""
    analyzer = tvm.sym.Analyzer()
    for var, extent in zip(out_vars, shape):
        analyzer.bind(var, _range(0, extent, var))
    for var, (start, extent) in free.items():
        analyzer.bind(var, _range(start, extent, var))

    def simplify(access: Access) -> Access:
        return Access(tuple(None if e is None else analyzer.simplify(e) for e in access.indices), access.gathered)

    return simplify


def _build(tracer: Tracer, out_param, out_name: str, in_params, in_names, input_shapes) -> AccessMap:
    shape = buffer_shape(out_param)
    dtypes = [str(d.ty) for d in out_param.ty.shape]
    out_vars = tuple(tirx.Var(f"o{d}", dt) for d, dt in enumerate(dtypes))
    sink = Sink(out_vars)
    tracer.trace(out_param, out_vars, sink, 0)
    if sink.fallback:
        return AccessMap.opaque(out_name, shape, input_shapes)
    simplify = _simplifier(out_vars, shape, sink.free)
    accesses: dict[str, dict] = {n: {} for n in input_shapes}
    for p, n in zip(in_params, in_names):
        for access in sink.reads.get(p, {}).values():
            access = simplify(access)
            accesses[n].setdefault(access_key(access.indices, access.gathered), access)
    # intra-function buffers only (another output parameter read through is not scratch)
    local = [b for b in sink.scratch if b not in tracer.params]
    return AccessMap(out_name, shape, out_vars, dict(sink.free),
                     {n: tuple(a.values()) for n, a in accesses.items()}, dict(input_shapes),
                     {b.name: tuple(simplify(a) for a in sink.scratch[b].values()) for b in local},
                     {b.name: buffer_shape(b) for b in local}, {b.name: str(b.ty.dtype) for b in local}, sink.exact)


_CACHE: "weakref.WeakKeyDictionary[OpGraph, dict[int, dict[str, AccessMap]]]" = weakref.WeakKeyDictionary()


def node_access_maps(graph: OpGraph, index: int) -> dict[str, AccessMap]:
    """Access maps of node ``index`` of ``graph``, keyed by output tensor name (cached per graph).

    Inputs are keyed by the graph's tensor names. A node without a PrimFunc (an external
    call) reads every input whole.

    Examples
    --------
    >>> node_access_maps(graph, 0)["lv"].kinds()
    {'x': <DependencyKind.REDUCTION: 'reduction'>, 'w': <DependencyKind.REDUCTION: 'reduction'>}
    """
    per_graph = _CACHE.setdefault(graph, {})
    if index in per_graph:
        return per_graph[index]
    if not 0 <= index < len(graph.nodes):
        raise AnalysisError(f"graph has no node {index}")
    node = graph.nodes[index]
    if node.func is None:
        shapes = {t: graph.tensors[t].shape for t in node.inputs}
        maps = {o: AccessMap.opaque(o, graph.tensors[o].shape, shapes) for o in node.outputs}
    else:
        names = list(node.inputs) + list(node.outputs)
        if len(names) != len(node.func.params):
            raise AnalysisError(f"node '{node.name}': {len(names)} tensors for "
                                f"{len(node.func.params)} PrimFunc parameters")
        maps = func_access_maps(node.func, names, num_outputs=len(node.outputs))
    per_graph[index] = maps
    return maps


def edge_kinds(graph: OpGraph, index: int) -> dict[tuple[str, str], DependencyKind]:
    """Dependency kind of every (input tensor, output tensor) edge of node ``index``.

    Examples
    --------
    >>> edge_kinds(graph, softmax_index)
    {('lv', 'lv1'): <DependencyKind.REDUCTION: 'reduction'>}
    """
    return {(i, o): k for o, am in node_access_maps(graph, index).items() for i, k in am.kinds().items()}
