"""Replace functions of an IRModule without touching the caller's module.

``mod[gv] = func`` writes into ``mod`` itself; a pass that does so changes a module its caller
may still hold (and compare against). :func:`with_functions` returns a changed copy instead;
:func:`rewrite_relax_functions` runs a Relax mutator over a module's functions into its builder's.

Example
-------
>>> new = with_functions(mod, {gv: scheduled})
>>> new[gv] is not mod[gv]
True
"""
from __future__ import annotations

from collections.abc import Mapping

import tvm
from tvm import relax


def with_functions(mod: tvm.IRModule, updates: Mapping[tvm.ir.GlobalVar, tvm.ir.BaseFunc]) -> tvm.IRModule:
    """A copy of ``mod`` with ``updates`` applied (``mod`` itself when there are none)."""
    if not updates:
        return mod
    out = mod.clone()
    for gv, func in updates.items():
        out[gv] = func
    return out


def reference_counts(func: relax.Function) -> dict[relax.Var, int]:
    """How often each variable of ``func`` is referenced (its binding sites not counted)."""
    refs: dict[relax.Var, int] = {}

    def visit(expr) -> None:
        if isinstance(expr, relax.Var):
            refs[expr] = refs.get(expr, 0) + 1

    relax.analysis.post_order_visit(func.body, visit)
    return refs


def rewrite_relax_functions(mod: tvm.IRModule, mutator: relax.PyExprMutator, *,
                            skip_offloaded: bool = False) -> tvm.IRModule:
    """The module of ``mutator`` (a ``relax.PyExprMutator`` made over ``mod``, so ``mod`` stays as
    it is) once it has rewritten every Relax function of ``mod``; with ``skip_offloaded``, not
    those already offloaded to a library (a ``Codegen`` attribute)."""
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function) and not (skip_offloaded and func.attrs and "Codegen" in func.attrs):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return mutator.builder_.get()


__all__ = ["reference_counts", "rewrite_relax_functions", "with_functions"]
