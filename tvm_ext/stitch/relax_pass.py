"""``StitchMemoryIntensive``: the stitch technique as one Relax pass usable alone.

On a legalized module (after ``AnnotateTIROpPattern``) it runs the selection spine with the
stitch generator and dlight's kernels for everything else, first come first served
(:class:`~tvm_ext.select.select_pass.SelectKernels` with
:class:`~tvm_ext.select.selector.PrioritySelector`): one ``Primitive`` function per stitched
group, carrying its plan. ``FuseTIRKeepPlans`` and the schedule stage
(:class:`~tvm_ext.driver.apply_plans.ApplyPlans`) build the kernels. The ``stitch`` preset runs
the same thing inside its pipeline.

Example
-------
>>> seq = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
...                                 StitchMemoryIntensive(), FuseTIRKeepPlans()])
>>> with tvm.target.Target("tvm_ext/h100"):
...     fused = seq(mod)
"""
from __future__ import annotations

import tvm

from ..hardware import device_from_target, planning_target
from ..select.select_pass import SelectKernels
from ..select.selector import PrioritySelector
from .generator import StitchGenerator
from .planner import PlanOptions


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.StitchMemoryIntensive")
class StitchMemoryIntensive:
    """Stitch memory-intensive groups of a legalized module (see the module docstring).

    Parameters
    ----------
    target : Target, optional
        The GPU target to plan for (default: ``Target.current()``, else the default target).
    remote : bool
        Merge independent memory-intensive groups (remote stitching).
    gemm_prologues : bool
        Compute softmax-like groups inside the GEMM that reads them.
    max_group_nodes : int, optional
        Bound on the nodes of one stitch group.
    options : PlanOptions, optional
        Planner knobs.
    """

    def __init__(self, target: tvm.target.Target | None = None, *, remote: bool = True, gemm_prologues: bool = True,
                 max_group_nodes: int | None = None, options: PlanOptions | None = None):
        self.target = target
        self.generator = StitchGenerator(options, remote=remote, gemm_prologues=gemm_prologues,
                                         max_group_nodes=max_group_nodes)

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:  # noqa: D102 - pass protocol
        target = planning_target(self.target or tvm.target.Target.current(allow_none=True))
        select = SelectKernels([self.generator, "dlight"], PrioritySelector(), device_from_target(target), target)
        return select(mod)


__all__ = ["StitchMemoryIntensive"]
