"""ptxas's facts of a build's scheduled kernels: attached to them, and the spills that re-price a selection.

After the schedule stage, :func:`attach_built_facts` compiles every scheduled PrimFunc once
(:func:`~tvm_ext.toolchain.compiled_usage`: one TIR build with the preset's pipeline, one
``nvcc -Xptxas -v`` run; 2-4 s for a seed model on 2 cores), attaches each PrimFunc's
:class:`~tvm_ext.select.built_facts.BuiltFacts` (its registers and spills) as
:data:`~tvm_ext.select.built_facts.BUILT_FACTS_ATTR`, so the report prices the kernel with its
spills, and returns the kernel keys of the planned kernels that spill, which
:func:`~tvm_ext.driver.stages.build` prices in one more selection round.

Without a CUDA toolkit, or where TVM cannot build the kernels, nothing is attached and the
build says why (:attr:`PtxasFacts.note`): the kernels are then priced as planned.

Example
-------
>>> scheduled, facts = attach_built_facts(graph, scheduled, target, "tvm_ext")
>>> facts.spilled
{'stitch:4f1c...': BuiltFacts(registers=255, spill_stores=18432, spill_loads=18560)}
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import tvm
from tvm import tirx

from ..dlight.rules import is_scheduled
from ..errors import TVM_ERRORS, KernelCompileError
from ..select.built_facts import BUILT_FACTS_ATTR, BuiltFacts
from ..select.context import kernel_key
from ..select.plan import PlanError, plan_of
from ..toolchain import KernelUsage, compiled_usage, function_kernels

logger = logging.getLogger(__name__)


@dataclass
class PtxasFacts:
    """What one ptxas run said of a build's kernels.

    Attributes
    ----------
    usage : dict or None
        ptxas's report by device kernel name; None where it could not run.
    spilled : dict
        Kernel key -> facts, for each planned kernel that spills.
    note : str
        Why there is no report ('' when there is one).
    """

    usage: dict[str, KernelUsage] | None = None
    spilled: dict[str, BuiltFacts] = field(default_factory=dict)
    note: str = ""

    def summary(self) -> str:
        """One line for the build's log and report."""
        if self.usage is None:
            return f"ptxas report unavailable, spills not priced: {self.note}"
        spilling = sorted((name, u) for name, u in self.usage.items() if u.spill_stores or u.spill_loads)
        named = "; ".join(f"{name}: {u.spill_stores} B stored, {u.spill_loads} B loaded per thread, priced"
                          for name, u in spilling[:3]) + ("; ..." if len(spilling) > 3 else "")
        return f"ptxas: {len(self.usage)} kernels compiled, {len(spilling)} spill" + (f" ({named})" if named else "")


def attach_built_facts(graph: tvm.IRModule, scheduled: tvm.IRModule, target: tvm.target.Target,
                       pipeline: str) -> tuple[tvm.IRModule, PtxasFacts]:
    """``scheduled`` with every compiled PrimFunc's facts attached, and what ptxas said
    (``graph``: the graph-stage module whose plans give the spilling kernels' keys)."""
    names = [gv.name_hint for gv, f in scheduled.functions_items() if isinstance(f, tirx.PrimFunc) and is_scheduled(f)]
    if not names:
        return scheduled, PtxasFacts(usage={})
    result = ptxas_report(scheduled, names, target, pipeline)
    if result.usage is None:
        return scheduled, result
    usage = result.usage
    functions = dict(scheduled.functions_items())
    for gv, func in list(functions.items()):
        kernels = function_kernels(usage, gv.name_hint) if gv.name_hint in names else []
        if not kernels:
            continue
        facts = BuiltFacts.of_kernels(kernels)
        functions[gv] = func.with_attr(BUILT_FACTS_ATTR, facts.to_json())
        if facts.spills and gv.name_hint in graph:
            try:
                plan = plan_of(graph[gv.name_hint])
            except PlanError:
                plan = None
            if plan is not None:
                result.spilled[kernel_key(graph[gv.name_hint], plan)] = facts
    infos = dict(scheduled.global_infos) if scheduled.global_infos is not None else None
    return tvm.IRModule(functions, attrs=scheduled.attrs, global_infos=infos), result


def ptxas_report(mod: tvm.IRModule, names: list[str], target: tvm.target.Target, pipeline: str) -> PtxasFacts:
    """What ptxas says of the PrimFuncs ``names`` of ``mod`` (:func:`~tvm_ext.toolchain.compiled_usage`),
    or why it says nothing (no toolkit, a TVM error)."""
    try:
        return PtxasFacts(usage=compiled_usage(mod, names, target, pipeline))
    except KernelCompileError as err:
        return _unavailable(str(err))
    except TVM_ERRORS as err:
        return _unavailable((str(err).strip().splitlines() or [type(err).__name__])[-1][:200])


def _unavailable(why: str) -> PtxasFacts:
    logger.warning("ptxas report unavailable, spills not priced: %s", why)
    return PtxasFacts(note=why)


__all__ = ["PtxasFacts", "attach_built_facts", "ptxas_report"]
