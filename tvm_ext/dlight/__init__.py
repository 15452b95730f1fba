"""TVM's own kernels as a generator: singletons and compute groups scheduled by dlight.

* :mod:`.rules` — dlight's default rules applied per function without aborting on a rule that
  raises (:class:`SafeDefaultSchedule`, the schedule stage's last step for unplanned functions);
* :mod:`.generator` — :class:`DlightGenerator` (registered as ``"dlight"``): every node alone and
  every compute node with its epilogue, planned by the dlight rule that schedules it; and
  :class:`FuseOpsGroups` (``"fuseops"``): the groups TVM's ``FuseOps`` forms, as candidates.
"""
from __future__ import annotations

from .generator import DlightGenerator, DlightPlan, FuseOpsGroups
from .rules import RULE_ERRORS, RuleOutcome, SafeDefaultSchedule, apply_rules, default_rules, is_scheduled, mark_dlight

__all__ = ["DlightGenerator", "DlightPlan", "FuseOpsGroups", "RULE_ERRORS", "RuleOutcome", "SafeDefaultSchedule", "apply_rules",
           "default_rules", "is_scheduled", "mark_dlight"]
