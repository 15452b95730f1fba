"""Clip's bounds as Relax operators: the importer's ``call_tir`` maximum/minimum lifted.

The ONNX importer converts ``Clip`` (ReLU6 in MobileNet-V2) to ``topi.maximum`` and
``topi.minimum`` through ``emit_te``. :func:`lift_min_max` (a :mod:`~tvm_ext.frontend.te_calls`
lifter) turns each into ``R.maximum`` / ``R.minimum`` of the same operands: elementwise
operators with a layout rule, an fp16 form and a place in fusion. ``R.clip`` is not used: it
has no layout rule in TVM 0.27, so a layout conversion would put transposes around it.
"""
from __future__ import annotations

import tvm
from tvm import relax, tirx

from .te_calls import SingleStore, int_shape

_OPS = {tirx.Max: relax.op.maximum, tirx.Min: relax.op.minimum}


def _operand(compute: SingleStore, expr, args: list) -> relax.Expr | None:
    """The Relax operand an operand of the stored value reads: an input at the output position,
    a 0-d input, or a constant."""
    if compute.is_elementwise_load(expr):
        index = compute.input_index(expr)
        if int_shape(compute.inputs[index]) == int_shape(compute.output):
            return args[index]
        return None
    if isinstance(expr, tvm.ir.TensorLoad) and not expr.indices and compute.input_index(expr) is not None:
        return args[compute.input_index(expr)]
    if isinstance(expr, (tirx.FloatImm, tirx.IntImm)):
        return relax.const(expr.value, str(expr.ty))
    return None


def lift_min_max(compute: SingleStore, args: list) -> relax.Expr | None:
    """``R.maximum(x, b)`` / ``R.minimum(x, b)`` for an elementwise max/min whose first operand
    is an input read at the output position; None for any other computation."""
    op = _OPS.get(type(compute.value))
    if op is None or not compute.is_elementwise_load(compute.value.a):
        return None
    lhs, rhs = _operand(compute, compute.value.a, args), _operand(compute, compute.value.b, args)
    if lhs is None or rhs is None:
        return None
    return op(lhs, rhs)


__all__ = ["lift_min_max"]
