"""Per-channel constant scales folded into the convolution or GEMM before them, so CUTLASS takes the rest as its epilogue.

Exporters leave scales between a product and its bias: a batch norm as a multiply and an add
(DETR-R50's frozen batch norms: each of its 53 convolutions is followed by ``x * scale + shift``),
a learned per-channel scale on a block's output (NAFNet's ``beta`` and ``gamma``:
``(conv + bias) * beta + residual``; ConvNeXt's layer scale after its second linear layer). The
library kernel's epilogue has no per-channel multiply, so it took the product alone and left the
rest to a kernel of its own, or lost the whole group to TVM's fused kernel at 1-6% of the
tensor-core peak. Scaling an output channel scales its filter, so with a constant weight ``W``
(a convolution's OHWI weight along its first axis, a GEMM's ``[K, N]`` along ``N``, a dense
layer's ``[N, K]`` under ``permute_dims`` along ``N``) and a constant ``s`` over the output channels:

* ``conv(x, W) * s`` becomes ``conv(x, W * s)``;
* ``(conv(x, W) + b) * s`` becomes ``conv(x, W * s) + b * s``,

and what follows (the shift, a residual, an activation) is the bias / residual epilogue CUTLASS
fuses. Each product is formed in float32 and stored in the weight's dtype. Only where the
product's (and the bias add's) value has no other reader, and ``s`` varies along the channel
axis alone (or is one number).

Example
-------
>>> mod = FoldChannelScales(mod)   # conv2d -> multiply(s) -> add(t) becomes conv2d(W * s) -> add(t)
"""
from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax

from ..ir_update import reference_counts, rewrite_relax_functions
from .checks import dtype_of, is_bias_vector, is_op_call, static_shape
from .padding import remove_unused

_LOG = logging.getLogger(__name__)



def _channel_scale(scale: relax.Expr, out_shape: tuple[int, ...], dtype: str) -> np.ndarray | None:
    """``scale``'s values over the last (channel) axis, as float32 of that axis' extent, where it is
    a constant of ``dtype`` varying along that axis alone or one number; else None."""
    if not isinstance(scale, tvm.ir.Constant) or dtype_of(scale) != dtype:
        return None
    values = scale.value.numpy()
    if values.ndim > len(out_shape) or any(d != 1 for d in values.shape[:-1]):
        return None
    if values.size == 1:
        return np.full(out_shape[-1], values.reshape(()), dtype="float32")
    return values.reshape(-1).astype("float32") if is_bias_vector(scale, out_shape) else None


def _scaled(const: tvm.ir.Constant, scale: np.ndarray, axis: int) -> tvm.ir.Constant | None:
    """``const`` with its ``axis`` multiplied by ``scale``, formed in float32, stored in its dtype;
    None where the dtype cannot hold the products (one overflows, or a nonzero one becomes zero):
    the scale then stays where it is."""
    values = const.value.numpy()
    shape = [1] * values.ndim
    shape[axis] = -1
    exact = values.astype("float32") * scale.reshape(shape)
    with np.errstate(over="ignore"):
        stored = exact.astype(values.dtype)
    if not np.isfinite(stored).all() or np.any((stored == 0) & (exact != 0)):
        return None
    return relax.const(stored, dtype_of(const))


