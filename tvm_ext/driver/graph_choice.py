"""Graph rewrites the selector cannot weigh: the graph stage with and without one, the cheaper kept.

Some rewrites change the graph the candidates are drawn from, so the selector cannot choose
between the two graphs. Korch's fission (:mod:`tvm_ext.fission`) widens the candidate space but
also replaces an operator TVM schedules well as one kernel (a softmax, a layer norm) by
primitives, and on some models no cover of the primitives is as cheap as the operator was
(BERT-base at sequence 384: the fp16 layer norm's float32 statistics become casts that land in
GEMM epilogues). SOUFFLE's horizontal transform (:mod:`tvm_ext.subprogram.horizontal`) saves
launches but a wider GEMM may be priced slower than the branches it replaces. :class:`CheaperOf`
runs the preset's graph stage on both graphs and keeps the one whose selection the cost model
prices lower (the sum of the selection objectives over the module's functions). Which one was
kept, and both totals, go into the selection report's notes and a module attribute
(:data:`FISSION_ATTR`, :data:`HORIZONTAL_CHOICE_ATTR`). A rewrite that changes no function
costs nothing: the graph stage then runs once.

Example
-------
>>> stage = CheaperOf("fission", FISSION_ATTR, Fission(), graph_stage_passes, keep_on_tie=True)
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

#: Module attribute of the fission choice: ``{"kept": bool, "with_s": float, "without_s": float}`` as JSON.
FISSION_ATTR = "tvm_ext.fission"
#: Module attribute of the horizontal-transform choice, same form.
HORIZONTAL_CHOICE_ATTR = "tvm_ext.horizontal"


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


def _changed(before: tvm.IRModule, after: tvm.IRModule) -> bool:
    """Whether ``after`` has a function that is not the very object ``before`` has."""
    old = dict(before.functions_items())
    return any(gv not in old or not func.same_as(old[gv]) for gv, func in after.functions_items())


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.CheaperOf")
class CheaperOf:
    """Run ``passes`` on the module with and without ``rewrite`` in front and keep the output whose
    selection is modelled cheaper (see the module docstring).

    Parameters
    ----------
    label : str
        What the rewrite is called in notes and logs (``"fission"``).
    attr : str
        Module attribute receiving ``{"kept", "with_s", "without_s"}`` as JSON.
    rewrite : Pass
        The graph rewrite (runs on the imported module).
    passes : list of Pass
        The preset's graph stage.
    keep_on_tie : bool
        Keep the rewrite when both graphs are priced the same (fission: yes, the wider candidate
        space is the point; a rewrite kept only where it pays: no).
    """

    def __init__(self, label: str, attr: str, rewrite: tvm.transform.Pass, passes: list, keep_on_tie: bool = False):
        self.label, self.attr, self.rewrite = label, attr, rewrite
        self.passes = list(passes)
        self.keep_on_tie = keep_on_tie

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:  # noqa: D102 - pass protocol
        rewritten = self.rewrite(mod)
        stage = tvm.transform.Sequential(self.passes, name=f"tvm_ext.graph.{self.label}")
        if not _changed(mod, rewritten):
            logger.info("%s changes nothing: graph stage run once", self.label)
            out = stage(mod)
            return out.with_attr(self.attr, json.dumps({"kept": False, "with_s": None, "without_s": None}))
        split, whole = stage(rewritten), stage(mod)
        with_s, without_s = selection_objective(split), selection_objective(whole)
        kept = with_s < without_s or (self.keep_on_tie and with_s == without_s)
        note = (f"{self.label} {'kept' if kept else 'undone'}: modelled {with_s * 1e6:.1f} us with it, "
                f"{without_s * 1e6:.1f} us without")
        logger.info(note)
        out = split if kept else whole
        if out.attrs is not None and SELECTION_ATTR in out.attrs:
            out = _with_note(out, note)
        return out.with_attr(self.attr, json.dumps({"kept": kept, "with_s": with_s, "without_s": without_s}))


__all__ = ["CheaperOf", "FISSION_ATTR", "HORIZONTAL_CHOICE_ATTR", "selection_objective"]
