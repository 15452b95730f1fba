"""Replace functions of an IRModule without touching the caller's module.

``mod[gv] = func`` writes into ``mod`` itself; a pass that does so changes a module its caller
may still hold (and compare against). :func:`with_functions` returns a changed copy instead.

Example
-------
>>> new = with_functions(mod, {gv: scheduled})
>>> new[gv] is not mod[gv]
True
"""
from __future__ import annotations

from collections.abc import Mapping

import tvm


def with_functions(mod: tvm.IRModule, updates: Mapping[tvm.ir.GlobalVar, tvm.ir.BaseFunc]) -> tvm.IRModule:
    """A copy of ``mod`` with ``updates`` applied (``mod`` itself when there are none)."""
    if not updates:
        return mod
    out = mod.clone()
    for gv, func in updates.items():
        out[gv] = func
    return out


__all__ = ["with_functions"]
