"""Find the operators left to default lowering, and say why.

DESIGN.md: *nothing falls back silently*. Everything here is read from the shared attributes
(:mod:`tvm_ext.select.attrs`) of the scheduled module; an entry of :func:`find_fallbacks` is one of

``not_legalized``
    A binding of the fused graph that is not a ``call_tir`` of a PrimFunc nor a library kernel:
    an external / packed call or a Relax op without a legalization. Its kernels (if any) are not
    ours and are not in the kernel counts.
``dlight_fallback``
    A PrimFunc scheduled by dlight's generic ``Fallback`` rule (one thread per output element,
    no shared memory), or left unscheduled because no rule applies.
``marked``
    A PrimFunc carrying :data:`~tvm_ext.select.attrs.FALLBACK_ATTR`: its plan was refused or
    failed to lower (it runs as dlight's kernels), or one of dlight's rules raised on it.

Convention for technique passes
-------------------------------
A technique that cannot handle an operator leaves it to the default lowering and marks the
PrimFunc that ends up computing it::

    func = func.with_attr("tvm_ext.fallback", "stitch: reduction over a non-innermost axis")

The value is one readable line that starts with the technique's name. ``FuseTIR`` drops the
attributes of the functions it fuses, so set it on the fused PrimFunc (graph stage output) or in
the schedule stage.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import tirx

from ..graph import OpGraph
from ..select.attrs import FALLBACK_ATTR, RULE_ATTR, func_attr

#: Reason given for PrimFuncs that only dlight's generic rule schedules.
DLIGHT_FALLBACK_REASON = "no specialized schedule rule matched: generic Fallback"

#: Relax ops that do not compute on the GPU (shape and memory bookkeeping).
_BOOKKEEPING_OPS = ("relax.shape_of", "relax.null_value", "relax.builtin.", "relax.memory.", "relax.vm.",
                    "relax.tensor_to_shape", "relax.hint_on_device", "relax.to_vdevice")


@dataclass(frozen=True)
class FallbackOp:
    """An operator (or fused PrimFunc) left to default lowering.

    Attributes
    ----------
    op : str
        What falls back: the op or external symbol, or the PrimFunc name.
    kind : str
        ``"not_legalized"``, ``"dlight_fallback"`` or ``"marked"``.
    reason : str
        Why, in one line.
    ops : tuple of str
        Member op names when ``op`` is a fused PrimFunc.
    """

    op: str
    kind: str
    reason: str
    ops: tuple[str, ...] = ()

    def to_json(self) -> dict:
        """JSON-serialisable form."""
        return {"op": self.op, "kind": self.kind, "reason": self.reason, "ops": list(self.ops)}


def _external_reason(op_name: str) -> str | None:
    if op_name.startswith(_BOOKKEEPING_OPS):
        return None
    if op_name.startswith("relax."):
        return f"not legalized to TIR: no legalization for Relax op '{op_name}'"
    return f"external call '{op_name}' (packed function, not a kernel any generator built)"


def find_fallbacks(graph: OpGraph, group_ops: dict[str, tuple[str, ...]], scheduled_mod: tvm.IRModule,
                   library: set[str] = frozenset()) -> list[FallbackOp]:
    """All fallbacks of a staged build (see the module docstring).

    Parameters
    ----------
    graph : OpGraph
        Graph of the fused (pre-``FuseTIR``) module.
    group_ops : dict
        PrimFunc name -> member op names (for naming fused PrimFuncs).
    scheduled_mod : IRModule
        Schedule-stage output.
    library : set of str
        External symbols of library kernels (built by a generator: not fallbacks).
    """
    found: list[FallbackOp] = []
    seen_external: set[str] = set()
    for node in graph.nodes:
        if node.func is not None or node.func_name in seen_external or node.func_name in library:
            continue
        reason = _external_reason(node.func_name)
        if reason is not None:
            seen_external.add(node.func_name)
            found.append(FallbackOp(op=node.func_name, kind="not_legalized", reason=reason))
    for gv, func in sorted(scheduled_mod.functions_items(), key=lambda item: item[0].name_hint):
        if not isinstance(func, tirx.PrimFunc):
            continue
        name = gv.name_hint
        rule = func_attr(func, RULE_ATTR)
        if rule == "Fallback":
            found.append(FallbackOp(op=name, kind="dlight_fallback", reason=DLIGHT_FALLBACK_REASON,
                                    ops=group_ops.get(name, ())))
        elif rule == "none":
            found.append(FallbackOp(op=name, kind="dlight_fallback", reason="no dlight rule applies: left unscheduled",
                                    ops=group_ops.get(name, ())))
        marked = func_attr(func, FALLBACK_ATTR)
        if marked is not None:
            found.append(FallbackOp(op=name, kind="marked", reason=marked, ops=group_ops.get(name, ())))
    return found


__all__ = ["DLIGHT_FALLBACK_REASON", "FallbackOp", "find_fallbacks"]
