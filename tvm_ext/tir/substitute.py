"""Variables of TIR: which ones a node uses, and substitution (``tvm.tirx.stmt_functor.substitute``
is gone in TVM 0.27).

Example
-------
>>> body = substitute_vars(kernel.body, {threadIdx_x: tirx.const(0, "int32")})
>>> vars_of([predicate])
"""
from __future__ import annotations

import tvm
import tvm_ffi


def substitute_vars(node, mapping: dict):
    """``node`` (a statement or an expression) with each variable of ``mapping`` replaced by its
    value (matched by identity)."""
    def on_var(var, mutator):
        for old, new in mapping.items():
            if var.same_as(old):
                return new
        return var

    return tvm_ffi.structural_mutate(node, (tvm.ir.Var, on_var))


def vars_of(nodes) -> set:
    """Every variable the nodes of ``nodes`` use (buffer variables included)."""
    found: set = set()
    for node in nodes:
        tvm_ffi.structural_walk(node, (tvm.ir.Var, found.add))
    return found


__all__ = ["substitute_vars", "vars_of"]
