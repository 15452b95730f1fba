"""Work a TIR function does, counted statically: planned (unscheduled) and executed (scheduled).

Counts are transcendental calls (``exp``, ``tanh``, ``sigmoid``, ...), loads from global memory
and floating-point operations, each per vector lane, with loops multiplied out.

* :func:`function_work` counts an unscheduled function: every operation of the computation once
  (a branch counts as its larger side).
* :func:`executed_work` counts a scheduled or lowered kernel as the grid executes it: thread-bound
  loops and ``thread_extent`` attributes multiply like loops, and a guarded statement (a block
  predicate, an ``if``) counts only the fraction of its iterations whose guard holds. The fraction
  is exact where the guard depends on loop and thread indices whose joint domain has at most
  :data:`ENUMERATION_LIMIT` points (they are enumerated), estimated from that many points drawn
  uniformly (a fixed seed) on a larger domain, and taken as always true where the guard reads
  data, which overstates.

The ratio of the two is the kernel's recomputation: inlining softmax's ``exp`` into its sum and its
normalisation executes it twice by design; a stitched recurrence that recomputes every earlier step
executes thousands of times its function's transcendentals (issue 34's LSTM). The cost model prices
a built kernel from what it executes (:func:`~tvm_ext.select.describe.describe_scheduled`).

Example
-------
>>> function_work(fused_func)
Work(transcendentals=128.0, global_loads=256.0, flops=128.0)
>>> executed_work(scheduled).ratio_over(function_work(fused_func))
1.0
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx

#: Joint domain size (points) up to which a guard's variables are enumerated; a larger domain is
#: sampled at this many points (a fraction p is then known within about sqrt(p / 2^18): a guard
#: passing 768 of 264 x 1024 threads, within 4% of itself).
ENUMERATION_LIMIT = 1 << 18
#: Floating-point operations one transcendental costs in :meth:`Work.arithmetic`: the CUDA C++
#: Programming Guide's arithmetic-instruction throughput table gives, per SM and clock, 128 32-bit
#: float add/multiply results and 16 special-function results (exp2, log2, rsqrt, sin, cos) on
#: compute capability 8.6 and 9.0 (H100, H200); 64 and 16 on 7.x and 8.0, where it would be 4.
TRANSCENDENTAL_FLOPS = 8.0

TRANSCENDENTAL = {"exp", "exp2", "exp10", "log", "log2", "log10", "log1p", "tanh", "sigmoid", "erf", "sqrt", "rsqrt",
                  "pow", "sin", "cos", "tan", "atan", "sinh", "cosh"}
_FLOAT_OPS = {"Add", "Sub", "Mul", "Div", "Min", "Max", "FloorDiv", "FloorMod", "Mod"}


@dataclass(frozen=True)
class Work:
    """Counts of one computation (see the module docstring)."""

    transcendentals: float = 0.0
    global_loads: float = 0.0
    flops: float = 0.0

    def __add__(self, other: Work) -> Work:
        return Work(self.transcendentals + other.transcendentals, self.global_loads + other.global_loads,
                    self.flops + other.flops)

    def __sub__(self, other: Work) -> Work:
        return Work(self.transcendentals - other.transcendentals, self.global_loads - other.global_loads,
                    self.flops - other.flops)

    def __mul__(self, k: float) -> Work:
        return Work(self.transcendentals * k, self.global_loads * k, self.flops * k)

    def max(self, other: Work) -> Work:
        """Elementwise maximum (the larger side of a branch)."""
        return Work(max(self.transcendentals, other.transcendentals), max(self.global_loads, other.global_loads),
                    max(self.flops, other.flops))

    @property
    def arithmetic(self) -> float:
        """Floating-point operations with each transcendental at :data:`TRANSCENDENTAL_FLOPS`."""
        return self.flops + TRANSCENDENTAL_FLOPS * self.transcendentals

    def ratio_over(self, planned: Work) -> float:
        """The largest of executed / planned over transcendentals and global loads (0 where planned has none)."""
        ratios = [a / b for a, b in ((self.transcendentals, planned.transcendentals),
                                     (self.global_loads, planned.global_loads)) if b > 0]
        return max(ratios, default=0.0)


def _lanes(dtype) -> int:
    return int(tvm.DataType(str(dtype)).lanes)


def _is_global(buffer) -> bool:
    scope = str(getattr(buffer.ty, "storage_scope", "") or "global")
    return scope == "global"


def _const(expr) -> float:
    return float(expr.value) if isinstance(expr, tirx.IntImm) else 1.0


class _Counter:
    """Counts over expression DAGs: a shared subexpression is counted once per reference but
    walked once (the fused functions of recurrent models share deep subtrees)."""

    def __init__(self) -> None:
        self._memo: dict[int, list] = {}

    def expr(self, e) -> Work:
        bucket = self._memo.setdefault(hash(e), [])
        for node, work in bucket:
            if node.same_as(e):
                return work
        work = self._expr(e)
        bucket.append((e, work))
        return work

    def _expr(self, e) -> Work:
        kind = type(e).__name__
        if kind in ("IntImm", "FloatImm", "StringImm", "Var"):
            return Work()
        if kind in ("TensorLoad", "BufferLoad"):
            inner = sum((self.expr(i) for i in e.indices), Work())
            return inner + Work(global_loads=_lanes(e.ty.dtype)) if _is_global(e.source) else inner
        if kind == "Call":
            args = sum((self.expr(a) for a in e.args), Work())
            name = e.op.name.split(".")[-1] if isinstance(e.op, tvm.ir.Op) else ""
            if name == "if_then_else":
                return self.expr(e.args[0]) + self.expr(e.args[1]).max(self.expr(e.args[2]))
            if name in TRANSCENDENTAL:
                return args + Work(transcendentals=_lanes(e.ty.dtype))
            return args
        if kind == "Let":
            return self.expr(e.value) + self.expr(e.body)
        if kind == "Select":
            return self.expr(e.condition) + self.expr(e.true_value).max(self.expr(e.false_value))
        children = [getattr(e, f) for f in ("a", "b", "value", "base", "stride") if hasattr(e, f)]
        work = sum((self.expr(c) for c in children), Work())
        if kind in _FLOAT_OPS and str(e.ty.dtype).startswith(("float", "bfloat")):
            work = work + Work(flops=_lanes(e.ty.dtype))
        return work

    def guarded(self, condition, then_work: Work, else_work: Work) -> Work:
        """A branch: its larger side (overridden where guards are weighed)."""
        return then_work.max(else_work)

    def loop(self, var, extent, body) -> Work:
        return self.stmt(body) * _const(extent)

    def stmt(self, s) -> Work:
        kind = type(s).__name__
        if kind == "SeqStmt":
            return sum((self.stmt(c) for c in s.seq), Work())
        if kind == "For":
            return self.loop(s.loop_var, s.extent, s.body)
        if kind == "AttrStmt":
            if s.attr_key == "thread_extent":
                return self.loop(s.node.var, s.value, s.body)
            return self.stmt(s.body)
        if kind == "IfThenElse":
            other = self.stmt(s.else_case) if s.else_case is not None else Work()
            return self.expr(s.condition) + self.guarded(s.condition, self.stmt(s.then_case), other)
        if kind == "BufferStore":
            return self.expr(s.value) + sum((self.expr(i) for i in s.indices), Work())
        if kind == "Evaluate":
            return self.expr(s.value)
        if kind in ("Bind", "LetStmt"):
            return self.expr(s.value) + (self.stmt(s.body) if getattr(s, "body", None) is not None else Work())
        if kind == "SBlockRealize":
            return self.block(s)
        if kind == "SBlock":
            return self.stmt(s.body)
        if kind == "While":
            return self.stmt(s.body)
        return Work()

    def block(self, realize) -> Work:
        return self.stmt(realize.block)


_BINARY = {"Add": operator.add, "Sub": operator.sub, "Mul": operator.mul, "Min": np.minimum, "Max": np.maximum,
           "LT": operator.lt, "LE": operator.le, "GT": operator.gt, "GE": operator.ge, "EQ": operator.eq,
           "NE": operator.ne, "And": np.logical_and, "Or": np.logical_or}


class _Unknown(Exception):
    """A guard the enumeration cannot evaluate (it is then taken as true)."""


class _ExecutedCounter(_Counter):
    """Counts what the grid executes: guards weighed by the fraction of iterations that take them."""

    def __init__(self) -> None:
        super().__init__()
        self._extents: dict[tirx.Var, int] = {}     # loop and thread variables in scope
        self._bound: dict[tirx.Var, object] = {}     # block iteration variables -> their bindings
        self._guards: list = []                     # conditions of the enclosing branches

    def loop(self, var, extent, body) -> Work:
        if not isinstance(extent, tirx.IntImm):
            return self.stmt(body)
        self._extents[var] = int(extent.value)
        try:
            return self.stmt(body) * int(extent.value)
        finally:
            del self._extents[var]

    def block(self, realize) -> Work:
        block = realize.block
        for iv, value in zip(block.iter_vars, realize.iter_values):
            self._bound[iv.var] = value
        predicate = realize.predicate
        if isinstance(predicate, tirx.IntImm) and predicate.value:
            return self.stmt(block)
        return self.guarded(predicate, self._with_guard(predicate, block), Work())

    def guarded(self, condition, then_work: Work, else_work: Work) -> Work:
        p = self._fraction(condition)
        return then_work * p + else_work * (1.0 - p)

    def stmt(self, s) -> Work:
        if type(s).__name__ == "IfThenElse":   # the then side counted under its guard (nested guards)
            then_work = self._with_guard(s.condition, s.then_case)
            other = self._with_guard(tirx.Not(s.condition), s.else_case) if s.else_case is not None else Work()
            return self.expr(s.condition) + self.guarded(s.condition, then_work, other)
        return super().stmt(s)

    def _with_guard(self, condition, body) -> Work:
        self._guards.append(condition)
        try:
            return self.stmt(body)
        finally:
            self._guards.pop()

    def _fraction(self, condition) -> float:
        """P(condition | enclosing guards) over the loop domain (1.0 where it reads data)."""
        try:
            outer = self._probability(self._guards)
            both = self._probability([*self._guards, condition])
        except _Unknown:
            try:
                return self._probability([condition])
            except _Unknown:
                return 1.0
        return both / outer if outer > 0 else 0.0

    def _probability(self, conditions) -> float:
        if not conditions:
            return 1.0
        used: list[tirx.Var] = []
        for c in conditions:
            self._variables(c, used)
        if math.prod(self._extents[v] for v in used) > ENUMERATION_LIMIT:   # sampled
            rng = np.random.default_rng(0)
            axes = {v: rng.integers(0, self._extents[v], ENUMERATION_LIMIT) for v in used}
            shape = [ENUMERATION_LIMIT]
        else:
            axes = {v: np.arange(self._extents[v]).reshape([-1 if j == i else 1 for j in range(len(used))])
                    for i, v in enumerate(used)}
            shape = [self._extents[v] for v in used]
        value = np.ones([1] * len(shape), dtype=bool)
        for c in conditions:
            value = np.logical_and(value, self._evaluate(c, axes))
        return float(np.broadcast_to(value, shape).mean())

    def _variables(self, e, used: list) -> None:
        found: list[tirx.Var] = []
        tvm_ffi.structural_walk(e, (tirx.Var, found.append))
        for node in found:
            if node in self._bound:
                self._variables(self._bound[node], used)
            elif node in self._extents:
                if not any(node.same_as(u) for u in used):
                    used.append(node)
            else:
                raise _Unknown

    def _evaluate(self, e, axes):
        kind = type(e).__name__
        if kind == "IntImm":
            return int(e.value)
        if kind == "Var":
            if e in self._bound:
                return self._evaluate(self._bound[e], axes)
            return axes[e]
        if kind == "Cast":
            return self._evaluate(e.value, axes)
        if kind == "Not":
            return np.logical_not(self._evaluate(e.a, axes))
        if kind in ("FloorDiv", "FloorMod", "Div", "Mod"):   # non-negative loop indices: C and floor agree
            a, b = self._evaluate(e.a, axes), self._evaluate(e.b, axes)
            if isinstance(b, int) and b == 0:
                raise _Unknown
            return a // b if kind in ("FloorDiv", "Div") else a % b
        if kind in _BINARY:
            return _BINARY[kind](self._evaluate(e.a, axes), self._evaluate(e.b, axes))
        raise _Unknown


def function_work(func: tirx.PrimFunc) -> Work:
    """Work of unscheduled ``func``: every operation of the computation once."""
    return _Counter().stmt(func.body)


def executed_work(func: tirx.PrimFunc) -> Work:
    """Work the grid executes for scheduled or lowered ``func`` (see the module docstring)."""
    return _ExecutedCounter().stmt(func.body)


__all__ = ["ENUMERATION_LIMIT", "TRANSCENDENTAL", "TRANSCENDENTAL_FLOPS", "Work", "executed_work", "function_work"]
