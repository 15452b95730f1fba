"""Work a kernel executes against the work of the function it computes: recomputation blow-ups.

Planned work is counted statically on the unscheduled function, loops multiplied out:
transcendental calls (``exp``, ``tanh``, ``sigmoid``, ...), loads from global memory and
floating-point operations, each per vector lane, every operation of the computation once (a
branch counts as its larger side). Executed work is counted by the emulator on the lowered
kernel, lane by lane, over the blocks it ran and scaled to the grid
(:mod:`tvm_ext.checks.emulator`): a thread-predicated statement counts only the threads that run it.

Inlining an elementwise op into its consumers recomputes it by design (softmax's ``exp`` in the
sum and in the normalisation: 2x); a kernel that executes more than :data:`RECOMPUTE_LIMIT`
times its function's transcendentals or global loads recomputes beyond that (the stitched LSTM
recomputed the recurrence from step 0 at every step: a finding, and the kernel is priced from
what it executes).

Example
-------
>>> planned = function_work(fused_func)
>>> verdict = emulate_function(fused_func, scheduled, target)
>>> verdict.executed.ratio_over(planned)
1.0
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import tirx

from .values import lanes_of

#: Executed / planned work above which a kernel is reported as recomputing.
RECOMPUTE_LIMIT = 3.0
#: Finding kinds about cost, not correctness (reported as warnings: the kernel computes right).
PERFORMANCE_KINDS = frozenset({"recompute", "spill"})
#: Executed / planned work at which the emulation stops (the kernel is reported, not run to the
#: end), plus :data:`EMULATION_ALLOWANCE` of each count (a small function's 10x is still cheap to run).
EMULATION_BUDGET = 8.0
EMULATION_ALLOWANCE = 2e5

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

    def __mul__(self, k: float) -> Work:
        return Work(self.transcendentals * k, self.global_loads * k, self.flops * k)

    def __sub__(self, other: Work) -> Work:
        return Work(self.transcendentals - other.transcendentals, self.global_loads - other.global_loads,
                    self.flops - other.flops)

    def max(self, other: Work) -> Work:
        """Elementwise maximum (the larger side of a branch)."""
        return Work(max(self.transcendentals, other.transcendentals), max(self.global_loads, other.global_loads),
                    max(self.flops, other.flops))

    def ratio_over(self, planned: Work) -> float:
        """The largest of executed / planned over transcendentals and global loads (0 where planned has none)."""
        ratios = [a / b for a, b in ((self.transcendentals, planned.transcendentals),
                                     (self.global_loads, planned.global_loads)) if b > 0]
        return max(ratios, default=0.0)


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
            return inner + Work(global_loads=lanes_of(e.ty.dtype)) if _is_global(e.source) else inner
        if kind == "Call":
            args = sum((self.expr(a) for a in e.args), Work())
            name = e.op.name.split(".")[-1] if isinstance(e.op, tvm.ir.Op) else ""
            if name == "if_then_else":
                return self.expr(e.args[0]) + self.expr(e.args[1]).max(self.expr(e.args[2]))
            if name in TRANSCENDENTAL:
                return args + Work(transcendentals=lanes_of(e.ty.dtype))
            return args
        if kind == "Let":
            return self.expr(e.value) + self.expr(e.body)
        if kind == "Select":
            return self.expr(e.condition) + self.expr(e.true_value).max(self.expr(e.false_value))
        children = [getattr(e, f) for f in ("a", "b", "value", "base", "stride") if hasattr(e, f)]
        work = sum((self.expr(c) for c in children), Work())
        if kind in _FLOAT_OPS and str(e.ty.dtype).startswith(("float", "bfloat")):
            work = work + Work(flops=lanes_of(e.ty.dtype))
        return work

    def stmt(self, s) -> Work:
        kind = type(s).__name__
        if kind == "SeqStmt":
            return sum((self.stmt(c) for c in s.seq), Work())
        if kind == "For":
            return self.stmt(s.body) * _const(s.extent)
        if kind == "AttrStmt":
            body = self.stmt(s.body)
            return body * _const(s.value) if s.attr_key == "thread_extent" else body
        if kind == "IfThenElse":
            other = self.stmt(s.else_case) if s.else_case is not None else Work()
            return self.expr(s.condition) + self.stmt(s.then_case).max(other)
        if kind == "BufferStore":
            return self.expr(s.value) + sum((self.expr(i) for i in s.indices), Work())
        if kind in ("Evaluate",):
            return self.expr(s.value)
        if kind in ("Bind", "LetStmt"):
            return self.expr(s.value)
        if kind == "SBlockRealize":
            return self.stmt(s.block)
        if kind == "SBlock":
            return self.stmt(s.body)
        if kind == "While":
            return self.stmt(s.body)
        return Work()


def function_work(func: tirx.PrimFunc) -> Work:
    """Work of unscheduled ``func``: every operation of the computation once."""
    return _Counter().stmt(func.body)


__all__ = ["EMULATION_ALLOWANCE", "EMULATION_BUDGET", "PERFORMANCE_KINDS", "RECOMPUTE_LIMIT", "TRANSCENDENTAL", "Work",
           "function_work"]
