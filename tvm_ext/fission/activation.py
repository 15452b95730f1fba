"""Fission of the activations gelu (erf and tanh forms) and silu into elementwise primitives.

Computed in the input dtype with the constants of TVM's legalization (``relax.erf`` itself is
evaluated in float32 for float16 inputs when legalized, as TVM's gelu kernel does).
"""
from __future__ import annotations

import math

import tvm
from tvm import relax

from .registry import register_fission_rule
from .rules import const, fission_module, tensor_type


def fission_gelu(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Rewrite function of ``relax.nn.gelu``: ``x * (erf(x / sqrt(2)) * 0.5 + 0.5)``."""
    x = call.args[0]
    dtype = tensor_type(x).dtype
    scaled = bb.emit(relax.op.multiply(x, const(math.sqrt(0.5), dtype)))
    erf = bb.emit(relax.op.erf(scaled))
    half_erf = bb.emit(relax.op.multiply(erf, const(0.5, dtype)))
    cdf = bb.emit(relax.op.add(half_erf, const(0.5, dtype)))
    return relax.op.multiply(x, cdf)


def fission_gelu_tanh(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Rewrite function of ``relax.nn.gelu_tanh``.

    ``0.5 x (1 + tanh(sqrt(2 / pi) x (1 + 0.044715 x^2)))``.
    """
    x = call.args[0]
    dtype = tensor_type(x).dtype
    square = bb.emit(relax.op.multiply(x, x))
    cubic_coeff = bb.emit(relax.op.multiply(square, const(0.044715, dtype)))
    poly = bb.emit(relax.op.add(cubic_coeff, const(1.0, dtype)))
    inner = bb.emit(relax.op.multiply(x, poly))
    arg = bb.emit(relax.op.multiply(inner, const(math.sqrt(2.0 / math.pi), dtype)))
    tanh = bb.emit(relax.op.tanh(arg))
    one_plus = bb.emit(relax.op.add(tanh, const(1.0, dtype)))
    half_x = bb.emit(relax.op.multiply(x, const(0.5, dtype)))
    return relax.op.multiply(half_x, one_plus)


def fission_silu(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Rewrite function of ``relax.nn.silu``: ``x * sigmoid(x)``."""
    x = call.args[0]
    return relax.op.multiply(x, bb.emit(relax.op.sigmoid(x)))


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.FissionGelu")
class FissionGelu:
    """Module pass: ``gelu`` (erf form) becomes multiply, erf, multiply, add, multiply.

    ``y = x * (erf(x * 0.70710678) * 0.5 + 0.5)``.

    Example
    -------
    >>> mod = FissionGelu()(mod)
    """

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return fission_module(mod, "gelu", {"relax.nn.gelu": fission_gelu})


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.FissionGeluTanh")
class FissionGeluTanh:
    """Module pass: ``gelu_tanh`` becomes multiplies, adds and one tanh.

    ``y = (x * 0.5) * (1 + tanh(x * (1 + 0.044715 * x * x) * sqrt(2 / pi)))``.

    Example
    -------
    >>> mod = FissionGeluTanh()(mod)
    """

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return fission_module(mod, "gelu_tanh", {"relax.nn.gelu_tanh": fission_gelu_tanh})


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.FissionSilu")
class FissionSilu:
    """Module pass: ``silu`` (swish) becomes ``x * sigmoid(x)``.

    Example
    -------
    >>> mod = FissionSilu()(mod)
    """

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return fission_module(mod, "silu", {"relax.nn.silu": fission_silu})


register_fission_rule("gelu", FissionGelu)
register_fission_rule("gelu_tanh", FissionGeluTanh)
register_fission_rule("silu", FissionSilu)

__all__ = ["FissionGelu", "FissionGeluTanh", "FissionSilu", "fission_gelu", "fission_gelu_tanh", "fission_silu"]
