"""Fission where the cost model says it pays: the graph stage with and without it, the cheaper kept.

Korch's fission (:mod:`tvm_ext.fission`) widens the candidate space, but it also replaces an
operator TVM schedules well as one kernel (a softmax, a layer norm) by primitives, and on some
models no cover of the primitives is as cheap as the operator was (BERT-base at sequence 384:
the fp16 layer norm's float32 statistics become casts that land in GEMM epilogues). The
selector cannot choose between the two graphs, so this pass runs the preset's graph stage on
both and keeps the one whose selection the cost model prices lower (the sum of the selection
objectives over the module's functions). Which one was kept, and both totals, go into the
selection report's notes and the module attribute :data:`FISSION_ATTR`.

Example
-------
>>> stage = CheaperOfFission(with_fission_passes, without_fission_passes)
>>> mod = stage(mod)
>>> json.loads(mod.attrs["tvm_ext.fission"])
{'kept': False, 'with_s': 0.0018962, 'without_s': 0.0015283}
"""
from __future__ import annotations

import json
import logging

import tvm

from ..select.attrs import SELECTION_ATTR

logger = logging.getLogger(__name__)

#: Module attribute: ``{"kept": bool, "with_s": float, "without_s": float}`` as JSON.
FISSION_ATTR = "tvm_ext.fission"


def selection_objective(mod: tvm.IRModule) -> float:
    """Modelled seconds of the selected kernels of every function (``inf`` when a function's
    selection was skipped or not priced: such a graph never wins)."""
    if mod.attrs is None or SELECTION_ATTR not in mod.attrs:
        return float("inf")
    total = 0.0
    for entry in json.loads(str(mod.attrs[SELECTION_ATTR])).values():
        if entry.get("objective_s") is None:
            return float("inf")
        total += float(entry["objective_s"])
    return total


def _with_note(mod: tvm.IRModule, note: str) -> tvm.IRModule:
    report = json.loads(str(mod.attrs[SELECTION_ATTR]))
    for entry in report.values():
        entry.setdefault("notes", []).insert(0, note)
    return mod.with_attr(SELECTION_ATTR, json.dumps(report, sort_keys=True))


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.CheaperOfFission")
class CheaperOfFission:
    """Run ``with_fission`` and ``without_fission`` (graph-stage pass lists) on the module and
    keep the output whose selection is modelled cheaper (see the module docstring).

    Parameters
    ----------
    with_fission, without_fission : list of Pass
        The preset's graph stage with and without the fission pass in front.
    """

    def __init__(self, with_fission: list, without_fission: list):
        self.with_fission = list(with_fission)
        self.without_fission = list(without_fission)

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:  # noqa: D102 - pass protocol
        split = tvm.transform.Sequential(self.with_fission, name="tvm_ext.graph.with_fission")(mod)
        whole = tvm.transform.Sequential(self.without_fission, name="tvm_ext.graph.without_fission")(mod)
        with_s, without_s = selection_objective(split), selection_objective(whole)
        kept = with_s <= without_s
        note = (f"fission {'kept' if kept else 'undone'}: modelled {with_s * 1e6:.1f} us with it, "
                f"{without_s * 1e6:.1f} us without")
        logger.info(note)
        out = split if kept else whole
        if out.attrs is not None and SELECTION_ATTR in out.attrs:
            out = _with_note(out, note)
        return out.with_attr(FISSION_ATTR, json.dumps({"kept": kept, "with_s": with_s, "without_s": without_s}))


__all__ = ["CheaperOfFission", "FISSION_ATTR", "selection_objective"]
