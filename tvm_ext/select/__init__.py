"""The selection spine shared by every technique.

* :mod:`.candidate` — :class:`Candidate` (node set, plan, boundary, flops, traffic, launch shape);
* :mod:`.plan` / :mod:`.attrs` — plans as JSON attributes that travel with their kernels;
* :mod:`.generator` — the :class:`Generator` protocol and its registry;
* :mod:`.context` — what generators see (:class:`SelectionContext`, fused functions by signature);
* :mod:`.groups` — the compute-group policy (a GEMM/conv with its epilogue);
* :mod:`.cost` — the :class:`CostModel` interface;
* :mod:`.selector` — :class:`Selection`, :class:`PrioritySelector`;
* :mod:`.emit` / :mod:`.emission` — node groups as ``Primitive`` functions, a selection emitted;
* :mod:`.origin`, :mod:`.select_pass`, :mod:`.fuse` — the graph-stage passes
  (:class:`RecordOrigin`, :class:`SelectKernels`, :class:`FuseTIRKeepPlans`);
* :mod:`.launch` — launch shape of a scheduled PrimFunc.
"""
from __future__ import annotations

from .attrs import (FALLBACK_ATTR, GENERATOR_ATTR, LIBRARY_KERNELS_ATTR, PLAN_ATTR, RULE_ATTR, SELECTION_ATTR,
                    func_attr, planned_by)
from .candidate import Candidate, CodePath, LaunchShape, boundary_bytes, dominant_dtype
from .context import SelectionContext, fuse_nodes, subgraph_module
from .cost import COST_SOURCES, CostEstimate, CostModel
from .emission import emit_selection
from .emit import EmitError, call_bindings, emit_groups
from .fuse import FuseTIRKeepPlans
from .generator import (Generator, GeneratorError, LibraryGenerator, ScheduledKernel, ScheduleRefused,
                        TirGenerator, get_generator, list_generators, register_generator, unregister_generator)
from .groups import compute_groups
from .launch import launch_regions, launch_shape
from .origin import ORIGIN_ATTR, RecordOrigin, origin_functions
from .plan import Plan, PlanError, generator_of, plan_from_text, plan_of, plan_to_text, with_plan
from .select_pass import SelectKernels
from .selector import PrioritySelector, Selection, Selector

__all__ = [
    "COST_SOURCES", "Candidate", "CodePath", "CostEstimate", "CostModel", "EmitError", "FALLBACK_ATTR",
    "FuseTIRKeepPlans", "GENERATOR_ATTR", "Generator", "GeneratorError", "LIBRARY_KERNELS_ATTR", "LaunchShape",
    "LibraryGenerator", "ORIGIN_ATTR", "PLAN_ATTR", "Plan", "PlanError", "PrioritySelector", "RULE_ATTR",
    "RecordOrigin", "SELECTION_ATTR", "ScheduleRefused", "ScheduledKernel", "SelectKernels", "Selection",
    "SelectionContext", "Selector", "TirGenerator", "boundary_bytes", "call_bindings", "compute_groups",
    "dominant_dtype", "emit_groups", "emit_selection", "func_attr", "fuse_nodes", "generator_of", "get_generator",
    "launch_regions", "launch_shape", "list_generators", "origin_functions", "plan_from_text", "plan_of", "planned_by",
    "plan_to_text", "register_generator", "subgraph_module", "unregister_generator", "with_plan",
]
