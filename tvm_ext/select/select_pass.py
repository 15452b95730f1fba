"""The selection pass: generators propose, the cost model prices, a selector picks, plans are emitted.

:class:`SelectKernels` runs on a legalized module (after ``AnnotateTIROpPattern`` and
``FoldConstant``; with :class:`~tvm_ext.select.origin.RecordOrigin` before legalization when a
library generator needs the Relax calls). For every Relax function with a dataflow block it
builds the OpGraph, asks each generator for candidates, lets the selector choose, and emits the
chosen candidates (:func:`~tvm_ext.select.emission.emit_selection`). What happened is recorded
in the module attribute :data:`~tvm_ext.select.attrs.SELECTION_ATTR` (JSON per function:
candidates proposed per generator, kernels chosen per generator, uncovered nodes, dropped
candidates with reasons, seconds and budget work units each generator took to propose, also
emitted as :class:`~tvm_ext.select.progress.ProgressEvent`).

Candidates whose key is in ``excluded`` (kernels that failed to schedule in an earlier build
round, see :func:`tvm_ext.driver.stages.build`) are not offered to the selector; they are listed
as dropped with the reason. Candidates whose key is in ``built`` are priced with what ptxas said
of their kernel in an earlier round: its spills (:func:`~tvm_ext.select.built_facts.with_spills`).

A function that cannot be viewed as an OpGraph (dynamic shapes, shape-valued variables) is left
as it is and the reason recorded; the preset's rest policy (``FuseOps``) then fuses it as TVM would.

Example
-------
>>> mod = SelectKernels(["stitch", "dlight"], PrioritySelector(), load_device("h100"), target)(legalized)
>>> json.loads(mod.attrs["tvm_ext.selection"])["main"]["chosen"]
{'stitch': 37, 'dlight': 101}
"""
from __future__ import annotations

import json
import logging
import time
from collections import Counter
from typing import Mapping, Sequence

import tvm
from tvm import relax

from ..graph import OpGraph
from ..hardware import DeviceSpec
from ..tir.script_import import import_tensor_intrinsics
from .attrs import SELECTION_ATTR
from .budget import PlanningBudget
from .built_facts import BuiltFacts, with_spills
from .context import SelectionContext
from .cost import CostModel
from .emission import emit_selection
from .emit import call_bindings
from .generator import Generator, get_generator
from .origin import origin_functions, without_origin
from .progress import ProgressEvent, emit
from .recompute import recomputing_candidates
from .selector import Selector
from .views import as_view

logger = logging.getLogger(__name__)


def _has_dataflow(func) -> bool:
    return isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr) and any(
        isinstance(b, relax.DataflowBlock) for b in func.body.blocks)