@relax.expr_functor.mutator
class _ScaleFolder(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, counts: dict):
        super().__init__(mod)
        self.counts = counts
        self.folded = 0

    def _only_read(self, var: relax.Expr) -> relax.Expr | None:
        """The value bound to ``var`` where this multiply is its one reader."""
        if not isinstance(var, relax.Var) or self.counts.get(var, 0) != 1:
            return None
        return self.lookup_binding(var)

    def _weighted(self, expr: relax.Expr | None) -> tuple[relax.Call, int, tvm.ir.Constant, int] | None:
        """``(call, operand, constant, axis)`` where ``expr`` is a product whose output channels are
        the ``axis`` of a constant weight: an NHWC/OHWI conv2d (axis 0), a matmul by a ``[K, N]``
        constant (axis 1) or by a ``[N, K]`` one under ``permute_dims`` (a dense layer: axis 0)."""
        if is_op_call(expr, "relax.nn.conv2d"):
            attrs = expr.attrs
            if str(attrs.out_layout) == "NHWC" and str(attrs.kernel_layout) == "OHWI" \
                    and isinstance(expr.args[1], tvm.ir.Constant):
                return expr, 1, expr.args[1], 0
            return None
        if not is_op_call(expr, "relax.matmul") or len(expr.args) != 2:
            return None
        weight = expr.args[1]
        if isinstance(weight, tvm.ir.Constant) and len(weight.value.shape) == 2:
            return expr, 1, weight, 1
        bound = self.lookup_binding(weight) if isinstance(weight, relax.Var) else None
        if is_op_call(bound, "relax.permute_dims") and isinstance(bound.args[0], tvm.ir.Constant) \
                and len(bound.args[0].value.shape) == 2 \
                and (bound.attrs.axes is None or [int(a) for a in bound.attrs.axes] == [1, 0]):
            return expr, 1, bound.args[0], 0
        return None

    def _rescaled(self, weighted: tuple[relax.Call, int, tvm.ir.Constant, int],
                  factors: np.ndarray) -> relax.Call | None:
        """The product of :meth:`_weighted` with its weight's output channels scaled (None where
        the weight's dtype cannot hold them, :func:`_scaled`)."""
        call, operand, const, axis = weighted
        weight: relax.Expr | None = _scaled(const, factors, axis)
        if weight is None:
            return None
        if not call.args[operand].same_as(const):       # the constant under permute_dims
            weight = self.builder_.emit(relax.op.permute_dims(weight, [1, 0]))
        args = list(call.args)
        args[operand] = weight
        return relax.Call(call.op, args, call.attrs)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not is_op_call(call, "relax.multiply"):
            return call
        for value, scale in (call.args, call.args[::-1]):
            shape = static_shape(value) if isinstance(value, relax.Var) else None
            factors = _channel_scale(scale, shape, dtype_of(value)) if shape and static_shape(call) == shape else None
            bound = self._only_read(value) if factors is not None else None
            product = self._weighted(bound)
            rescaled = self._rescaled(product, factors) if product is not None else None
            if rescaled is not None:                               # conv(x, W) * s
                self.folded += 1
                return rescaled
            if not is_op_call(bound, "relax.add"):
                continue
            for inner, bias in (bound.args, bound.args[::-1]):     # (conv(x, W) + b) * s
                product = self._weighted(self._only_read(inner))
                if product is None or not isinstance(bias, tvm.ir.Constant) or not is_bias_vector(bias, shape) \
                        or dtype_of(bias) != dtype_of(value):
                    continue
                new_bias = _scaled(bias, factors, len(bias.value.shape) - 1)
                rescaled = self._rescaled(product, factors) if new_bias is not None else None
                if rescaled is None:
                    continue
                self.folded += 1
                return relax.op.add(self.builder_.emit(rescaled), new_bias)
        return call


def fold_channel_scales(mod: tvm.IRModule) -> tvm.IRModule:
    """Fold every per-channel constant scale into the convolution or GEMM before it (module docstring)."""
    counts = {}
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            counts.update(reference_counts(func))
    folder = _ScaleFolder(mod, counts)
    out = rewrite_relax_functions(mod, folder, skip_offloaded=True)
    if not folder.folded:
        return mod
    _LOG.info("folded %d per-channel scales into the convolutions and GEMMs before them", folder.folded)
    return remove_unused(out)


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.cutlass.FoldChannelScales")
def FoldChannelScales(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Pass form of :func:`fold_channel_scales`."""
    return fold_channel_scales(mod)


__all__ = ["FoldChannelScales", "fold_channel_scales"]
