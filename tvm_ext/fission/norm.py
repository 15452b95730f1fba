"""Fission of the statistics normalizations: layer, RMS, group and instance norm.

Each becomes reductions (``mean``) and elementwise ops: the mean, the centred input, the
variance as the mean of the centred squares (two passes, as TVM's layer norm), ``rsqrt(var +
eps)``, then the scale and shift. ``center`` / ``scale`` set to False drop the shift / scale,
as the Relax ops document it (TVM's legalization applies beta and gamma regardless).

Dtypes: float16 / bfloat16 inputs are cast to float32 for the statistics and the normalized
value and cast back before gamma and beta, like TVM's kernels for these ops; other dtypes are
computed as they are.
"""
from __future__ import annotations

from collections.abc import Sequence

import tvm
from tvm import relax

from .registry import register_fission_rule
from .rules import (Unsupported, affine, broadcast_param, const, downcast, fission_module, known_shape,
                    normalize_axes, static_int, tensor_type, upcast)


def emit_normalized(bb: relax.BlockBuilder, x: relax.Expr, dtype: str | tvm.ir.PrimType, axes: Sequence[int],
                    epsilon: float) -> relax.Expr:
    """Emit ``(x - mean) * rsqrt(mean((x - mean)^2) + eps)`` over ``axes``; returns it in ``dtype``."""
    work, work_dtype = upcast(bb, x, dtype)
    mean = bb.emit(relax.op.mean(work, list(axes), keepdims=True))
    centred = bb.emit(relax.op.subtract(work, mean))
    squares = bb.emit(relax.op.multiply(centred, centred))
    var = bb.emit(relax.op.mean(squares, list(axes), keepdims=True))
    shifted = bb.emit(relax.op.add(var, const(epsilon, work_dtype)))
    rstd = bb.emit(relax.op.rsqrt(shifted))
    return downcast(bb, relax.op.multiply(centred, rstd), work_dtype, dtype)


def _param_axes(axes: Sequence[int], ndim: int) -> list[int]:
    """``axes`` normalized; they must be increasing, as the dims of gamma / weight follow them."""
    out = normalize_axes(axes, ndim)
    if [int(a) % ndim for a in axes] != out:
        raise Unsupported(f"axes {list(axes)} are not in increasing order (the order of gamma's dims)")
    return out


def _optional(attrs: tvm.ir.Attrs, gamma: relax.Expr, beta: relax.Expr) -> tuple[relax.Expr | None, ...]:
    return (gamma if attrs.scale else None), (beta if attrs.center else None)


