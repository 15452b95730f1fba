"""TVM's default (dlight) GPU schedules, applied so that one failing rule does not abort the build.

``dl.ApplyDefaultSchedule`` stops the whole compilation when a rule raises; TVM 0.27's matmul
rule does so with an ``AssertionError`` ("consumers of the cache-write stage that are not
properly inlined") on some fused convolutions (EfficientNet-B0, under the baseline preset
too). :func:`apply_rules` applies the same rules in the same order to one function and, when a
rule raises, or builds a kernel that stores an output element from two threads
(:mod:`tvm_ext.checks.write_once`: the ``Matmul`` rule's padded reshape epilogues), tries the next
one (``Fallback`` always applies). :class:`SafeDefaultSchedule` does
so for every unscheduled PrimFunc of a module and writes the shared attributes
(:mod:`tvm_ext.select.attrs`): the generator ``"dlight"``, the rule that applied, and, when a
rule raised, the reason as a fallback. Functions marked ``tirx.is_scheduled`` are skipped, as
dlight does.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx

from ..checks.write_once import duplicate_writes
from ..errors import TVM_ERRORS
from ..ir_update import with_functions
from ..select.attrs import FALLBACK_ATTR, GENERATOR_ATTR, RULE_ATTR
from ..tir.script_import import import_tensor_intrinsics
from ..tir.thread_reductions import unguarded_write_backs

logger = logging.getLogger(__name__)

#: What a failing dlight rule raises: TVM's errors, and AssertionError because the rules are
#: Python code that asserts its preconditions.
RULE_ERRORS = TVM_ERRORS + (AssertionError,)


def default_rules() -> list:
    """The rules of TVM 0.27's CUDA default pipeline, in its order."""
    from tvm.s_tir import dlight as dl

    return [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()]


def is_scheduled(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` carries ``tirx.is_scheduled``."""
    return func.attrs is not None and "tirx.is_scheduled" in func.attrs and bool(func.attrs["tirx.is_scheduled"])


@dataclass(frozen=True)
class RuleOutcome:
    """What :func:`apply_rules` did to one function.

    Attributes
    ----------
    func : tirx.PrimFunc
        The scheduled function, or the input when no rule applies.
    rule : str
        Name of the rule that scheduled it, ``"none"`` if no rule applies.
    failures : tuple of str
        ``"<Rule>: <first line of the error>"`` for every rule that raised before.
    """

    func: tirx.PrimFunc
    rule: str
    failures: tuple[str, ...] = ()


def apply_rules(func: tirx.PrimFunc, target: tvm.target.Target, rules: list | None = None,
                only: str | None = None) -> RuleOutcome:
    """Schedule ``func`` with the first of ``rules`` that applies and does not raise.

    ``only`` names the single rule to try first (a plan's rule); if it does not apply, the
    others are tried in their order.
    """
    rules = list(rules) if rules is not None else default_rules()
    if target.kind.name == "cuda":      # dlight's tensor-core Matmul imports them; fast here
        import_tensor_intrinsics()
    if only is not None:
        rules = [r for r in rules if type(r).__name__ == only] + [r for r in rules if type(r).__name__ != only]
    failures: list[str] = []
    for rule in rules:
        try:
            space = rule.apply(func, target, False)
        except RULE_ERRORS as err:
            failures.append(f"{type(rule).__name__}: {str(err).splitlines()[0][:200] if str(err) else type(err).__name__}")
            continue
        if space is None:
            continue
        sch = space if isinstance(space, s_tir.Schedule) else space[0]
        scheduled = sch.mod["main"]
        twice = duplicate_writes(scheduled)
        if twice:   # e.g. Matmul's padded epilogue storing onto valid outputs (tvm_ext.checks.write_once)
            failures.append(f"{type(rule).__name__}: stores some elements of {', '.join(twice)} from two threads")
            continue
        unguarded = unguarded_write_backs(scheduled.body)
        if unguarded:   # TVM lowers their write-backs without the block predicate
            failures.append(f"{type(rule).__name__}: the cross-thread reduction of {', '.join(unguarded)} would "
                            "write back outside its block predicate")
            continue
        return RuleOutcome(scheduled.with_attr("tirx.is_scheduled", True), type(rule).__name__, tuple(failures))
    return RuleOutcome(func, "none", tuple(failures))


def mark_dlight(func: tirx.PrimFunc, outcome: RuleOutcome) -> tirx.PrimFunc:
    """``outcome.func`` with the shared attributes of a dlight kernel."""
    out = outcome.func.with_attr(GENERATOR_ATTR, "dlight").with_attr(RULE_ATTR, outcome.rule)
    if outcome.failures:
        out = out.with_attr(FALLBACK_ATTR, "dlight: rule raised (" + "; ".join(outcome.failures)
                            + f"); scheduled by {outcome.rule}")
    return out


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.SafeDefaultSchedule")
class SafeDefaultSchedule:
    """Apply dlight rules per unscheduled PrimFunc, skipping a rule that raises (module docstring).

    Parameters
    ----------
    rules : list, optional
        dlight schedule rules (default: :func:`default_rules`).
    """

    def __init__(self, rules: list | None = None):
        self.rules = list(rules) if rules is not None else default_rules()

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:  # noqa: D102 - pass protocol
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or is_scheduled(func):
                continue
            target = func.attrs.get("target") if func.attrs is not None else None
            target = target or tvm.target.Target.current(allow_none=False)
            outcome = apply_rules(func, target, self.rules)
            for failure in outcome.failures:
                logger.warning("dlight rule failed on '%s' (%s); trying the next rule", gv.name_hint, failure)
            updates[gv] = mark_dlight(func, outcome)
        return with_functions(mod, updates)


__all__ = ["RULE_ERRORS", "RuleOutcome", "SafeDefaultSchedule", "apply_rules", "default_rules", "is_scheduled",
           "mark_dlight"]
