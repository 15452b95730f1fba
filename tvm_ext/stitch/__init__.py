"""Operator stitching (AStitch, ASPLOS'22): memory-intensive subgraphs as one kernel.

* :mod:`.generator` — :class:`StitchGenerator` (registered as ``"stitch"``): the scope's groups
  as candidates, planned on their fused PrimFuncs, built from the plan in the schedule stage;
* :mod:`.scope` — which OpGraph nodes form one kernel (BFS clusters, remote stitching);
* :mod:`.prologue` / :mod:`.prologue_schedule` — a softmax-like row reduction computed inside
  the GEMM that reads its rows (regional scheme into a GEMM consumer) and its schedule builder;
* :mod:`.ops`, :mod:`.dominance`, :mod:`.locality`, :mod:`.mapping`, :mod:`.launch`,
  :mod:`.planner` — the planner (dominants, groups, thread mapping, schemes, launch);
* :mod:`.plans` — :class:`StitchKernelPlan`, the plan as JSON, and :func:`realize`;
* :mod:`.schedule` — plan to TIR (grid barriers, workspaces);
* :mod:`.relax_pass` — ``StitchMemoryIntensive``, the technique as one pass.

Before legalization the generator asks for :class:`~tvm_ext.frontend.SplitToSlices` (a split
read part by part becomes slices, which the GEMMs that read them read through).
"""
from __future__ import annotations

from .dominance import Dominance, find_dominants
from .generator import StitchGenerator, worth_own_schedule
from .launch import LaunchConfig, launch_config
from .mapping import ThreadMapping, flat_mapping, row_mapping
from .ops import StitchGraph, StitchOp
from .planner import PlanOptions, Stage, StitchPlan, StitchPlanError, plan_prim_func
from .plans import StitchKernelPlan, realize
from .prologue import prologue_target, row_operand_read
from .prologue_schedule import PrologueTiles, build_prologue_schedule, plan_prologue_tiles
from .relax_pass import StitchMemoryIntensive
from ..tir import promote_workspace
from .schedule import StitchScheduleError, build_schedule
from .scope import STITCH_CLASSES, ScopeGroup, StitchScope, is_stitchable, stitch_scope

__all__ = [
    "Dominance", "LaunchConfig", "PlanOptions", "PrologueTiles", "STITCH_CLASSES", "ScopeGroup",
    "Stage", "StitchGenerator", "StitchGraph", "StitchKernelPlan", "StitchMemoryIntensive", "StitchOp",
    "StitchPlan", "StitchPlanError", "StitchScheduleError", "StitchScope", "ThreadMapping", "build_prologue_schedule",
    "build_schedule", "find_dominants", "flat_mapping", "is_stitchable", "launch_config", "plan_prim_func",
    "plan_prologue_tiles", "prologue_target", "promote_workspace", "realize", "row_mapping", "row_operand_read",
    "stitch_scope", "worth_own_schedule",
]
