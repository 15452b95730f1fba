"""The operators of one (fused) PrimFunc as AStitch sees them: one :class:`StitchOp` per block.

After ``FuseTIR`` a stitch group is one PrimFunc whose blocks are the member operators'
blocks (a softmax contributes four: max, exp, sum, normalize). Each block writes one buffer
and reads parameters or other blocks' buffers; the edge kind (one-to-one, broadcast,
reduction, ...) comes from the read's index expressions over the block's iterators
(:func:`tvm_ext.analysis.classify_access`).

Example
-------
>>> g = StitchGraph.from_prim_func(mod["fused_softmax"])
>>> [(op.name, op.kind) for op in g.ops]
[('T_softmax_maxelem', 'reduce'), ('T_softmax_exp', 'elementwise'), ...]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping
from functools import reduce as _fold
from operator import mul

import tvm
import tvm_ffi
from tvm import tirx

from ..analysis import DependencyKind, classify_access
from ..errors import TvmExtError
from ..graph import sblocks

#: Intrinsics that make an elementwise op *heavy* (AStitch §2.1: tanh, pow, log ...).
HEAVY_INTRINSICS = frozenset({
    "tirx.exp", "tirx.exp2", "tirx.exp10", "tirx.log", "tirx.log2", "tirx.log10", "tirx.log1p",
    "tirx.tanh", "tirx.sigmoid", "tirx.pow", "tirx.erf", "tirx.sqrt", "tirx.rsqrt", "tirx.sin",
    "tirx.cos", "tirx.tan", "tirx.asin", "tirx.acos", "tirx.atan", "tirx.atan2", "tirx.sinh",
    "tirx.cosh", "tirx.asinh", "tirx.acosh", "tirx.atanh",
})


class StitchOpError(TvmExtError):
    """A PrimFunc cannot be viewed as stitchable operators (several writes per block, symbolic shapes)."""


@dataclass(frozen=True)
class Read:
    """One buffer read by an op: the buffer name and the dependency kind of the access."""

    buffer: str
    kind: DependencyKind


@dataclass(frozen=True, eq=False)
class StitchOp:
    """One block of the PrimFunc.

    Attributes
    ----------
    index : int
        Position in program order.
    name : str
        Block name.
    buffer : str
        Name of the buffer the block writes.
    shape : tuple of int
        Shape of that buffer.
    spatial : tuple of int
        Extents of the block's spatial iterators (in store-index order).
    reduce_extent : int
        Product of the reduction iterators' extents (1 for non-reductions).
    kind : str
        ``"reduce"``, ``"elementwise"`` (every read one-to-one or broadcast) or ``"injective"``.
    heavy : bool
        Whether the computation calls a transcendental intrinsic.
    row_reduce : bool
        For a reduction: the innermost index of some read uses a reduction iterator
        (contiguous rows); False means a column reduction.
    writes_output : bool
        Whether the buffer is an output parameter of the function.
    reads : tuple of Read
    dtype : str
        Element type of the written buffer.
    out_vars : tuple
        The block's spatial iterators, in the order of the written buffer's dimensions.
    reduce_vars : Mapping
        Reduction iterator -> ``(min, extent)``.
    read_indices : Mapping
        Buffer name -> tuple of index tuples (one per load), over ``out_vars`` and ``reduce_vars``.
    """

    index: int
    name: str
    buffer: str
    shape: tuple[int, ...]
    spatial: tuple[int, ...]
    reduce_extent: int
    kind: str
    heavy: bool
    row_reduce: bool
    writes_output: bool
    reads: tuple[Read, ...]
    dtype: str = "float32"
    out_vars: tuple = ()
    reduce_vars: Mapping = field(default_factory=dict)
    read_indices: Mapping = field(default_factory=dict)

    @property
    def is_reduce(self) -> bool:
        """Whether the op is a reduction."""
        return self.kind == "reduce"

    @property
    def num_elements(self) -> int:
        """Elements of the written buffer."""
        return _prod(self.shape)

    @property
    def rows(self) -> int:
        """For a reduction, the number of independent results (rows); else the element count."""
        return _prod(self.spatial)


def _prod(values) -> int:
    return _fold(mul, (int(v) for v in values), 1)


def _int(expr, what: str) -> int:
    if not isinstance(expr, tirx.IntImm):
        raise StitchOpError(f"{what} is symbolic ({expr}); stitching needs static shapes")
    return int(expr.value)


def _heavy(expr) -> bool:
    found = []

    def visit(call) -> None:
        if isinstance(call.op, tvm.ir.Op) and call.op.name in HEAVY_INTRINSICS:
            found.append(call)

    tvm_ffi.structural_walk(expr, (tvm.ir.Call, visit))
    return bool(found)


def _store_of(block) -> tirx.BufferStore:
    stores: list = []
    tvm_ffi.structural_walk(block.body, (tirx.BufferStore, stores.append))
    buffers = {id(s.buffer): s.buffer for s in stores}
    if len(buffers) != 1:
        raise StitchOpError(f"block '{block.name_hint}' writes {len(buffers)} buffers; one expected")
    return stores[-1]


@dataclass
class StitchGraph:
    """Operators (blocks) of one PrimFunc with their producer/consumer edges."""

    ops: list[StitchOp]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def from_prim_func(cls, func: tirx.PrimFunc, num_outputs: int | None = None) -> "StitchGraph":
        """Build the graph of ``func`` (unscheduled; outputs are the last ``num_outputs`` params).

        ``num_outputs`` defaults to the number of parameters some block writes.
        """
        params = list(func.params)
        blocks = sblocks(func)
        written_params = []
        for block, _ in blocks:
            buf = _store_of(block).buffer
            if buf in params and buf not in written_params:
                written_params.append(buf)
        n_out = len(written_params) if num_outputs is None else num_outputs
        outputs = params[len(params) - n_out:]
        inputs = params[:len(params) - n_out]
        labels = _BufferLabels()
        shapes = {labels(p): tuple(_int(d, f"shape of '{p.name}'") for d in p.ty.shape) for p in params}
        ops: list[StitchOp] = []
        for index, (block, _) in enumerate(blocks):
            ops.append(_op_of(index, block, outputs, labels))
        if len({op.name for op in ops}) != len(ops) or len({op.buffer for op in ops}) != len(ops):
            raise StitchOpError(f"blocks are not uniquely named or write one buffer twice: "
                                f"{[(o.name, o.buffer) for o in ops]}")
        return cls(ops, tuple(labels(p) for p in inputs), tuple(labels(p) for p in outputs), shapes)

    def op(self, name: str) -> StitchOp:
        """The op with block name ``name``."""
        found = self._by_name.get(name)
        if found is None:
            raise KeyError(f"no block named '{name}'; blocks: {[o.name for o in self.ops]}")
        return found

    def writer(self, buffer: str) -> StitchOp | None:
        """The (last) op writing ``buffer``, or None for a function input."""
        return self._writers.get(buffer)

    # Indexes of the ops (built once: the ops of a graph do not change after construction; the
    # planner asks for producers and consumers of every op, quadratic as scans on 1000-op graphs).
    @cached_property
    def _by_name(self) -> dict[str, StitchOp]:
        return {op.name: op for op in self.ops}        # names are unique (checked on construction)

    @cached_property
    def _writers(self) -> dict[str, StitchOp]:
        return {op.buffer: op for op in self.ops}

    @cached_property
    def _readers(self) -> dict[str, list[tuple[StitchOp, DependencyKind]]]:
        out: dict[str, list] = {}
        for c in self.ops:
            for r in c.reads:
                out.setdefault(r.buffer, []).append((c, r.kind))
        return out

    def producers(self, op: StitchOp) -> list[tuple[StitchOp, DependencyKind]]:
        """Ops whose buffers ``op`` reads, with the kind of each read."""
        out = []
        for read in op.reads:
            w = self.writer(read.buffer)
            if w is not None and w.index != op.index:
                out.append((w, read.kind))
        return out

    def consumers(self, op: StitchOp) -> list[tuple[StitchOp, DependencyKind]]:
        """Ops reading ``op``'s buffer, with the kind of each read."""
        return [(c, kind) for c, kind in self._readers.get(op.buffer, ()) if c.index != op.index]

    def input_readers(self, name: str) -> list[StitchOp]:
        """Ops reading function input ``name``."""
        seen: dict[int, StitchOp] = {}
        for c, _ in self._readers.get(name, ()):
            seen.setdefault(c.index, c)
        return list(seen.values())


