"""Buffer indices that TVM's ``FlattenBuffer`` would rewrite to a wrong element, kept as written.

``FlattenBuffer`` passes every flattened index through ``IterMapSimplify`` at the *surjective*
level, which may *pad* an iterator to split it: for ``(x % 28 - 3) // 7`` it shifts the iterator
``x`` itself (``x + 4``) and then re-expresses every split of ``x`` in the access from the shifted
source. When the splits need different shifts the result is simply another number: a shifted
window (Swin's roll, ``strided_slice`` + ``concatenate``) inlined into its consumer read
``lv205[(r + 112) % 784 // 196 * 37632 + ...]`` for ``lv205[(r % 784 - 84) // 196 * 37632 + ...]``,
wrong on 538 of 784 rows and before the buffer's start on some. (The class of
tile-ai/tilelang#2955: ``tx % 64 % 7`` simplified to ``tx % 7``.) The check that found it is the
thread-serialized one: the CPU build runs the same pass.

:func:`guard_flatten_indices` finds, for each access to a parameter buffer, whether
``DetectIterMap`` would need padding for its flattened index in terms of the loop variables (block
variables replaced by their bindings, loop ranges, block predicates and branch conditions as the
predicate), and wraps each index of such an access that holds a ``floordiv`` / ``floormod`` in
``index | 0``: an identity the arithmetic simplifiers keep, that ``DetectIterMap`` cannot parse
(so ``IterMapSimplify`` returns the index unchanged) and that nvcc and LLVM fold away. Accesses to
buffers the function allocates are left alone (logged at debug level): a wrapped index would
make ``CompactBufferAllocation`` keep the whole buffer; ``tvm-ext verify``'s emulation of the
lowered kernel is what shows whether one of those went wrong. :class:`GuardFlattenIndices` runs it first in
the ``"tvm_ext"`` TIR pipeline (and so in every build the checks make).

Example
-------
>>> guarded = guard_flatten_indices(scheduled)     # a PrimFunc before lowering
"""
from __future__ import annotations

import logging

import tvm
import tvm.sym
import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlockRealize

from ..ir_update import with_functions
from .predicates import IF_THEN_ELSE, conjoin, is_false, is_true
from .substitute import substitute_vars

log = logging.getLogger(__name__)

_SURJECTIVE = tvm.sym.iter_affine_map.IterMapLevel.Surjective


def _has_division(expr) -> bool:
    found = []
    tvm_ffi.structural_walk(expr, [(tirx.FloorDiv, found.append), (tirx.FloorMod, found.append)])
    return bool(found)


def _row_major(indices, shape):
    flat = None
    for index, extent in zip(indices, shape):
        flat = index if flat is None else flat * extent + index
    return flat


def _misaligned(expr) -> bool:
    """Whether ``expr`` divides (``floordiv`` / ``floormod`` by a constant) a dividend that is not a
    multiple of the divisor at the origin (every variable 0): ``(x % 28 - 3) // 7``,
    ``(x // 28 + 4) % 7``. IterMapSimplify left-pads such a split's iterator."""
    found = []

    def on_division(node) -> None:
        divisor = node.b
        if not (isinstance(divisor, tirx.IntImm) and int(divisor.value) > 1):
            return
        variables, loads = [], []
        tvm_ffi.structural_walk(node.a, [(tvm.ir.TensorLoad, loads.append), (tvm.ir.Var, variables.append)])
        if not variables or loads:      # constant, or an indirect index (not an iterator split)
            return
        origin = tvm.sym.Analyzer().simplify(
            substitute_vars(node.a, {v: tirx.const(0, v.ty.dtype) for v in variables}))
        if isinstance(origin, tirx.IntImm) and int(origin.value) % int(divisor.value):
            found.append(node)

    tvm_ffi.structural_walk(expr, [(tirx.FloorDiv, on_division), (tirx.FloorMod, on_division)])
    return bool(found)


def _needs_padding(flat, iters: dict, predicate) -> bool:
    """Whether ``IterMapSimplify(flat)`` would use a padded iterator (``FlattenBuffer``'s order:
    with the predicate, then without it)."""
    for pred in ([predicate] if is_true(predicate) else [predicate, tirx.const(True, "bool")]):
        result = tvm.sym.detect_iter_map([flat], iters, pred, _SURJECTIVE)
        if len(result.indices):
            return not is_false(result.padding_predicate)
    return False


