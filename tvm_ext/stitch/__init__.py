"""Operator stitching (AStitch, ASPLOS'22): memory-intensive subgraphs as one kernel.

* :mod:`.scope` — which OpGraph nodes form one kernel (BFS clusters, remote stitching);
* :mod:`.prologue` / :mod:`.prologue_schedule` — a softmax-like row reduction computed inside
  the GEMM that reads its rows (regional scheme into a GEMM consumer) and its schedule builder;
* :mod:`.emit` / :mod:`.relax_pass` — the Relax pass ``StitchMemoryIntensive`` and the
  preset's graph stage :func:`stitch_graph_passes`; :mod:`.split_slices` — ``SplitToSlices``,
  which turns a split read part by part into slices the GEMMs read through;
* :mod:`.ops`, :mod:`.dominance`, :mod:`.locality`, :mod:`.mapping`, :mod:`.launch`,
  :mod:`.planner` — the planner (dominants, groups, thread mapping, schemes, launch);
* :mod:`.schedule` / :mod:`.schedule_pass` — plan to TIR and the preset's schedule stage
  :func:`stitch_schedule_passes`;
* :mod:`.candidates` — stitch groups as candidate kernels for the selector;
* :mod:`.kernels` — kernel counts (memory-intensive vs compute) of a scheduled module;
* :mod:`tvm_ext.default_schedule` — dlight rules applied without aborting on a failing rule.
"""
from __future__ import annotations

from .candidates import StitchCandidate, plan_candidate, stitch_candidates
from ..default_schedule import SafeDefaultSchedule
from .dominance import Dominance, find_dominants
from .kernels import KernelCounts, count_kernels
from .launch import LaunchConfig, launch_config
from .mapping import ThreadMapping, flat_mapping, row_mapping
from .ops import StitchGraph, StitchOp
from .planner import PlanOptions, Stage, StitchPlan, StitchPlanError, plan_prim_func
from .prologue import prologue_target, row_operand_read
from .prologue_schedule import PrologueTiles, build_prologue_schedule, plan_prologue_tiles
from .relax_pass import GROUPS_ATTR, StitchMemoryIntensive, stitch_graph_passes, stitch_module
from .schedule import StitchScheduleError, build_schedule, promote_workspace
from .schedule_pass import REPORT_ATTR, ScheduleStitchedKernels, planning_device, schedule_stitched, stitch_schedule_passes
from .scope import STITCH_CLASSES, ScopeGroup, StitchScope, stitch_scope
from .split_slices import SplitToSlices, split_to_slices

__all__ = [
    "Dominance", "GROUPS_ATTR", "KernelCounts", "SafeDefaultSchedule", "StitchCandidate", "count_kernels",
    "plan_candidate", "stitch_candidates", "REPORT_ATTR", "ScheduleStitchedKernels", "planning_device", "schedule_stitched",
    "stitch_schedule_passes", "LaunchConfig", "PlanOptions", "STITCH_CLASSES", "ScopeGroup", "Stage",
    "StitchGraph", "StitchMemoryIntensive", "StitchOp", "StitchPlan", "StitchPlanError", "StitchScheduleError",
    "StitchScope", "ThreadMapping", "build_schedule", "find_dominants", "flat_mapping", "launch_config",
    "plan_prim_func", "promote_workspace", "row_mapping", "stitch_graph_passes", "stitch_module", "stitch_scope",
    "PrologueTiles", "build_prologue_schedule", "plan_prologue_tiles", "prologue_target", "row_operand_read",
    "SplitToSlices", "split_to_slices",
]
