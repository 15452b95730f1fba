"""Korch's first fission-enabled rewrite (Fig. 2b): a sum over the last axis as a GEMM with ones.

``sum(x, axis=-1)`` is ``x @ ones(K)``: the reduction becomes a linear primitive, which a
kernel selector can merge with the GEMM that produces or consumes ``x`` (Korch then swaps the
softmax's divide past the next matmul and merges the two matmuls that share an input; those
two rewrites are not done here). Off by default: ``Fission(algebraic=True)`` runs it after the
rules, so the softmax sums the rules produce are rewritten too.
"""
from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax

from .rules import Unsupported, fission_module, known_shape, normalize_axes, static_int, tensor_type


def sum_to_matmul(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Rewrite function of ``relax.sum`` over the last axis only: ``matmul(x, ones)``.

    ``ones`` is a constant ``(K, 1)`` with ``keepdims`` (result ``(..., 1)``), else ``(K,)``.
    Other sums, integer dtypes and a symbolic ``K`` raise :class:`~tvm_ext.fission.rules.Unsupported`.
    """
    x = call.args[0]
    ty = tensor_type(x)
    axes = normalize_axes(call.attrs.axis, ty.ndim)
    if axes != [ty.ndim - 1]:
        raise Unsupported(f"sums over axes {axes} of a rank-{ty.ndim} tensor, not the last axis only")
    if not str(ty.dtype).startswith(("float", "bfloat")):
        raise Unsupported(f"{ty.dtype} sums are left as reductions")
    length = static_int(known_shape(ty)[-1], "the summed dim")
    ones_shape = (length, 1) if call.attrs.keepdims else (length,)
    return relax.op.matmul(x, relax.const(np.ones(ones_shape, dtype=str(ty.dtype)), str(ty.dtype)))


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.FissionSumToMatmul")
class SumToMatmul:
    """Module pass: every float ``sum`` over the last axis becomes ``matmul(x, ones)``.

    Applies to all such sums of the module, not only the ones fission produced. The GEMM
    accumulates in the input dtype, as the sum does.

    Example
    -------
    >>> mod = SumToMatmul()(FissionSoftmax()(mod))   # or Fission(algebraic=True)
    """

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        # most sums are not over the last axis alone: skipping them is expected, not a warning
        return fission_module(mod, "sum_to_matmul", {"relax.sum": sum_to_matmul}, skip_level=logging.DEBUG)


__all__ = ["SumToMatmul", "sum_to_matmul"]
