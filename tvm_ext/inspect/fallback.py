"""Find the operators left to default lowering, and say why.

DESIGN.md: *nothing falls back silently*. An entry of :func:`find_fallbacks` is one of

``not_legalized``
    A binding of the fused graph that is not a ``call_tir`` of a PrimFunc: an external /
    packed call (``call_dps_packed``, a BYOC function) or a Relax op without a legalization.
    Its kernels (if any) are not ours and are not in the kernel counts.
``dlight_fallback``
    A PrimFunc that the preset hands to dlight (``ApplyDefaultSchedule``) and that matches
    none of the specialised rules; only the generic ``Fallback`` rule (one thread per output
    element, no shared memory) schedules it. The rule that applied is the one the schedule
    stage recorded (:class:`~tvm_ext.default_schedule.SafeDefaultSchedule`).
``dlight_rule_failed``
    A PrimFunc on which one of TVM's dlight rules raised; it was scheduled by the next rule.
``marked``
    A PrimFunc carrying the function attribute :data:`FALLBACK_ATTR`.

Convention for technique passes (``"tvm_ext.fallback"``)
--------------------------------------------------------
A technique pass that cannot handle an operator leaves it to the default lowering and marks
the PrimFunc that ends up computing it::

    func = func.with_attr("tvm_ext.fallback", "stitch: reduction over a non-innermost axis")

The value is a one-line, human-readable reason (a ``str``) that starts with the technique's
name. Set it on the PrimFunc after ``FuseTIR`` (the graph stage's output) or in the schedule
stage: ``FuseTIR`` builds new PrimFuncs and drops the attributes of its inputs. The report
lists every marked PrimFunc with the reason.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import tirx

from ..graph import OpGraph

#: Function attribute with which a pass marks a PrimFunc as left to default lowering.
FALLBACK_ATTR = "tvm_ext.fallback"

#: dlight rules of the baseline (TVM 0.27's CUDA pipeline), in the order they are tried.
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
        ``"not_legalized"``, ``"dlight_fallback"``, ``"dlight_rule_failed"``, ``"stitch_fallback"``
        (a stitched group a stitch schedule builder refused) or ``"marked"``.
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


def dlight_rules_by_func(scheduled_mod: tvm.IRModule) -> dict[str, str] | None:
    """PrimFunc name -> the dlight rule the schedule stage applied (``"none"`` where no rule
    applies), as recorded by :class:`~tvm_ext.default_schedule.SafeDefaultSchedule`; for a
    function a technique scheduled itself, the technique's verdict (``"stitched+gemm_prologue"``)
    or ``"pre-scheduled"``. ``None`` if dlight did not run."""
    from ..default_schedule import RULES_ATTR
    from ..stitch.schedule_pass import REPORT_ATTR

    if scheduled_mod.attrs is None or RULES_ATTR not in scheduled_mod.attrs:
        return None
    rules = {str(k): str(v) for k, v in scheduled_mod.attrs[RULES_ATTR].items()}
    if REPORT_ATTR in scheduled_mod.attrs:
        for name, verdict in scheduled_mod.attrs[REPORT_ATTR].items():
            if rules.get(str(name)) == "pre-scheduled" and str(verdict).startswith("stitched"):
                rules[str(name)] = str(verdict)
    return rules


def dlight_failures(scheduled_mod: tvm.IRModule) -> dict[str, str]:
    """PrimFunc name -> the dlight rule that raised on it (it then took the next rule)."""
    from ..default_schedule import FAILURES_ATTR

    if scheduled_mod.attrs is None or FAILURES_ATTR not in scheduled_mod.attrs:
        return {}
    return {str(k): str(v) for k, v in scheduled_mod.attrs[FAILURES_ATTR].items()}


def _external_reason(op_name: str) -> str | None:
    if op_name.startswith(_BOOKKEEPING_OPS):
        return None
    if op_name.startswith("relax."):
        return f"not legalized to TIR: no legalization for Relax op '{op_name}'"
    return f"external call '{op_name}' (packed function or library kernel, not a TVM-generated kernel)"


def find_fallbacks(graph: OpGraph, group_ops: dict[str, tuple[str, ...]],
                   graph_mod: tvm.IRModule, scheduled_mod: tvm.IRModule,
                   dlight_rules: dict[str, str] | None) -> list[FallbackOp]:
    """All fallbacks of a staged build (see the module docstring).

    Parameters
    ----------
    graph : OpGraph
        Graph of the fused (pre-``FuseTIR``) module.
    group_ops : dict
        PrimFunc name -> member op names (for naming fused PrimFuncs).
    graph_mod, scheduled_mod : IRModule
        Graph-stage output and schedule-stage output (searched for :data:`FALLBACK_ATTR`).
    dlight_rules : dict or None
        :func:`dlight_rules_by_func` output; ``None`` when the preset does not use dlight.
    """
    found: list[FallbackOp] = []
    seen_external: set[str] = set()
    for node in graph.nodes:
        if node.func is not None or node.func_name in seen_external:
            continue
        reason = _external_reason(node.func_name)
        if reason is not None:
            seen_external.add(node.func_name)
            found.append(FallbackOp(op=node.func_name, kind="not_legalized", reason=reason))
    for name, rule in sorted((dlight_rules or {}).items()):
        if rule == "Fallback":
            found.append(FallbackOp(op=name, kind="dlight_fallback", reason=DLIGHT_FALLBACK_REASON,
                                    ops=group_ops.get(name, ())))
        elif rule == "none":
            found.append(FallbackOp(op=name, kind="dlight_fallback",
                                    reason="no dlight rule applies: left unscheduled",
                                    ops=group_ops.get(name, ())))
    for name, error in sorted(dlight_failures(scheduled_mod).items()):
        found.append(FallbackOp(op=name, kind="dlight_rule_failed",
                                reason=f"TVM's dlight rule raised ({error}); scheduled by the next rule",
                                ops=group_ops.get(name, ())))
    from ..stitch.schedule_pass import REPORT_ATTR

    if scheduled_mod.attrs is not None and REPORT_ATTR in scheduled_mod.attrs:
        for name, verdict in sorted((str(k), str(v)) for k, v in scheduled_mod.attrs[REPORT_ATTR].items()):
            if verdict.startswith("fallback"):
                found.append(FallbackOp(op=name, kind="stitch_fallback",
                                        reason=f"stitching could not schedule it ({verdict.split(':', 1)[-1].strip()});"
                                               " scheduled by dlight as separate kernels",
                                        ops=group_ops.get(name, ())))
    marked: dict[str, str] = {}
    for mod in (graph_mod, scheduled_mod):
        for gv, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc) and func.attrs is not None and FALLBACK_ATTR in func.attrs:
                marked.setdefault(gv.name_hint, str(func.attrs[FALLBACK_ATTR]))
    for name, reason in sorted(marked.items()):
        found.append(FallbackOp(op=name, kind="marked", reason=reason, ops=group_ops.get(name, ())))
    return found