def fission_layer_norm(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Rewrite function of ``relax.nn.layer_norm`` (see :class:`FissionLayerNorm`)."""
    x, gamma, beta = call.args
    ty = tensor_type(x)
    axes = _param_axes(call.attrs.axes, ty.ndim)
    norm = emit_normalized(bb, x, ty.dtype, axes, float(call.attrs.epsilon))
    return affine(bb, norm, *_optional(call.attrs, gamma, beta), axes, ty.ndim)


def fission_rms_norm(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Rewrite function of ``relax.nn.rms_norm`` (see :class:`FissionRmsNorm`)."""
    x, weight = call.args
    ty = tensor_type(x)
    axes = _param_axes(call.attrs.axes, ty.ndim)
    work, work_dtype = upcast(bb, x, ty.dtype)
    squares = bb.emit(relax.op.multiply(work, work))
    mean_sq = bb.emit(relax.op.mean(squares, axes, keepdims=True))
    shifted = bb.emit(relax.op.add(mean_sq, const(float(call.attrs.epsilon), work_dtype)))
    rstd = bb.emit(relax.op.rsqrt(shifted))
    norm = downcast(bb, relax.op.multiply(work, rstd), work_dtype, ty.dtype)
    return affine(bb, norm, weight, None, axes, ty.ndim)


def fission_group_norm(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Rewrite function of ``relax.nn.group_norm`` (see :class:`FissionGroupNorm`)."""
    x, gamma, beta = call.args
    attrs = call.attrs
    ty = tensor_type(x)
    shape = known_shape(ty)
    (channel_axis,) = normalize_axes([attrs.channel_axis], ty.ndim)
    channels = static_int(shape[channel_axis], "the channel count")
    groups = int(attrs.num_groups)
    if groups <= 0 or channels % groups:
        raise Unsupported(f"{channels} channels do not split into {groups} groups")
    axes = normalize_axes(attrs.axes, ty.ndim)
    if channel_axis in axes:
        raise Unsupported(f"axes {axes} contain the channel axis {channel_axis}")
    # (.., C, ..) -> (.., G, C/G, ..): statistics over the channels of a group and `axes`
    grouped_shape = shape[:channel_axis] + [groups, channels // groups] + shape[channel_axis + 1:]
    grouped_axes = sorted([channel_axis + 1] + [a + 1 if a > channel_axis else a for a in axes])
    grouped = bb.emit(relax.op.reshape(x, grouped_shape))
    norm = emit_normalized(bb, grouped, ty.dtype, grouped_axes, float(attrs.epsilon))
    norm = bb.emit(relax.op.reshape(norm, shape))
    return affine(bb, norm, *_optional(attrs, gamma, beta), [channel_axis], ty.ndim)


def fission_instance_norm(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Rewrite function of ``relax.nn.instance_norm`` (see :class:`FissionInstanceNorm`)."""
    x, gamma, beta = call.args
    attrs = call.attrs
    ty = tensor_type(x)
    (channel_axis,) = normalize_axes([attrs.channel_axis], ty.ndim)
    axes = normalize_axes(attrs.axes, ty.ndim)
    if channel_axis in axes:
        raise Unsupported(f"axes {axes} contain the channel axis {channel_axis}")
    norm = emit_normalized(bb, x, ty.dtype, axes, float(attrs.epsilon))
    return affine(bb, norm, *_optional(attrs, gamma, beta), [channel_axis], ty.ndim)


def fission_batch_norm(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Rewrite function of ``relax.nn.batch_norm`` in inference (see :class:`FissionBatchNorm`)."""
    x, gamma, beta, moving_mean, moving_var = call.args
    attrs = call.attrs
    if attrs.training:
        raise Unsupported("training=True normalizes with the batch's statistics; only inference is fissioned")
    ty = tensor_type(x)
    (axis,) = normalize_axes([attrs.axis], ty.ndim)
    shifted = bb.emit(relax.op.add(moving_var, const(float(attrs.epsilon), ty.dtype)))
    std = bb.emit(relax.op.sqrt(shifted))
    # per channel: scale = gamma / std, shift = beta - mean * scale (folded when the params are constants)
    if attrs.scale:
        scale = bb.emit(relax.op.divide(gamma, std))
    else:
        scale = bb.emit(relax.op.divide(const(1.0, ty.dtype), std))
    mean_scaled = bb.emit(relax.op.multiply(moving_mean, scale))
    if attrs.center:
        shift = bb.emit(relax.op.subtract(beta, mean_scaled))
    else:
        shift = bb.emit(relax.op.negative(mean_scaled))
    scaled = bb.emit(relax.op.multiply(x, broadcast_param(bb, scale, [axis], ty.ndim)))
    out = bb.emit(relax.op.add(scaled, broadcast_param(bb, shift, [axis], ty.ndim)))
    return relax.Tuple([out, moving_mean, moving_var])


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.FissionLayerNorm")
class FissionLayerNorm:
    """Module pass: ``layer_norm`` becomes mean, subtract, multiply, mean, add, rsqrt, multiply, scale, shift.

    ``c = x - mean(x, axes); y = c * rsqrt(mean(c * c, axes) + eps) * gamma + beta`` (statistics
    with keepdims; gamma / beta dropped when ``scale`` / ``center`` is False).

    Example
    -------
    >>> mod = FissionLayerNorm()(mod)
    """

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return fission_module(mod, "layer_norm", {"relax.nn.layer_norm": fission_layer_norm})


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.FissionRmsNorm")
class FissionRmsNorm:
    """Module pass: ``rms_norm`` becomes multiply, mean, add, rsqrt, multiply, scale.

    ``y = x * rsqrt(mean(x * x, axes, keepdims=True) + eps) * weight``.

    Example
    -------
    >>> mod = FissionRmsNorm()(mod)
    """

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return fission_module(mod, "rms_norm", {"relax.nn.rms_norm": fission_rms_norm})


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.FissionGroupNorm")
class FissionGroupNorm:
    """Module pass: ``group_norm`` becomes reshape, the layer-norm primitives, reshape, scale, shift.

    The channel axis is split into ``(num_groups, C / num_groups)``; the statistics run over
    the second part and ``axes``; gamma / beta ``(C,)`` broadcast along the channel axis. Needs
    a known shape with a static channel count (other dims may be symbolic).

    Example
    -------
    >>> mod = FissionGroupNorm()(mod)
    """

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return fission_module(mod, "group_norm", {"relax.nn.group_norm": fission_group_norm})


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.FissionInstanceNorm")
class FissionInstanceNorm:
    """Module pass: ``instance_norm`` becomes the layer-norm primitives over ``axes``, scale, shift.

    gamma / beta ``(C,)`` broadcast along ``channel_axis``. The ONNX importer already imports
    InstanceNormalization as ``mean`` / ``variance`` / elementwise ops; the ``variance`` rule
    (:class:`~tvm_ext.fission.statistics.FissionVariance`) completes that form.

    Example
    -------
    >>> mod = FissionInstanceNorm()(mod)
    """

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return fission_module(mod, "instance_norm", {"relax.nn.instance_norm": fission_instance_norm})


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.FissionBatchNorm")
class FissionBatchNorm:
    """Module pass: inference ``batch_norm`` becomes a per-channel scale and shift.

    ``s = gamma / sqrt(var + eps)``, ``t = beta - mean * s`` on the ``(C,)`` parameters, then
    ``x * s + t`` broadcast along ``axis``; the call's tuple becomes ``(x * s + t, mean, var)``.
    Calls with ``training=True`` (the TVMScript default) are left alone: they normalize with
    batch statistics. Computed in the input dtype.

    ``relax.transform.DecomposeOpsForInference`` is not reused: it emits ``(x - mean) /
    sqrt(var + eps) * gamma + beta`` (four ops on the full tensor instead of two, none
    foldable) and rewrites training-mode calls as if they were inference.

    Example
    -------
    >>> mod = FissionBatchNorm()(mod)
    """

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return fission_module(mod, "batch_norm", {"relax.nn.batch_norm": fission_batch_norm})


register_fission_rule("layer_norm", FissionLayerNorm)
register_fission_rule("rms_norm", FissionRmsNorm)
register_fission_rule("group_norm", FissionGroupNorm)
register_fission_rule("instance_norm", FissionInstanceNorm)
register_fission_rule("batch_norm", FissionBatchNorm)

__all__ = ["FissionBatchNorm", "FissionGroupNorm", "FissionInstanceNorm", "FissionLayerNorm", "FissionRmsNorm",
           "emit_normalized", "fission_batch_norm", "fission_group_norm", "fission_instance_norm",
           "fission_layer_norm", "fission_rms_norm"]
