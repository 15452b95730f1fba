"""Keep the pre-legalization form of every Relax function for the selection that follows.

``LegalizeOps`` replaces each Relax op call by a ``call_tir`` but keeps the binding variables,
so the legalized graph's nodes can be traced back to the Relax calls they came from. Library
generators (CUTLASS) match their patterns on those calls. :class:`RecordOrigin` stores the
functions in the module attribute :data:`ORIGIN_ATTR` just before legalization;
:class:`~tvm_ext.select.select_pass.SelectKernels` reads it and removes it.

Example
-------
>>> mod = RecordOrigin()(mod)
>>> sorted(origin_functions(mod))
['main']
"""
from __future__ import annotations

import tvm
from tvm import relax

ORIGIN_ATTR = "tvm_ext.origin"


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.RecordOrigin")
class RecordOrigin:
    """Store every Relax function (by name) in the module attribute :data:`ORIGIN_ATTR`."""

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:  # noqa: D102 - pass protocol
        funcs = {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, relax.Function)}
        return mod.with_attr(ORIGIN_ATTR, funcs)


def origin_functions(mod: tvm.IRModule) -> dict[str, relax.Function]:
    """The recorded pre-legalization functions (empty when none were recorded)."""
    if mod.attrs is None or ORIGIN_ATTR not in mod.attrs:
        return {}
    return {str(k): v for k, v in mod.attrs[ORIGIN_ATTR].items()}


def without_origin(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` without the recorded functions (they must not reach code generation)."""
    if mod.attrs is None or ORIGIN_ATTR not in mod.attrs:
        return mod
    return mod.without_attr(ORIGIN_ATTR)


__all__ = ["ORIGIN_ATTR", "RecordOrigin", "origin_functions", "without_origin"]
