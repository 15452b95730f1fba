"""Composition of block reads: which input elements an output element of a PrimFunc needs.

A legalized PrimFunc is a sequence of blocks; some write intermediate ``alloc_buffers`` that
later blocks read (softmax: max, exp, sum, normalize). Starting from the output buffer indexed
by fresh output iterators, :class:`Tracer` binds the writing block's iterators to the requested
indices, substitutes them into the block's loads, and recurses through every intermediate it
reads, so each input read ends up expressed over the output iterators plus free (reduction)
iterators. Used by :mod:`tvm_ext.analysis.access_map`.

Example
-------
>>> tracer = Tracer(func, func.params[:1])
>>> sink = Sink(out_vars)
>>> tracer.trace(func.params[-1], out_vars, sink, 0)
>>> {b.name: [str(a) for a in acc.values()] for b, acc in sink.reads.items()}
{'m': ['[o0, o1]', '[o0, v_k]', '[o0, v_k]']}
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import tvm
import tvm_ffi
from tvm import tirx

from ..errors import AnalysisError
from ..graph import sblocks, tensor_loads
from .dependency import vars_of

_MAX_DEPTH = 64


@dataclass(frozen=True, eq=False)
class Access:
    """One read of a tensor: an index expression per dimension (``None``: data-dependent).

    ``gathered`` has, for each dimension, the iterators a data-dependent index is computed from
    (the indices of the tensor it loads, ``ids[o0, o1]`` in ``table[ids[o0, o1], o2]``), or
    ``None`` where the index is not data-dependent or depends on something unknown. A
    data-dependent index takes at most as many values as those iterators have combinations.
    """

    indices: tuple
    gathered: tuple = ()

    @property
    def data_dependent(self) -> bool:
        """Whether some dimension is indexed by loaded data (or is otherwise unknown)."""
        return any(e is None for e in self.indices)

    def __str__(self) -> str:
        return "[" + ", ".join("?" if e is None else str(e) for e in self.indices) + "]"


def access_key(indices: Sequence, gathered: Sequence = ()) -> tuple:
    """Hashable identity of an index tuple (free variables compare by identity)."""
    key = tuple(-1 if e is None else tvm_ffi.structural_hash(e) for e in indices)
    if any(g is not None for g in gathered):
        key += tuple(None if g is None else frozenset(tvm_ffi.structural_hash(v) for v in g) for g in gathered)
    return key


def const_like(value: int, like) -> tirx.IntImm:
    """An integer constant of ``like``'s dtype."""
    return tirx.const(int(value), str(like.ty))


def buffer_shape(buffer) -> tuple[int, ...]:
    """Static shape of a buffer parameter or alloc_buffer."""
    dims = []
    for d in buffer.ty.shape:
        if not isinstance(d, tirx.IntImm):
            raise AnalysisError(f"buffer '{buffer.name}' has a symbolic shape {list(buffer.ty.shape)}")
        dims.append(int(d.value))
    return tuple(dims)


def _gathered(expr, sink: "Sink") -> frozenset | None:
    """Iterators a data-dependent index ``expr`` is computed from (None: something unknown)."""
    sources = {ld.source for ld in tensor_loads(expr)}
    iterators = frozenset(v for v in vars_of(expr) if v not in sources)
    return iterators if sink.known_vars(iterators) else None


@dataclass
class _BlockFacts:
    iter_doms: dict  # var -> (min, extent)
    loads: list


@dataclass
class Sink:
    """What a trace found: reads of inputs and of intermediates, free iterators, exactness."""

    out_vars: tuple
    free: dict = field(default_factory=dict)
    reads: dict = field(default_factory=dict)  # buffer -> {key: Access}
    scratch: dict = field(default_factory=dict)
    seen: set = field(default_factory=set)
    exact: bool = True
    fallback: bool = False

    def known(self, expr) -> bool:
        return self.known_vars(vars_of(expr))

    def known_vars(self, variables) -> bool:
        return set(variables) <= set(self.out_vars) | set(self.free)

    def add(self, table: dict, buffer, indices: tuple, gathered: tuple = ()) -> None:
        table.setdefault(buffer, {}).setdefault(access_key(indices, gathered), Access(indices, gathered))


class Tracer:
    """Blocks of one PrimFunc, indexed by the buffers they write.

    ``inputs`` are the parameters whose reads are recorded (the trace stops there); every other
    buffer read is followed into the blocks that write it.
    """

    def __init__(self, func: tirx.PrimFunc, inputs: Sequence):
        self.inputs = set(inputs)
        self.params = set(func.params)
        self.writers: dict = {}
        for block, _ in sblocks(func):
            stores: list = []
            tvm_ffi.structural_walk(block.body, (tirx.BufferStore, stores.append))
            written: dict = {}
            for st in stores:
                written.setdefault(st.buffer, tuple(st.indices))
            loads: list = []
            tvm_ffi.structural_walk(block.body, (tvm.ir.TensorLoad, loads.append))
            doms = {}
            for iv in block.iter_vars:
                if not isinstance(iv.dom.min, tirx.IntImm) or not isinstance(iv.dom.extent, tirx.IntImm):
                    raise AnalysisError(f"block '{block.name_hint}' has a symbolic iteration domain")
                doms[iv.var] = (int(iv.dom.min.value), int(iv.dom.extent.value))
            facts = _BlockFacts(doms, [ld for ld in loads if ld.source not in written])
            for buf, idx in written.items():
                self.writers.setdefault(buf, []).append((facts, idx))

    def trace(self, buffer, indices: tuple, sink: Sink, depth: int) -> None:
        """Record the reads needed for ``buffer[indices]`` into ``sink``."""
        writers = self.writers.get(buffer)
        if not writers or depth > _MAX_DEPTH:
            sink.fallback = True
            return
        for facts, store_idx in writers:
            binding: dict = {}
            for si, expr in zip(store_idx, indices):
                if isinstance(si, tirx.IntImm):
                    continue
                if expr is not None and isinstance(si, tvm.ir.Var) and si in facts.iter_doms and si not in binding:
                    binding[si] = expr if str(expr.ty) == str(si.ty) else tirx.Cast(str(si.ty), expr)
                else:
                    sink.exact = False  # the written index is not a plain iterator: leave iterators free
            for var, (start, extent) in facts.iter_doms.items():
                if var in binding:
                    continue
                if extent == 1:
                    binding[var] = const_like(start, var)
                else:
                    sink.free[var] = (start, extent)
            self._reads(facts, binding, sink, depth)

    def _reads(self, facts: _BlockFacts, binding: dict, sink: Sink, depth: int) -> None:
        remap = (tvm.ir.Var, lambda v: binding.get(v, v))
        for load in facts.loads:
            indices, gathered = [], []
            for idx in load.indices:
                expr = tvm_ffi.structural_map(idx, remap)
                loaded = bool(tensor_loads(expr))
                indices.append(None if loaded or not sink.known(expr) else expr)
                gathered.append(_gathered(expr, sink) if loaded else None)
            indices = tuple(indices)
            gathered = tuple(gathered) if any(g is not None for g in gathered) else ()
            if load.source in self.inputs:
                sink.add(sink.reads, load.source, indices, gathered)
                continue
            if load.source not in self.writers:
                sink.fallback = True  # read of a buffer nobody in this function writes
                continue
            sink.add(sink.scratch, load.source, indices, gathered)
            key = (load.source, access_key(indices, gathered))
            if key not in sink.seen:
                sink.seen.add(key)
                self.trace(load.source, indices, sink, depth + 1)
