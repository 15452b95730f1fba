"""``FuseTIR`` that keeps the plans: fused PrimFuncs carry their group's plan.

``FuseTIR`` turns every ``Primitive`` Relax function into a PrimFunc of the same name but drops
the function's attributes. :class:`FuseTIRKeepPlans` reads the shared attributes of each
``Primitive`` function first and writes them onto the PrimFunc that replaces it, so the plan
travels with the kernel into the schedule stage.

Example
-------
>>> fused = FuseTIRKeepPlans()(emitted)
>>> plan_of(fused["fused_layer_norm_add"]).generator
'stitch'
"""
from __future__ import annotations

import tvm
from tvm import relax, tirx

from ..ir_update import with_functions
from .attrs import GENERATOR_ATTR, PLAN_ATTR

_KEPT = (PLAN_ATTR, GENERATOR_ATTR)


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.FuseTIRKeepPlans")
class FuseTIRKeepPlans:
    """``relax.transform.FuseTIR`` followed by moving :data:`~tvm_ext.select.attrs.PLAN_ATTR` and
    :data:`~tvm_ext.select.attrs.GENERATOR_ATTR` onto the fused PrimFuncs."""

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:  # noqa: D102 - pass protocol
        kept: dict[str, dict[str, str]] = {}
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function) and func.attrs is not None and "Primitive" in func.attrs:
                attrs = {k: str(func.attrs[k]) for k in _KEPT if k in func.attrs}
                if attrs:
                    kept[gv.name_hint] = attrs
        fused = relax.transform.FuseTIR()(mod)
        updates = {}
        for gv, func in fused.functions_items():
            if isinstance(func, tirx.PrimFunc) and gv.name_hint in kept:
                for key, value in kept[gv.name_hint].items():
                    func = func.with_attr(key, value)
                updates[gv] = func
        return with_functions(fused, updates)


__all__ = ["FuseTIRKeepPlans"]
