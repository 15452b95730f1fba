"""Fission of fused multi-head attention into layout, linear and softmax primitives.

``relax.nn.attention`` (and ``relax.nn.attention_bias``, what it becomes with a bias) takes
BSNH tensors: ``q (B, S, N, H)``, ``k (B, S_kv, N, H)``, ``v (B, S_kv, N, H_v)``. The rule
emits

* ``permute_dims`` of q, k, v to BNSH / BNHS / BNSH (layout);
* ``matmul(q, k^T)`` (linear), then ``* scale`` or, without one, ``/ sqrt(H)``;
* ``+ bias`` (broadcast to ``(B, N, S, S_kv)``) when given;
* the softmax over ``S_kv``, itself fissioned; a causal mask zeroes the scores above the
  diagonal (``tril``) before the max and the exponentials after it, as TVM's legalization
  does (``TopLeft``: ``k = 0``; ``BottomRight``: ``k = |S - S_kv|``, the op's definition);
* ``matmul(probs, v)`` (linear) and the permute back to BSNH.

Computed in the input dtype. Left alone (and logged): sliding-window attention
(``window_size``), an unknown causal-mask name, a symbolic ``H`` without an explicit scale and
a symbolic ``S`` / ``S_kv`` with a ``BottomRight`` mask (the constants need them).
"""
from __future__ import annotations

import math

import tvm
from tvm import relax

from .registry import register_fission_rule
from .rules import Unsupported, const, fission_module, known_shape, static_int, tensor_type
from .softmax import emit_shifted_exp, emit_softmax

_BSNH_TO_BNSH = [0, 2, 1, 3]
_BSNH_TO_BNHS = [0, 2, 3, 1]
_CAUSAL_MASKS = (None, "TopLeft", "BottomRight")


def fission_attention(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Rewrite function of ``relax.nn.attention`` / ``relax.nn.attention_bias`` (see :class:`FissionAttention`)."""
    q, k, v = call.args[:3]
    bias = call.args[3] if len(call.args) > 3 else None
    attrs = call.attrs
    if attrs.window_size is not None:
        raise Unsupported(f"sliding-window attention (window_size={attrs.window_size}) is not fissioned")
    causal = None if attrs.causal_mask is None else str(attrs.causal_mask)
    if causal not in _CAUSAL_MASKS:
        raise Unsupported(f"unknown causal_mask {causal!r}")
    q_ty, k_ty = tensor_type(q), tensor_type(k)
    dtype = q_ty.dtype
    if attrs.scale is None:  # TVM's default: divide by sqrt(head_dim)
        head_dim = static_int(known_shape(q_ty)[3], "the head dim (no explicit scale)")
        apply_scale, factor = relax.op.divide, math.sqrt(head_dim)
    else:
        apply_scale, factor = relax.op.multiply, float(attrs.scale.value)
    offset = 0
    if causal == "BottomRight":
        seq = static_int(known_shape(q_ty)[1], "seq_len (BottomRight mask)")
        seq_kv = static_int(known_shape(k_ty)[1], "seq_len_kv (BottomRight mask)")
        offset = abs(seq - seq_kv)

    q_t = bb.emit(relax.op.permute_dims(q, _BSNH_TO_BNSH))
    k_t = bb.emit(relax.op.permute_dims(k, _BSNH_TO_BNHS))
    scores = bb.emit(relax.op.matmul(q_t, k_t))
    scores = bb.emit(apply_scale(scores, const(factor, dtype)))
    if bias is not None:
        scores = bb.emit(relax.op.add(scores, bias))
    if causal is None:
        probs = bb.emit(emit_softmax(bb, scores, 3))
    else:
        masked = bb.emit(relax.op.tril(scores, offset))
        _, exps = emit_shifted_exp(bb, masked, 3)
        exps = bb.emit(relax.op.tril(exps, offset))
        total = bb.emit(relax.op.sum(exps, [3], keepdims=True))
        probs = bb.emit(relax.op.divide(exps, total))
    v_t = bb.emit(relax.op.permute_dims(v, _BSNH_TO_BNSH))
    out = bb.emit(relax.op.matmul(probs, v_t))
    return relax.op.permute_dims(out, _BSNH_TO_BNSH)


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.FissionAttention")
class FissionAttention:
    """Module pass: ``attention`` becomes permute, matmul, scale, (bias add), softmax primitives, matmul, permute.

    Handles the optional bias, explicit scale and ``TopLeft`` / ``BottomRight`` causal masks;
    see :mod:`tvm_ext.fission.attention` for the graph and what is left alone.

    Example
    -------
    >>> mod = FissionAttention()(mod)
    """

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return fission_module(mod, "attention", {"relax.nn.attention": fission_attention,
                                                 "relax.nn.attention_bias": fission_attention})


register_fission_rule("attention", FissionAttention)

__all__ = ["FissionAttention", "fission_attention"]
