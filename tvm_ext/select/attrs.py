"""The shared attributes: what every stage writes on the functions it produces, and reports read.

Function attributes (on the PrimFunc of a kernel, or the ``Codegen`` function of a library call):

``"tvm_ext.plan"`` (:data:`PLAN_ATTR`)
    JSON of the chosen candidate's plan (see :mod:`tvm_ext.select.plan`).
``"tvm_ext.generator"`` (:data:`GENERATOR_ATTR`)
    The generator that built the kernel: ``"stitch"``, ``"cutlass"``, ``"dlight"``, ...
``"tvm_ext.schedule_rule"`` (:data:`RULE_ATTR`)
    What scheduled it: the generator's verdict (``"stitched+grid_sync"``) or dlight's rule name
    (``"Matmul"``; ``"none"`` when no rule applies).
``"tvm_ext.fallback"`` (:data:`FALLBACK_ATTR`)
    Why the kernel is not what its plan or technique wanted (a refused plan scheduled by dlight,
    a dlight rule that raised): a one-line reason starting with the technique's name.

Module attribute:

``"tvm_ext.library_kernels"`` (:data:`LIBRARY_KERNELS_ATTR`)
    External symbol -> ``{"generator", "plan", "launches_per_call", ...}`` (with the kernel's
    flops, bytes, measurement key and description) for every library call (their functions are
    gone after code generation).
``"tvm_ext.selection"`` (:data:`SELECTION_ATTR`)
    Per Relax function: how many candidates each generator proposed, what was chosen and what was
    dropped, with reasons (JSON).
"""
from __future__ import annotations

PLAN_ATTR = "tvm_ext.plan"
GENERATOR_ATTR = "tvm_ext.generator"
RULE_ATTR = "tvm_ext.schedule_rule"
FALLBACK_ATTR = "tvm_ext.fallback"
LIBRARY_KERNELS_ATTR = "tvm_ext.library_kernels"
SELECTION_ATTR = "tvm_ext.selection"


def func_attr(func, key: str) -> str | None:
    """A string attribute of ``func``, or None."""
    if func.attrs is None or key not in func.attrs:
        return None
    return str(func.attrs[key])


def planned_by(mod, generator: str) -> dict[str, str]:
    """PrimFunc -> what became of each kernel ``generator`` planned in a scheduled module: its
    schedule rule (``"stitched+grid_sync"``), or ``"fallback: <reason>"`` when the plan was refused
    or did not lower and dlight scheduled the function instead."""
    import json

    from tvm import tirx

    out: dict[str, str] = {}
    for gv, func in mod.functions_items():
        text = func_attr(func, PLAN_ATTR) if isinstance(func, tirx.PrimFunc) else None
        if text is None or json.loads(text).get("generator") != generator:
            continue
        reason = func_attr(func, FALLBACK_ATTR)
        out[gv.name_hint] = f"fallback: {reason}" if reason is not None else (func_attr(func, RULE_ATTR) or "none")
    return out


__all__ = ["FALLBACK_ATTR", "GENERATOR_ATTR", "LIBRARY_KERNELS_ATTR", "PLAN_ATTR", "RULE_ATTR", "SELECTION_ATTR",
           "func_attr", "planned_by"]
