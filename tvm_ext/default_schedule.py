"""TVM's default (dlight) GPU schedules, applied so that one failing rule does not abort the build.

``dl.ApplyDefaultSchedule`` stops the whole compilation when a rule raises; TVM 0.27's matmul
rule does so with an ``AssertionError`` ("consumers of the cache-write stage that are not
properly inlined") on some fused convolutions (EfficientNet-B0, under the baseline preset
too). :class:`SafeDefaultSchedule` applies the same rules in the same order per function and,
when a rule raises, tries the next one (``Fallback`` always applies), logging which rule
failed. Functions marked ``tirx.is_scheduled`` are skipped, as dlight does.
"""
from __future__ import annotations

import logging

import tvm
from tvm import s_tir, tirx

from .errors import TVM_ERRORS
from .ir_update import with_functions

logger = logging.getLogger(__name__)

FAILURES_ATTR = "tvm_ext.dlight_failures"
#: Module attribute: PrimFunc name -> the dlight rule that scheduled it, ``"pre-scheduled"``
#: (already ``tirx.is_scheduled``) or ``"none"`` (no rule applies). The report reads it.
RULES_ATTR = "tvm_ext.dlight_rules"
#: What a failing dlight rule raises: TVM's errors, and AssertionError because the rules are
#: Python code that asserts its preconditions.
RULE_ERRORS = TVM_ERRORS + (AssertionError,)


def default_rules() -> list:
    """The rules of TVM 0.27's CUDA default pipeline, in its order."""
    from tvm.s_tir import dlight as dl

    return [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()]


def _is_scheduled(func) -> bool:
    return func.attrs is not None and "tirx.is_scheduled" in func.attrs and bool(func.attrs["tirx.is_scheduled"])


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.SafeDefaultSchedule")
class SafeDefaultSchedule:
    """Apply dlight rules per PrimFunc, skipping a rule that raises (see the module docstring).

    Parameters
    ----------
    rules : list, optional
        dlight schedule rules (default: :func:`default_rules`).
    """

    def __init__(self, rules: list | None = None):
        self.rules = list(rules) if rules is not None else default_rules()

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:  # noqa: D102 - pass protocol
        failures: dict[str, str] = {}
        applied: dict[str, str] = {}
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc):
                continue
            if _is_scheduled(func):
                applied[gv.name_hint] = "pre-scheduled"
                continue
            applied[gv.name_hint] = "none"
            target = func.attrs.get("target") if func.attrs is not None else None
            target = target or tvm.target.Target.current(allow_none=False)
            for rule in self.rules:
                try:
                    space = rule.apply(func, target, False)
                except RULE_ERRORS as err:
                    failures[gv.name_hint] = f"{type(rule).__name__}: {str(err).splitlines()[0][:200]}"
                    logger.warning("dlight rule %s failed on '%s' (%s); trying the next rule",
                                   type(rule).__name__, gv.name_hint, failures[gv.name_hint])
                    continue
                if space is None:
                    continue
                sch = space if isinstance(space, s_tir.Schedule) else space[0]
                updates[gv] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
                applied[gv.name_hint] = type(rule).__name__
                break
        mod = with_functions(mod, updates).with_attr(RULES_ATTR, applied)
        if failures:
            mod = mod.with_attr(FAILURES_ATTR, failures)
        return mod


__all__ = ["FAILURES_ATTR", "RULE_ERRORS", "RULES_ATTR", "SafeDefaultSchedule", "default_rules"]
