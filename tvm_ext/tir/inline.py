"""Inline many elementwise blocks of an unscheduled PrimFunc in one pass.

``Schedule.compute_inline`` re-analyses the whole scope after each call (block info, region
cover), so inlining the ``k`` local ops of a function of ``n`` blocks costs ``k x n``: the
stitched one-kernel LSTM (1100 blocks, 1105 local ops) spent 17 s in it on this 2-core machine,
500 inlines into 1000 blocks 10 s. :func:`inline_blocks` does the same rewrite in one walk for
the producers TVM's primitive inlines by substitution (``X[v0, v1, ...] = f(v0, v1, ...)``: a
single store at the block's distinct iterator variables, no init, into a buffer the function
allocates and nothing else writes): each later load of ``X`` becomes ``f`` at its indices, the
producer's loop nest and allocation go, and each block whose body changed gets its read and
write regions from TVM's own region analysis, as the primitive does. Anything else (and any
leftover reference to an inlined buffer) is left to ``compute_inline``.

Example
-------
>>> sch, failed = inline_with_schedule(func, ("x_mean", "exp"))
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlock, SBlockRealize

from ..errors import TVM_ERRORS
from .substitute import substitute_vars
from .unchecked_schedule import UncheckedSchedule


def _only_realize(stmt) -> SBlockRealize | None:
    """The block of a top-level loop nest holding exactly one block, or None."""
    while isinstance(stmt, tirx.For):
        stmt = stmt.body
    return stmt if isinstance(stmt, SBlockRealize) else None


def _substitutable(realize: SBlockRealize, allocated: set, writers: dict) -> tuple | None:
    """``(buffer, iterator vars in store order, value)`` when ``realize`` is a producer the
    substitution handles (see the module docstring)."""
    block = realize.block
    store = block.body
    if block.init is not None or not isinstance(store, tirx.BufferStore) or block.match_buffers \
            or block.alloc_buffers or not (isinstance(realize.predicate, tirx.IntImm) and int(realize.predicate.value) == 1):
        return None
    buffer = store.buffer
    if buffer not in allocated or writers.get(buffer, 0) != 1:
        return None
    iter_vars = [iv.var for iv in block.iter_vars]
    index_vars = list(store.indices)
    if not all(isinstance(v, tvm.ir.Var) for v in index_vars) or len({id(v) for v in index_vars}) != len(index_vars):
        return None
    if not all(any(v.same_as(iv) for iv in iter_vars) for v in index_vars):
        return None
    loads: list = []
    tvm_ffi.structural_walk(store.value, (tvm.ir.TensorLoad, loads.append))
    if any(ld.source.same_as(buffer) for ld in loads):
        return None
    used: list = []            # scalar variables (a buffer is a variable too: the loads' sources are not)
    tvm_ffi.structural_walk(store.value, (tvm.ir.Var, used.append))
    sources = [ld.source for ld in loads]
    if not all(any(u.same_as(v) for v in index_vars) or any(u.same_as(s) for s in sources) for u in used):
        return None
    return buffer, index_vars, store.value


class _Substituter:
    """Replaces loads of inlined buffers by their producers' values at the load's indices."""

    def __init__(self):
        self.values: dict = {}      # buffer -> (index vars, value)

    def __call__(self, node):
        if not self.values:
            return node, False
        changed = []

        def on_load(load, mutator):
            new = mutator.default_mutate(load)
            entry = self.values.get(new.source)
            if entry is None:
                return new
            index_vars, value = entry
            changed.append(True)
            return substitute_vars(value, dict(zip(index_vars, new.indices)))

        return tvm_ffi.structural_mutate(node, (tvm.ir.TensorLoad, on_load)), bool(changed)


def _with_regions(block: SBlock, body, init, buffer_var_map: dict) -> SBlock:
    draft = SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body, init,
                   block.alloc_buffers, block.match_buffers, block.annotations)
    reads, writes = tvm.s_tir.analysis.get_sblock_read_write_region(draft, buffer_var_map)
    return SBlock(block.iter_vars, reads, writes, block.name_hint, body, init,
                  block.alloc_buffers, block.match_buffers, block.annotations)


def _rebuild_nest(stmt, realize: SBlockRealize):
    if isinstance(stmt, tirx.For):
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, _rebuild_nest(stmt.body, realize),
                        stmt.thread_binding, stmt.annotations)
    return realize


def inline_blocks(func: tirx.PrimFunc, names) -> tuple[tirx.PrimFunc, list[str]]:
    """Inline the blocks ``names`` of ``func`` (unscheduled, one block per top-level loop nest)
    by substitution; returns the new function and the names it left (for ``compute_inline``)."""
    root = func.body.block if isinstance(func.body, SBlockRealize) else None
    if root is None or not isinstance(root.body, tirx.SeqStmt):
        return func, list(names)
    wanted = set(names)
    allocated = set(root.alloc_buffers)
    writers: dict = {}

    def on_store(store) -> None:
        writers[store.buffer] = writers.get(store.buffer, 0) + 1
    tvm_ffi.structural_walk(root.body, (tirx.BufferStore, on_store))
    buffer_var_map = {b: b for b in list(func.params) + list(root.alloc_buffers)}
    substitute = _Substituter()
    kept, inlined_names = [], set()
    for stmt in root.body.seq:
        realize = _only_realize(stmt)
        if realize is None:
            return func, list(names)
        block = realize.block
        body, body_changed = substitute(block.body)
        init, init_changed = substitute(block.init) if block.init is not None else (None, False)
        if body_changed or init_changed:
            block = _with_regions(block, body, init, buffer_var_map)
            realize = SBlockRealize(realize.iter_values, realize.predicate, block)
        entry = _substitutable(realize, allocated, writers) if block.name_hint in wanted else None
        if entry is not None:
            buffer, index_vars, value = entry
            substitute.values[buffer] = (index_vars, value)
            inlined_names.add(block.name_hint)
            continue
        kept.append(_rebuild_nest(stmt, realize) if (body_changed or init_changed) else stmt)
    gone = set(substitute.values)
    leftover: list = []
    tvm_ffi.structural_walk(tirx.SeqStmt(kept) if len(kept) > 1 else kept[0],
                            (tvm.ir.Var, lambda v: leftover.append(v) if v in gone else None))
    if leftover:        # an access the substitution does not see (a region, an opaque use): TVM's primitive
        return func, list(names)
    new_root = SBlock(root.iter_vars, root.reads, root.writes, root.name_hint,
                      tirx.SeqStmt(kept) if len(kept) > 1 else kept[0], root.init,
                      [b for b in root.alloc_buffers if b not in gone], root.match_buffers, root.annotations)
    new_func = func.with_body(SBlockRealize(func.body.iter_values, func.body.predicate, new_root))
    return new_func, [n for n in names if n not in inlined_names]


def inline_with_schedule(func: tirx.PrimFunc, names, schedule_cls=UncheckedSchedule) -> tuple:
    """A schedule of ``func`` with the blocks ``names`` inlined (by substitution where it applies,
    else ``compute_inline``); also the names that would not inline."""
    names = list(names)
    inlined, rest = inline_blocks(func, names)
    sch = schedule_cls(inlined)
    failed = []
    for name in rest:
        try:
            sch.compute_inline(sch.get_sblock(name))
        except TVM_ERRORS:
            failed.append(name)
    return sch, failed


__all__ = ["inline_blocks", "inline_with_schedule"]
