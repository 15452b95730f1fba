"""Conditions in TIR: constant truth, conjunctions, ``if_then_else``.

Block predicates (``T.where``), branch conditions and ``if_then_else`` are what the passes and
checks that reason about which instances run (the index guard, the write-back predicates, the
write-once lint) take apart and put together.

Example
-------
>>> conjoin([a < 4, b < 8])           # a < 4 and b < 8
>>> conjuncts(realize.predicate)       # [a < 4, b < 8]
"""
from __future__ import annotations

import tvm
from tvm import tirx

#: The ``if_then_else`` operator (``T.if_then_else``).
IF_THEN_ELSE = tvm.ir.Op.get("prim.if_then_else")


def is_true(expr) -> bool:
    """Whether ``expr`` is the constant true (an unpredicated block's predicate)."""
    return isinstance(expr, tirx.IntImm) and int(expr.value) == 1


def is_false(expr) -> bool:
    """Whether ``expr`` is the constant false."""
    return isinstance(expr, tirx.IntImm) and int(expr.value) == 0


def conjuncts(expr) -> list:
    """The operands of a chain of ``and``s (``[expr]`` for anything else)."""
    if isinstance(expr, tirx.And):
        return conjuncts(expr.a) + conjuncts(expr.b)
    return [expr]


def conjoin(conditions, start=None):
    """``start and c0 and c1 ...`` (``start``: true by default); true for no conditions."""
    out = tirx.const(True, "bool") if start is None else start
    for cond in conditions:
        out = cond if is_true(out) else tirx.And(out, cond)
    return out


__all__ = ["IF_THEN_ELSE", "conjoin", "conjuncts", "is_false", "is_true"]
