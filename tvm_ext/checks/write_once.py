"""Output elements that two instances of one block write: a static check of a scheduled kernel.

A spatial block (no reduction axis) computes each element it writes once. When two of its
instances (threads, blocks, loop iterations) store to one element of a parameter buffer, the
result is whichever store lands last. (Two instances that differ only in the thread block running
them, with the same block variables and thread indices, are one block's work replicated: a
merged kernel's stage run by more blocks than it has work for. That is not counted.) TVM 0.27's dlight ``Matmul`` rule builds such a kernel when
it pads a GEMM whose epilogue reshapes: Swin-T's attention output ``T_reshape[v0 // 3, v1, v2 +
v0 % 3 * 32]`` with the head dimension ``v2`` padded from 32 to 64 and the predicate
``v0 % 3 * 32 + v2 < 96`` (the output's bound, not the head's) stores each head's zero padding
onto the next head's columns. Threads serialized in increasing order hide it (the next head
writes later); blocks in another order, as the GPU runs them, do not.

:func:`duplicate_writes` looks at each such store under a predicate or branch (without one, every
instance of a schedule of the function's own domain stores once): when ``DetectIterMap`` proves
the index a bijection of the loops there is nothing to see; otherwise it evaluates the index over
the whole loop nest (constant extents, at most :data:`MAX_INSTANCES` instances; larger nests and
indices it cannot evaluate, such as indirect ones, are not checked), masked by the conditions,
and names the parameter buffers some element of which is written twice.

Example
-------
>>> duplicate_writes(scheduled)
['T_reshape_intermediate_1']
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
import tvm.sym
from tvm import tirx
from tvm.s_tir import SBlockRealize

from ..tir.predicates import IF_THEN_ELSE, conjoin, is_true
from ..tir.substitute import substitute_vars
from .tir_expr import binary_op, dtype_of

#: Instances of one store's loop nest evaluated at most (int64 arrays of this many entries).
MAX_INSTANCES = 1 << 22

_BIJECTIVE = tvm.sym.iter_affine_map.IterMapLevel.Bijective


class _NotEvaluated(Exception):
    """An index or condition this check does not evaluate (the store is not checked)."""


def _value(expr, env: dict):
    """``expr`` over the loop grid: numpy arrays broadcast along the loops, or Python ints."""
    kind = type(expr).__name__
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    if isinstance(expr, tvm.ir.Var):
        if expr not in env:
            raise _NotEvaluated(f"variable {expr.name}")
        return env[expr]
    if kind == "Not":
        return np.logical_not(_value(expr.a, env))
    if kind == "Cast":
        value = _value(expr.value, env)
        return np.asarray(value).astype(dtype_of(expr)) if dtype_of(expr).kind in "iub" else _fail(kind)
    if kind == "Select":
        return np.where(_value(expr.condition, env), _value(expr.true_value, env), _value(expr.false_value, env))
    if isinstance(expr, tvm.ir.Call) and expr.op.same_as(IF_THEN_ELSE):
        cond, true_value, false_value = (_value(a, env) for a in expr.args)
        return np.where(cond, true_value, false_value)
    op = binary_op(kind, dtype_of(expr.a)) if hasattr(expr, "b") else None
    if op is None:
        return _fail(kind)
    return op(_value(expr.a, env), _value(expr.b, env))


def _fail(kind: str):
    raise _NotEvaluated(f"expression {kind}")


@dataclass(frozen=True)
class _Store:
    buffer: object
    indices: tuple
    loops: tuple          # (var, min, extent) from the outermost
    conditions: tuple     # predicates and branch conditions, in loop and block variables
    bindings: tuple       # (block var, value), outermost block first
    #: the storing block's variables and the thread-level loops (bound to threadIdx or inside one):
    #: two instances equal in all of them are one block's work replicated on another block
    replica_key: tuple = ()


class _Collector:
    def __init__(self, params: set):
        self.params = params
        self.stores: list[_Store] = []

    def visit(self, stmt, loops: tuple, conditions: tuple, bindings: tuple, spatial: bool, block=None,
              threads: tuple = ()) -> None:
        if isinstance(stmt, tirx.SeqStmt):
            for item in stmt.seq:
                self.visit(item, loops, conditions, bindings, spatial, block, threads)
        elif isinstance(stmt, tirx.For):
            binding = stmt.thread_binding
            tag = str(binding.thread_tag) if binding is not None else ""
            in_threads = threads + (stmt.loop_var,) if threads or tag.startswith("threadIdx") else threads
            self.visit(stmt.body, loops + ((stmt.loop_var, stmt.min, stmt.extent),), conditions, bindings, spatial,
                       block, in_threads)
        elif isinstance(stmt, SBlockRealize):
            block = stmt.block
            reduces = any(int(iv.iter_type) != 0 for iv in block.iter_vars)     # 0: data parallel
            pred = () if is_true(stmt.predicate) else (stmt.predicate,)
            self.visit(block.body, loops, conditions + pred,
                       bindings + tuple((iv.var, v) for iv, v in zip(block.iter_vars, stmt.iter_values)),
                       spatial and not reduces, block, threads)
        elif isinstance(stmt, tirx.IfThenElse):
            self.visit(stmt.then_case, loops, conditions + (stmt.condition,), bindings, spatial, block, threads)
            if stmt.else_case is not None:
                self.visit(stmt.else_case, loops, conditions + (tirx.Not(stmt.condition),), bindings, spatial, block,
                           threads)
        elif isinstance(stmt, tirx.BufferStore):
            if spatial and any(stmt.buffer.same_as(p) for p in self.params):
                key = (tuple(iv.var for iv in block.iter_vars) if block is not None else ()) + threads
                self.stores.append(_Store(stmt.buffer, tuple(stmt.indices), loops, conditions, bindings, key))
        elif hasattr(stmt, "body"):
            self.visit(stmt.body, loops, conditions, bindings, spatial, block, threads)


def _bijective(store: _Store) -> bool:
    """Whether ``DetectIterMap`` proves the store's index a bijection of its loops under its
    conditions (no instance needs evaluating then)."""
    iters = {var: tvm.ir.Range.from_min_extent(lo, ext) for var, lo, ext in store.loops}
    bound = dict(store.bindings)
    resolved = [substitute_vars(i, bound) for i in store.indices]
    predicate = conjoin(substitute_vars(cond, bound) for cond in store.conditions)
    result = tvm.sym.detect_iter_map(resolved, iters, predicate, _BIJECTIVE)
    return len(result.indices) > 0


def _written_twice(store: _Store) -> bool:
    if not store.conditions:    # every instance stores: a schedule of the function's own domain
        return False
    if _bijective(store):
        return False
    extents = []
    for _, lo, ext in store.loops:
        if not (isinstance(lo, tirx.IntImm) and isinstance(ext, tirx.IntImm)):
            raise _NotEvaluated("a loop with a symbolic range")
        extents.append(int(ext.value))
    shape = tuple(extents)
    if int(np.prod(shape, dtype=np.int64)) > MAX_INSTANCES:
        raise _NotEvaluated("too many instances")
    env: dict = {}
    for k, (var, lo, ext) in enumerate(store.loops):
        view = [1] * len(shape)
        view[k] = int(ext.value)
        env[var] = np.arange(int(lo.value), int(lo.value) + int(ext.value), dtype=np.int64).reshape(view)
    for var, value in store.bindings:
        env[var] = _value(value, env)
    mask = np.ones(shape, dtype=bool)
    for cond in store.conditions:
        mask &= np.broadcast_to(np.asarray(_value(cond, env), dtype=bool), shape)
    flat = np.zeros(shape, dtype=np.int64)
    for index, extent in zip(store.indices, store.buffer.ty.shape):
        flat = flat * int(extent) + np.broadcast_to(np.asarray(_value(index, env), dtype=np.int64), shape)
    size = int(np.prod([int(d) for d in store.buffer.ty.shape], dtype=np.int64))
    mask &= (flat >= 0) & (flat < size)       # out of bounds is the emulator's finding
    written = flat[mask]
    if written.size == 0:
        return False
    if int(np.bincount(written, minlength=1).max()) < 2:
        return False
    # one element from two instances that differ in more than the block running them
    instance = [np.broadcast_to(np.asarray(env[v], dtype=np.int64), shape)[mask] for v in store.replica_key]
    order = np.lexsort(instance[::-1] + [written])
    same_element = written[order][1:] == written[order][:-1]
    other_instance = np.zeros(same_element.shape, dtype=bool)
    for column in instance:
        column = column[order]
        other_instance |= column[1:] != column[:-1]
    return bool((same_element & other_instance).any())


def duplicate_writes(func: tirx.PrimFunc) -> list[str]:
    """Names of the parameter buffers of ``func`` (a scheduled ``s_tir`` PrimFunc) of which some
    element is stored by two instances of one spatial block (see the module docstring)."""
    collector = _Collector(set(func.params))
    collector.visit(func.body, (), (), (), True)
    found: list[str] = []
    for store in collector.stores:
        if store.buffer.name in found:
            continue
        try:
            if _written_twice(store):
                found.append(store.buffer.name)
        except _NotEvaluated:
            continue
    return found


__all__ = ["MAX_INSTANCES", "duplicate_writes"]
