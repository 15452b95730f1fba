"""Inputs a kernel is defined on: an out-of-bounds read that the function itself makes is the inputs' fault.

The emulation draws a kernel's inputs at random, each kernel alone: integers and booleans as 0/1.
A kernel whose index into a table is computed from *another* kernel's output can then read
outside the table though the model never does: BERT's embedding under ``orchestrate`` reads
``table[where(mask, ids + vocab, ids)]`` where ``mask = ids < 0`` is computed by a kernel of its
own, and a random ``mask`` of 1 sends ids 0/1 past the table's end. That is no fault of the
schedule. :func:`emulate_in_domain` tells the two apart: where the emulation reads outside some
parameters, the unscheduled function under TVM's own ``Fallback`` schedule is emulated on the same
inputs; if it reads outside the same parameters, the inputs are outside the function's domain and
the check runs again with every integer and boolean input zero (index 0 is inside any non-empty
table), and says so. A read outside that the function itself does not make stays a finding.

Example
-------
>>> verdict = emulate_in_domain(fused["embedding"], scheduled["embedding"], target, inputs=3)
>>> verdict.domain
'integer inputs zero: random ones make the function itself read outside param_2'
"""
from __future__ import annotations

import re

import numpy as np
import tvm
from tvm import tirx

from ..errors import TVM_ERRORS
from .kernel import EmulationVerdict, emulate_function
from .lowered import distinct_parameters

_OUTSIDE = re.compile(r"'(\w+)\[")


def _outside(verdict: EmulationVerdict, func: tirx.PrimFunc) -> set[int]:
    """Positions of ``func``'s parameters the emulation accessed outside of."""
    names = [p.name for p in distinct_parameters(func).params]
    found = set()
    for f in verdict.findings:
        match = _OUTSIDE.match(f.message) if f.kind == "out_of_bounds" else None
        if match and match.group(1) in names:
            found.add(names.index(match.group(1)))
    return found


def _has_integer_inputs(reference: tirx.PrimFunc, inputs: int | None) -> bool:
    count = len(reference.params) - 1 if inputs is None else inputs
    return any(np.dtype(str(p.ty.dtype)).kind in "iub" for p in list(reference.params)[:count])


def _fallback(reference: tirx.PrimFunc, target: tvm.target.Target) -> tirx.PrimFunc | None:
    """``reference`` under TVM's ``Fallback`` schedule (None where it does not apply)."""
    from tvm.s_tir import dlight as dl

    try:
        space = dl.gpu.Fallback().apply(reference, target, False)
    except (*TVM_ERRORS, AssertionError):
        return None
    if space is None:
        return None
    sch = space if isinstance(space, tvm.s_tir.Schedule) else space[0]
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def emulate_in_domain(reference: tirx.PrimFunc, scheduled: tirx.PrimFunc, target: tvm.target.Target,
                      **kwargs) -> EmulationVerdict:
    """:func:`~tvm_ext.checks.kernel.emulate_function`, on inputs the function is defined on
    (module docstring); ``kwargs`` are its keyword arguments (``seed``, ``inputs``, ...)."""
    verdict = emulate_function(reference, scheduled, target, **kwargs)
    outside = _outside(verdict, scheduled)
    if not outside or not _has_integer_inputs(reference, kwargs.get("inputs")):
        return verdict
    fallback = _fallback(reference, target)
    if fallback is None:
        return verdict
    own = _outside(emulate_function(reference, fallback, target, **kwargs), fallback)
    if not outside <= own:
        return verdict          # the schedule reads where the function does not: a finding
    again = emulate_function(reference, scheduled, target, zero_integers=True, **kwargs)
    names = ", ".join(distinct_parameters(scheduled).params[i].name for i in sorted(outside))
    again.domain = f"integer inputs zero: random ones make the function itself read outside {names}"
    return again


__all__ = ["emulate_in_domain"]