def _is_primitive(func) -> bool:
    return func.attrs is not None and "Primitive" in func.attrs and bool(func.attrs["Primitive"])


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.SelectKernels")
class SelectKernels:
    """Candidate generation, selection and emission (see the module docstring).

    Parameters
    ----------
    generators : sequence of str or Generator
        Registered generator names (or generator objects), in priority order.
    selector : Selector
        How to choose among the candidates.
    device : DeviceSpec
        Device the kernels are planned and priced for.
    target : tvm.target.Target, optional
        Compilation target (default: ``Target.current()`` when the pass runs).
    cost : CostModel, optional
        Prices candidates for the selector (a priority selector needs none).
    excluded : mapping, optional
        Kernel key -> why candidates with that key must not be chosen.
    built : mapping, optional
        Kernel key -> :class:`~tvm_ext.select.built_facts.BuiltFacts` of that kernel as an earlier
        round built it: candidates with that key are priced with its spills.
    recompute : bool
        Also offer the candidates that recompute cheap shared nodes
        (:func:`~tvm_ext.select.recompute.recomputing_candidates`); for a cost-based selector.
    budget : PlanningBudget, optional
        Each generator's planning budget per function (default: unlimited).
    shared : dict, optional
        Plans by structure, shared by every function and every run of this pass (a
        :class:`~tvm_ext.driver.graph_choice.CheaperOf` runs it twice) and, when the driver hands
        the same dict to each round's pass, by its re-selection rounds.
    """

    def __init__(self, generators: Sequence[str | Generator], selector: Selector, device: DeviceSpec,
                 target: tvm.target.Target | None = None, cost: CostModel | None = None,
                 excluded: Mapping[str, str] | None = None, recompute: bool = False,
                 budget: PlanningBudget | None = None, shared: dict | None = None,
                 built: Mapping[str, BuiltFacts] | None = None):
        self.generators = [get_generator(g) if isinstance(g, str) else g for g in generators]
        self.selector = selector
        self.device = device
        self.target = target
        self.cost = cost
        self.excluded = dict(excluded or {})
        self.built = dict(built or {})
        self.recompute = recompute
        self.budget = budget
        self.shared = {} if shared is None else shared

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:  # noqa: D102 - pass protocol
        target = self.target or tvm.target.Target.current(allow_none=False)
        if target.kind.name == "cuda":
            # once per process, 5-9 s: before any generator, so that no planning budget pays for it
            # (the tile graph prices single nodes with dlight, whose tensor-core rule needs them)
            import_tensor_intrinsics()
        origins = origin_functions(mod)
        mod = without_origin(mod)
        report: dict[str, dict] = {}
        names = [gv.name_hint for gv, f in mod.functions_items() if _has_dataflow(f) and not _is_primitive(f)]
        for name in names:
            start = time.perf_counter()
            try:
                graph = OpGraph.from_module(mod, name, origin=origins.get(name))
            except ValueError as err:
                logger.warning("kernel selection skipped for function '%s': %s", name, err)
                report[name] = {"skipped": str(err)}
                continue
            if len(call_bindings(mod[name])) != len(graph.nodes):
                logger.warning("kernel selection skipped for function '%s': its calls do not match the graph", name)
                report[name] = {"skipped": "calls do not match the OpGraph nodes"}
                continue
            sel_ctx = SelectionContext(mod, name, graph, self.device, target, origins.get(name),
                                       shared=self.shared, budget=self.budget)
            candidates: list = []
            proposers = [(g.name, g.candidates) for g in self.generators]
            if self.recompute:
                proposers.append(("recompute", lambda c: recomputing_candidates(c, c.proposed)))
            planning: dict[str, float] = {}
            work: dict[str, float] = {}
            for gen_name, propose in proposers:
                emit(ProgressEvent("graph", gen_name, name))
                begun = time.perf_counter()
                for cand in propose(sel_ctx):
                    if cand.key and cand.key in self.excluded:
                        sel_ctx.drop(cand.generator, cand.nodes, self.excluded[cand.key])
                    else:   # priced as built: a kernel the build makes a view costs nothing, one
                        # that ptxas made spill pays its spill traffic
                        if cand.key in self.built:
                            cand = with_spills(cand, self.built[cand.key])
                        candidates.append(as_view(sel_ctx, cand))
                sel_ctx.proposed = list(candidates)
                planning[gen_name] = round(time.perf_counter() - begun, 3)
                work[gen_name], share = sel_ctx.finish(gen_name)
                emit(ProgressEvent("graph", gen_name, name, share, planning[gen_name], work[gen_name]))
            selection = self.selector.select(sel_ctx, candidates, self.cost)
            mod = emit_selection(sel_ctx, selection.chosen)
            report[name] = {
                "proposed": dict(Counter(c.generator for c in candidates)),
                "chosen": dict(Counter(c.generator for c in selection.chosen)),
                "recomputing": sum(bool(c.recomputes) for c in selection.chosen),
                "uncovered": len(selection.uncovered),
                "dropped": [{"generator": g, "nodes": list(n), "reason": r} for g, n, r in sel_ctx.dropped],
                "objective_s": selection.objective_s,
                "notes": [*sel_ctx.notes, *selection.notes],
                "seconds": round(time.perf_counter() - start, 3),
                "generator_seconds": planning,
                "generator_work": work,
            }
        return mod.with_attr(SELECTION_ATTR, json.dumps(report, sort_keys=True))


__all__ = ["SelectKernels"]
