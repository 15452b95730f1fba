"""Kernel plans: what a generator decided for one kernel, as data that travels with the kernel.

A plan is chosen once, when its candidate is selected, and attached to the function that
becomes the kernel: the ``Primitive`` Relax function of a fused group (moved to its PrimFunc by
:class:`~tvm_ext.select.fuse.FuseTIRKeepPlans`), the PrimFunc of a node left alone, or the
``Codegen`` function of a library call. The schedule stage and library code generators build
exactly the plan they find there; nothing downstream plans again.

Attributes (strings, so they survive every TVM pass that copies functions):

* ``"tvm_ext.plan"`` — JSON object ``{"generator": <name>, ...the plan's fields...}``;
* ``"tvm_ext.generator"`` — the generator's name (``"stitch"``, ``"cutlass"``, ``"dlight"``).

Example
-------
>>> func = with_plan(func, plan)
>>> plan_of(func).summary()
'stitch: 2 stages, grid 264 x 1024 threads, grid barrier'
"""
from __future__ import annotations

import json
from typing import Any, ClassVar, Protocol, runtime_checkable

import tvm

from ..errors import TvmExtError
from .attrs import GENERATOR_ATTR, PLAN_ATTR, func_attr


class PlanError(TvmExtError):
    """A plan attribute is malformed or names a generator that is not registered."""


@runtime_checkable
class Plan(Protocol):
    """What every generator's plan type provides."""

    #: Name of the generator that made (and builds) the plan.
    generator: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        """The plan's fields as a JSON-serialisable dict (inverse: the generator's ``plan_from_json``)."""

    def summary(self) -> str:
        """One line for reports."""


def plan_to_text(plan: Plan) -> str:
    """The attribute value of ``plan``: ``{"generator": ..., **plan.to_json()}`` as JSON."""
    return json.dumps({"generator": plan.generator, **plan.to_json()}, sort_keys=True)


def plan_from_text(text: str) -> Plan:
    """Parse an attribute value back into the generator's plan type.

    Raises
    ------
    PlanError
        Not JSON, no ``generator`` field, or an unregistered generator.
    """
    from .generator import get_generator

    try:
        data = json.loads(str(text))
        name = data.pop("generator")
    except (ValueError, KeyError, AttributeError, TypeError) as err:
        raise PlanError(f"malformed plan attribute {str(text)[:200]!r}: {err}") from None
    return get_generator(name).plan_from_json(data)


def with_plan(func: tvm.ir.BaseFunc, plan: Plan) -> tvm.ir.BaseFunc:
    """``func`` carrying ``plan`` (both attributes)."""
    return func.with_attr(PLAN_ATTR, plan_to_text(plan)).with_attr(GENERATOR_ATTR, plan.generator)


def plan_text(func: tvm.ir.BaseFunc) -> str | None:
    """The raw plan attribute of ``func``, or None."""
    return func_attr(func, PLAN_ATTR)


def plan_of(func: tvm.ir.BaseFunc) -> Plan | None:
    """The plan attached to ``func``, or None if it has none."""
    text = plan_text(func)
    return None if text is None else plan_from_text(text)


def generator_of(func: tvm.ir.BaseFunc) -> str | None:
    """The generator named on ``func``, or None."""
    return func_attr(func, GENERATOR_ATTR)


__all__ = ["GENERATOR_ATTR", "PLAN_ATTR", "Plan", "PlanError", "generator_of", "plan_from_text", "plan_of",
           "plan_text", "plan_to_text", "with_plan"]