class _BufferLabels:
    """Unique names for buffer objects (FuseTIR may leave two buffers with one name)."""

    def __init__(self):
        self.labels: dict = {}
        self.used: set[str] = set()

    def __call__(self, buffer) -> str:
        if buffer in self.labels:
            return self.labels[buffer]
        name, k = buffer.name, 1
        while name in self.used:
            name = f"{buffer.name}#{k}"
            k += 1
        self.used.add(name)
        self.labels[buffer] = name
        return name


def _op_of(index: int, block, outputs, labels: _BufferLabels) -> StitchOp:
    store = _store_of(block)
    out_buf = store.buffer
    doms = {}
    for iv in block.iter_vars:
        doms[iv.var] = (_int(iv.dom.min, f"block '{block.name_hint}' domain"),
                        _int(iv.dom.extent, f"block '{block.name_hint}' domain"), int(iv.iter_type))
    reduce_vars = {v: (m, e) for v, (m, e, t) in doms.items() if t == tirx.IterVar.CommReduce}
    out_vars = []
    for idx in store.indices:
        if isinstance(idx, tvm.ir.Var) and idx in doms and idx not in reduce_vars:
            out_vars.append(idx)
    spatial = tuple(doms[v][1] for v in out_vars)
    if not out_vars:
        spatial = (1,)
    shape = tuple(_int(d, f"shape of '{out_buf.name}'") for d in out_buf.ty.shape)
    loads: list = []
    tvm_ffi.structural_walk(store.value, (tvm.ir.TensorLoad, loads.append))
    if block.init is not None:
        tvm_ffi.structural_walk(block.init, (tvm.ir.TensorLoad, loads.append))
    extents = [doms[v][1] for v in out_vars]
    reads: dict[str, DependencyKind] = {}
    indices: dict[str, list] = {}
    row_reduce = False
    for load in loads:
        if load.source.same_as(out_buf):
            continue
        indices.setdefault(labels(load.source), []).append(tuple(load.indices))
        kind = classify_access(list(load.indices), out_vars, extents, reduce_vars) if out_vars or reduce_vars \
            else DependencyKind.BROADCAST
        name = labels(load.source)
        reads[name] = DependencyKind.combine([reads[name], kind]) if name in reads else kind
        if reduce_vars and load.indices:
            inner = load.indices[-1]
            used: set = set()
            tvm_ffi.structural_walk(inner, (tvm.ir.Var, used.add))
            row_reduce = row_reduce or bool(used & set(reduce_vars))
    if reduce_vars:
        kind = "reduce"
    elif all(k in (DependencyKind.ONE_TO_ONE, DependencyKind.BROADCAST) for k in reads.values()):
        kind = "elementwise"
    else:
        kind = "injective"
    return StitchOp(
        index=index, name=block.name_hint, buffer=labels(out_buf), shape=shape, spatial=spatial,
        reduce_extent=_prod(e for _, e in reduce_vars.values()), kind=kind, heavy=_heavy(store.value),
        row_reduce=row_reduce, writes_output=any(out_buf.same_as(o) for o in outputs),
        reads=tuple(Read(n, k) for n, k in reads.items()), dtype=str(out_buf.ty.dtype), out_vars=tuple(out_vars),
        reduce_vars=dict(reduce_vars), read_indices={n: tuple(v) for n, v in indices.items()},
    )


__all__ = ["HEAVY_INTRINSICS", "Read", "StitchGraph", "StitchOp", "StitchOpError"]
