"""Kernels as built, described for the cost model: what the report prices for every launch.

A selection prices *candidates* before they are built; the report prices the kernels that were
built, whichever preset built them (TVM's own pipeline included), so that presets compare on
the same footing. :func:`describe_scheduled` reads a scheduled PrimFunc: its flops (from its
unscheduled form), its global traffic (every parameter once, an input it only gathers from as
much as it gathers; a workspace the schedule added is written and read back), its launch shape
(:func:`~tvm_ext.select.launch.launch_shape`) and its code path (tensor-core fragments in a
TVM schedule mean ``wmma``); a kernel that executes more work than its function plans
(:func:`~tvm_ext.analysis.work.executed_work` over :func:`~tvm_ext.analysis.work.function_work`:
recomputation, a guard that lets every thread redo one thread's work) is priced from what it
executes, its flops and global traffic scaled by the executed/planned arithmetic (transcendentals
weighted, :attr:`~tvm_ext.analysis.work.Work.arithmetic`) and global loads; one that ptxas says
spills (:data:`~tvm_ext.select.built_facts.BUILT_FACTS_ATTR`, attached by the driver) with its
spill traffic (:func:`~tvm_ext.select.built_facts.with_spills`); a multi-stage kernel
whose plan carries its stages' work (``plan.work``) is priced stage by stage with them, as the selection priced it. :func:`describe_library` reads a library
kernel's record (:data:`~tvm_ext.select.attrs.LIBRARY_KERNELS_ATTR`).

Example
-------
>>> kernel = describe_scheduled(graph_mod["fused_matmul_add"], scheduled["fused_matmul_add"])
>>> AnalyticCostModel().cost(kernel, load_device("h100")).seconds
4.1e-06
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tvm import tirx

from ..analysis import element_bytes
from ..analysis.work import Work, executed_work, function_work
from ..graph import block_float_work, gathered_reads, weighted_dtype
from .built_facts import built_facts, with_spills
from .candidate import CodePath, LaunchShape
from .launch import launch_shape, uses_tensor_cores

#: Executed work within this factor of the planned is priced as planned (*assumed*: the counts
#: differ by a few percent in convention, e.g. a padded tile's softmax over its padded rows,
#: which the plan's padding flops leave out; recomputation is a multiple).
EXECUTED_MARGIN = 1.1


@dataclass(frozen=True)
class KernelDescription:
    """What the cost model reads of one built kernel (the fields of a candidate); ``key``, ``plan``
    and ``record_dtype`` find its measurements."""

    flops: int
    global_bytes: int
    unique_bytes: int
    launch: LaunchShape
    code_path: CodePath
    dtype: str
    key: str = ""
    plan: Any = None
    record_dtype: str = ""
    dram_bytes: int = 0
    #: The stages of a multi-stage kernel, from its plan (``plan.work``), priced one after another.
    stages: tuple = ()
    #: Executed / planned arithmetic and global loads of the built kernel (>= 1: the factors its flops
    #: and traffic were scaled by; 1.0 where it executes no more than planned).
    executed_flops_ratio: float = 1.0
    executed_loads_ratio: float = 1.0
    #: Bytes one call moves to and from local memory because its kernel spills (ptxas's report,
    #: :mod:`~tvm_ext.select.built_facts`; included in ``global_bytes``); 0 where it does not or
    #: was not compiled.
    spill_bytes: int = 0

    @property
    def recomputes(self) -> bool:
        """Whether it was priced above its plan for executing more than it plans."""
        return max(self.executed_flops_ratio, self.executed_loads_ratio) > 1.0

    @property
    def database_dtype(self) -> str:
        """The dtype part of its measurement key."""
        return self.record_dtype or self.dtype

    @property
    def generator(self) -> str:
        """The generator that planned it ('' without a plan)."""
        return getattr(self.plan, "generator", "")


def _param_bytes(param) -> tuple[int, str]:
    ty = getattr(param, "ty", None)
    if ty is None or not hasattr(ty, "shape"):
        return 0, ""
    dims = [int(d.value) if isinstance(d, tirx.IntImm) else 1 for d in ty.shape]
    return math.prod(dims) * element_bytes(str(ty.dtype)), str(ty.dtype)


def executed_ratios(graph_func: tirx.PrimFunc, scheduled: tirx.PrimFunc,
                    planned_extra_flops: float = 0.0, executed: Work | None = None) -> tuple[float, float]:
    """Executed over planned arithmetic and global loads of ``scheduled``; 1.0 for each within
    :data:`EXECUTED_MARGIN` of its plan (``planned_extra_flops``: what the plan adds, its padding;
    ``executed``: :func:`~tvm_ext.analysis.work.executed_work` of ``scheduled`` when already counted).

    A count the scheduled kernel hides (tensor-core intrinsics, copies into shared memory that
    replace the function's per-iteration loads) comes out below its plan and is left at 1.0.
    """
    planned = function_work(graph_func)
    executed = executed if executed is not None else executed_work(scheduled)

    def ratio(done: float, plan: float) -> float:
        return done / plan if plan > 0 and done > EXECUTED_MARGIN * plan else 1.0

    return (ratio(executed.arithmetic, planned.arithmetic + planned_extra_flops),
            ratio(executed.global_loads, planned.global_loads))


#: How a candidate's provenance starts saying it is priced from its kernel's executed work.
PRICED_AS_BUILT = "; priced as built"


def as_built_note(flops_ratio: float, loads_ratio: float) -> str:
    """The provenance suffix of a candidate priced from what its kernel executes ('' when it
    executes no more than it plans): the ratios of :func:`executed_ratios`."""
    if max(flops_ratio, loads_ratio) <= 1.0:
        return ""
    return f"{PRICED_AS_BUILT}: {flops_ratio:.2f}x the function's arithmetic, {loads_ratio:.2f}x its global loads"


def scaled_stages(stages, flops_ratio: float, loads_ratio: float) -> tuple:
    """A multi-stage kernel's stage work with its executed excess spread over the stages (the
    ratios of :func:`executed_ratios`, not counted stage by stage)."""
    return tuple(dataclasses.replace(s, flops=int(s.flops * flops_ratio), global_bytes=int(s.global_bytes * loads_ratio))
                 for s in stages)


def describe_scheduled(graph_func: tirx.PrimFunc, scheduled: tirx.PrimFunc,
                       code_path: CodePath | None = None) -> KernelDescription:
    """Describe a built kernel from its unscheduled (graph-stage) and scheduled PrimFunc; a kernel
    that carries a plan gets its measurement key (:func:`~tvm_ext.select.context.kernel_key`).

    ``code_path`` overrides the detection (a generator that knows its kernels' path).
    """
    from .context import kernel_key
    from .plan import PlanError, plan_of

    sizes = [_param_bytes(p) for p in scheduled.params]
    for k, elements in gathered_reads(graph_func).items():   # an input it only gathers from
        nbytes, dtype = sizes[k]
        sizes[k] = (min(nbytes, elements * element_bytes(dtype)), dtype)
    regular = len(graph_func.params)
    moved = sum(b for b, _ in sizes[:regular]) + 2 * sum(b for b, _ in sizes[regular:])
    unique = sum(b for b, _ in sizes)
    work = block_float_work(graph_func)
    dtype = weighted_dtype(work)        # as the selection weighs its nodes
    try:
        plan = plan_of(graph_func)
    except PlanError:
        plan = None
    planned_path = getattr(plan, "code_path", None)     # a plan that knows how its arithmetic runs says so
    path = code_path or (CodePath(planned_path) if planned_path else
                         CodePath.WMMA if uses_tensor_cores(scheduled) else CodePath.SIMT)
    key = kernel_key(graph_func, plan) if plan is not None else ""
    # a plan that modelled its own traffic (a tile kernel re-reads operand tiles per block) is
    # priced with it, as the selection priced it
    moved = max(int(getattr(plan, "traffic_bytes", 0) or 0), moved) if plan is not None else moved
    # and one that computes padding (a tile kernel's GEMMs padded to whole fragments) its flops
    padding = int(getattr(plan, "padding_flops", 0) or 0)
    flops = sum(f for _, f in work) + padding         # func_flops, from the same walk
    flops_ratio, loads_ratio = executed_ratios(graph_func, scheduled, padding)
    stages = scaled_stages(getattr(plan, "work", ()), flops_ratio, loads_ratio)
    kernel = KernelDescription(int(flops * flops_ratio), int(moved * loads_ratio), int(unique),
                               launch_shape(scheduled), path, dtype, key=key, plan=plan, stages=stages,
                               executed_flops_ratio=flops_ratio, executed_loads_ratio=loads_ratio)
    facts = built_facts(scheduled)
    return with_spills(kernel, facts) if facts is not None else kernel


def describe_library(record: Mapping[str, Any]) -> KernelDescription | None:
    """Describe a library kernel from its record (None for records without a description)."""
    from .plan import PlanError, plan_from_text

    if "kernel" not in record:
        return None
    data = record["kernel"]
    if isinstance(data, str):
        import json

        data = json.loads(data)
    try:
        plan = plan_from_text(str(record["plan"])) if "plan" in record else None
    except PlanError:
        plan = None
    return dataclasses.replace(description_from_json(data), key=str(record.get("key", "")), plan=plan,
                               record_dtype=str(record.get("record_dtype", "")))


def description_from_json(data: Mapping[str, Any]) -> KernelDescription:
    """The kernel a :func:`~tvm_ext.select.measured.kernel_description` JSON describes."""
    launch = LaunchShape.from_json(data["launch"])
    return KernelDescription(int(data["flops"]), int(data["global_bytes"]),
                             int(data.get("unique_bytes", data["global_bytes"])), launch,
                             CodePath(str(data["code_path"])), str(data["dtype"]),
                             dram_bytes=int(data.get("dram_bytes", 0)))


__all__ = ["PRICED_AS_BUILT", "KernelDescription", "as_built_note", "describe_library", "describe_scheduled",
           "description_from_json", "executed_ratios", "scaled_stages"]