class _Guard:
    """One walk over a function: the loop ranges, bindings and conditions in scope at each access."""

    def __init__(self, params: set):
        self.params = params
        self.iters: dict = {}         # loop variable -> Range
        self.bound: dict = {}         # block variable -> its binding, in loop variables
        self.conditions: list = []
        self.guarded: list[str] = []
        self.left: list[str] = []

    def _resolve(self, expr):
        return substitute_vars(expr, self.bound) if self.bound else expr

    def _risky(self, buffer, indices) -> bool:
        resolved = [self._resolve(i) for i in indices]
        if not any(_has_division(i) for i in resolved):
            return False
        predicate = conjoin(self.conditions)
        analyzer = tvm.sym.Analyzer()
        for var, dom in self.iters.items():
            analyzer.bind(var, dom)
        with analyzer.constraint_scope(predicate):
            simplified = [analyzer.simplify(i) for i in resolved]
        if any(_misaligned(i) for i in resolved + simplified):
            return True
        shape = list(buffer.ty.shape)
        return any(_needs_padding(_row_major(form, shape), self.iters, predicate) for form in (resolved, simplified))

    def _indices(self, buffer, indices):
        """``indices`` wrapped when risky; None when left as they are."""
        if not self._risky(buffer, indices):
            return None
        if not any(buffer.same_as(p) for p in self.params):
            self.left.append(buffer.name)
            return None
        self.guarded.append(buffer.name)
        return [tirx.bitwise_or(i, tirx.const(0, i.ty.dtype)) if _has_division(i) else i for i in indices]

    def _scoped(self, mutator, node, iters=None, bound=None, conditions=()):
        saved = (dict(self.iters), dict(self.bound), list(self.conditions))
        self.iters.update(iters or {})
        self.bound.update(bound or {})
        self.conditions.extend(conditions)
        try:
            return mutator.default_mutate(node)
        finally:
            self.iters, self.bound, self.conditions = saved

    def on_for(self, loop, mutator):
        dom = tvm.ir.Range.from_min_extent(self._resolve(loop.min), self._resolve(loop.extent))
        return self._scoped(mutator, loop, iters={loop.loop_var: dom})

    def on_attr(self, stmt, mutator):
        if stmt.attr_key != "thread_extent":
            return mutator.default_mutate(stmt)
        var = stmt.node.var
        return self._scoped(mutator, stmt, iters={var: tvm.ir.Range.from_min_extent(tirx.const(0, var.ty.dtype),
                                                                                     stmt.value)})

    def on_realize(self, realize, mutator):
        bound = {iv.var: self._resolve(v) for iv, v in zip(realize.block.iter_vars, realize.iter_values)}
        conditions = [] if is_true(realize.predicate) else [self._resolve(realize.predicate)]
        return self._scoped(mutator, realize, bound=bound, conditions=conditions)

    def on_if(self, stmt, mutator):
        cond = self._resolve(stmt.condition)
        then = self._branch(mutator, stmt.then_case, cond)
        other = None if stmt.else_case is None else self._branch(mutator, stmt.else_case, tirx.Not(cond))
        return tirx.IfThenElse(mutator.mutate(stmt.condition), then, other)

    def on_call(self, call, mutator):
        if not (isinstance(call.op, tvm.ir.Op) and call.op.same_as(IF_THEN_ELSE)):
            return mutator.default_mutate(call)
        cond = self._resolve(call.args[0])
        return tirx.if_then_else(mutator.mutate(call.args[0]), self._branch(mutator, call.args[1], cond),
                                 self._branch(mutator, call.args[2], tirx.Not(cond)))

    def _branch(self, mutator, node, cond):
        self.conditions.append(cond)
        try:
            return mutator.mutate(node)
        finally:
            self.conditions.pop()

    def on_load(self, load, mutator):
        new = mutator.default_mutate(load)
        indices = self._indices(new.source, list(new.indices))
        return new if indices is None else tirx.BufferLoad(new.source, indices)

    def on_store(self, store, mutator):
        new = mutator.default_mutate(store)
        indices = self._indices(new.buffer, list(new.indices))
        return new if indices is None else tirx.BufferStore(new.buffer, new.value, indices)


def guard_flatten_indices(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each parameter-buffer index that ``FlattenBuffer`` would simplify through a
    padded iterator wrapped in ``| 0`` (see the module docstring); ``func`` itself when none is."""
    guard = _Guard(set(func.params))
    body = tvm_ffi.structural_mutate(func.body, [
        (tirx.For, guard.on_for), (tirx.AttrStmt, guard.on_attr), (SBlockRealize, guard.on_realize),
        (tirx.IfThenElse, guard.on_if), (tvm.ir.Call, guard.on_call), (tvm.ir.TensorLoad, guard.on_load),
        (tirx.BufferStore, guard.on_store)])
    if guard.left:      # mostly right-padded virtual-block splits; the emulator is the judge
        log.debug("indices that FlattenBuffer may simplify wrongly, on buffers the function allocates, "
                    "left as they are: %s", sorted(set(guard.left)))
    if not guard.guarded:
        return func
    log.debug("kept %d indices from FlattenBuffer's padded simplification: %s", len(guard.guarded),
              sorted(set(guard.guarded)))
    return func.with_body(body)


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.GuardFlattenIndices")
class GuardFlattenIndices:
    """:func:`guard_flatten_indices` on every PrimFunc of a module."""

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:  # noqa: D102 - pass protocol
        updates = {}
        for gv, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc):
                guarded = guard_flatten_indices(func)
                if not guarded.same_as(func):
                    updates[gv] = guarded
        return with_functions(mod, updates)


__all__ = ["GuardFlattenIndices", "guard_flatten_indices"]
