"""Fission of softmax and log_softmax into reduce / elementwise primitives (Korch Fig. 3).

Both subtract the row maximum first (as TVM's kernels do), so large logits do not overflow.
They compute in the input dtype, like TVM's legalization. Symbolic shapes are fine: no
constant depends on the shape.
"""
from __future__ import annotations

import tvm
from tvm import relax

from .registry import register_fission_rule
from .rules import fission_module, normalize_axes, tensor_type


def emit_shifted_exp(bb: relax.BlockBuilder, x: relax.Expr, axis: int) -> tuple[relax.Expr, relax.Expr]:
    """Emit ``d = x - max(x, axis, keepdims)`` and ``e = exp(d)``; returns ``(d, e)``."""
    row_max = bb.emit(relax.op.max(x, [axis], keepdims=True))
    shifted = bb.emit(relax.op.subtract(x, row_max))
    return shifted, bb.emit(relax.op.exp(shifted))


def emit_softmax(bb: relax.BlockBuilder, x: relax.Expr, axis: int) -> relax.Expr:
    """``exp(x - max) / sum(exp(x - max))`` over ``axis`` (non-negative); the divide is not emitted."""
    _, exps = emit_shifted_exp(bb, x, axis)
    total = bb.emit(relax.op.sum(exps, [axis], keepdims=True))
    return relax.op.divide(exps, total)


def fission_softmax(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Rewrite function of ``relax.nn.softmax`` (see :class:`FissionSoftmax`)."""
    x = call.args[0]
    (axis,) = normalize_axes([call.attrs.axis], tensor_type(x).ndim)
    return emit_softmax(bb, x, axis)


def fission_log_softmax(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Rewrite function of ``relax.nn.log_softmax`` (see :class:`FissionLogSoftmax`)."""
    x = call.args[0]
    (axis,) = normalize_axes([call.attrs.axis], tensor_type(x).ndim)
    shifted, exps = emit_shifted_exp(bb, x, axis)
    total = bb.emit(relax.op.sum(exps, [axis], keepdims=True))
    log_total = bb.emit(relax.op.log(total))
    return relax.op.subtract(shifted, log_total)


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.FissionSoftmax")
class FissionSoftmax:
    """Module pass: ``softmax(x, axis)`` becomes max, subtract, exp, sum, divide.

    ``m = max(x, axis, keepdims=True); e = exp(x - m); y = e / sum(e, axis, keepdims=True)``,
    over any axis, in the input dtype.

    Example
    -------
    >>> mod = FissionSoftmax()(mod)
    """

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return fission_module(mod, "softmax", {"relax.nn.softmax": fission_softmax})


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.FissionLogSoftmax")
class FissionLogSoftmax:
    """Module pass: ``log_softmax(x, axis)`` becomes max, subtract, exp, sum, log, subtract.

    ``d = x - max(x, axis, keepdims=True); y = d - log(sum(exp(d), axis, keepdims=True))``,
    in the input dtype.

    Example
    -------
    >>> mod = FissionLogSoftmax()(mod)
    """

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return fission_module(mod, "log_softmax", {"relax.nn.log_softmax": fission_log_softmax})


register_fission_rule("softmax", FissionSoftmax)
register_fission_rule("log_softmax", FissionLogSoftmax)

__all__ = ["FissionLogSoftmax", "FissionSoftmax", "emit_shifted_exp", "emit_softmax", "fission_log_softmax",
           "fission_softmax"]
