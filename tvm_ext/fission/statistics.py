"""Fission of ``variance`` and ``std`` into means and elementwise ops.

The ONNX importer turns InstanceNormalization into ``mean`` / ``variance`` / elementwise ops
(not ``relax.nn.instance_norm``); this rule splits the ``variance`` so that form is made of
primitives too. Computed in the input dtype, as TVM's legalization of these ops does.
"""
from __future__ import annotations

import tvm
from tvm import relax

from .registry import register_fission_rule
from .rules import fission_module, normalize_axes, tensor_type


def emit_variance(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``mean((x - mean(x, axes, keepdims=True))^2, axes, keepdims)``; the last mean is not emitted."""
    x = call.args[0]
    axes = normalize_axes(call.attrs.axis, tensor_type(x).ndim)
    mean = bb.emit(relax.op.mean(x, axes, keepdims=True))
    centred = bb.emit(relax.op.subtract(x, mean))
    squares = bb.emit(relax.op.multiply(centred, centred))
    return relax.op.mean(squares, axes, keepdims=bool(call.attrs.keepdims))


def fission_std(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Rewrite function of ``relax.std``: ``sqrt`` of :func:`emit_variance`."""
    return relax.op.sqrt(bb.emit(emit_variance(bb, call)))


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.FissionVariance")
class FissionVariance:
    """Module pass: ``variance`` and ``std`` become mean, subtract, multiply, mean (and sqrt).

    ``c = x - mean(x, axis, keepdims=True); var = mean(c * c, axis, keepdims)``; ``std =
    sqrt(var)``. ``axis=None`` reduces every axis.

    Example
    -------
    >>> mod = FissionVariance()(mod)
    """

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return fission_module(mod, "variance", {"relax.variance": emit_variance, "relax.std": fission_std})


register_fission_rule("variance", FissionVariance)

__all__ = ["FissionVariance", "emit_variance", "fission_std"]
