"""Channel padding for CUTLASS convolutions (Bolt §3.2.3): channels to an access CUTLASS takes.

A 16-bit NHWC convolution whose input channels ``C`` are not a multiple of 8 (ResNet's first
convolution: ``C = 3``) gets narrow vector loads (alignment 1, 2 or 4 instead of 128-bit) or,
for odd ``C``, is not offloaded at all; a float32 one (TF32, :mod:`.precision`) needs a multiple
of 4 for 128-bit loads. :func:`pad_conv_channels` rounds ``C`` up:

* the weight ``[K, R, S, C]`` gets zero input channels; a constant weight is padded here, at
  compile time (Bolt pre-pads the parameters), any other weight through an ``R.nn.pad``;
* the activation gets a zero-filled ``R.nn.pad`` on its channel axis. ``R.nn.pad`` is an
  injective Relax operator, so the baseline graph passes fuse it into its producer (for a model
  input, into the NCHW -> NHWC transpose), and it costs no launch of its own.

An odd output-channel count ``K`` (YOLOv5's detection heads: ``3 x 85 = 255``) keeps the whole
convolution off CUTLASS. Where the zeros stay within the GEMM padding's share
(:func:`aligned_extra`: the widest access of 128, 64 or 32 bits that adds at most 1/8), the
weight gets zero filters, the convolution writes ``K`` padded channels and an ``R.strided_slice``
takes the first ``K`` back. A bias added to the sliced output is added before the slice instead,
with zeros for the padded channels (:func:`bias_before_slice`), so the library kernel still
takes the bias as its epilogue; the slice fuses into the output's readers.

Zero channels contribute nothing to the sums, so the padded graph computes the same values.
"""
from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax

from ..ir_update import rewrite_relax_functions, with_functions
from .checks import (
    OUTPUT_DTYPES,
    dtype_of,
    is_bias_vector,
    is_op_call,
    min_alignment,
    static_shape,
)
from .precision import input_dtypes

_LOG = logging.getLogger(__name__)

#: Bits of the vector access the channel count is padded to (8 16-bit or 4 32-bit elements).
PAD_BITS = 128


def pad_multiple(dtype: str) -> int:
    """Channel multiple for ``dtype`` operands: one :data:`PAD_BITS` access."""
    return PAD_BITS // tvm.DataType(dtype).bits


#: Largest share an extent is padded by: at most 1/8 more work.
MAX_EXTRA_SHARE = 1 / 8


def aligned_extra(extent: int, dtype: str) -> int:
    """Zeros to add to ``extent``: none where CUTLASS already takes it (a multiple of
    :func:`~tvm_ext.cutlass.checks.min_alignment`), else up to the widest access whose zeros stay
    within :data:`MAX_EXTRA_SHARE`: one 128-bit access, else 64 or 32 bits (Swin's 49-token windows:
    56 would add 14%, 52 adds 6% and CUTLASS reads it 4 elements at a time); 0 where none does."""
    align = min_alignment(dtype)
    if extent % align == 0:
        return 0
    multiple = pad_multiple(dtype)
    while multiple >= align:
        extra = -extent % multiple
        if extra <= extent * MAX_EXTRA_SHARE:
            return extra
        multiple //= 2
    return 0


def _conv_shapes(call: relax.Call) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Data and weight shapes of a ``relax.nn.conv2d`` CUTLASS could take but for its channel
    counts (NHWC/OHWI, not grouped, symmetric padding, supported dtypes; see
    :func:`~tvm_ext.cutlass.checks.conv2d_reject_reason`), else None."""
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d"):
        return None
    attrs = call.attrs
    if str(attrs.data_layout) != "NHWC" or str(attrs.kernel_layout) != "OHWI" or int(attrs.groups) != 1:
        return None
    data, weight = call.args
    d_shape, w_shape = static_shape(data), static_shape(weight)
    if d_shape is None or w_shape is None or dtype_of(data) not in input_dtypes() or dtype_of(weight) != dtype_of(data):
        return None
    pad = [int(v) for v in attrs.padding]
    if len(pad) != 4 or pad[0] != pad[2] or pad[1] != pad[3] or dtype_of(call) not in OUTPUT_DTYPES:
        return None
    return d_shape, w_shape


def output_channel_padding(call: relax.Call) -> int:
    """Zero output channels (filters) to add to a ``relax.nn.conv2d`` call (module docstring)."""
    shapes = _conv_shapes(call)
    return aligned_extra(shapes[1][0], dtype_of(call.args[0])) if shapes is not None else 0


def channel_padding(call: relax.Call, multiple: int | None = None) -> int:
    """Zero input channels to add to a ``relax.nn.conv2d`` call (0 when none are needed or possible);
    ``multiple`` defaults to :func:`pad_multiple` of its dtype."""
    shapes = _conv_shapes(call)
    if shapes is None:
        return 0
    dtype = dtype_of(call.args[0])
    channels, out_channels = shapes[0][3], shapes[1][0]
    if (out_channels + output_channel_padding(call)) % min_alignment(dtype):
        return 0   # CUTLASS would not take the conv anyway
    return -channels % (multiple or pad_multiple(dtype))


def zero_pad_last_axes(expr: relax.Expr, extras: tuple[int, ...]) -> relax.Expr:
    """``R.nn.pad`` with zeros after the last ``len(extras)`` axes of ``expr`` (static rank)."""
    widths = [0, 0] * (len(static_shape(expr)) - len(extras))
    for extra in extras:
        widths += [0, extra]
    return relax.op.nn.pad(expr, widths)



def bias_before_slice(mutator: relax.PyExprMutator, call: relax.Call, sliced: dict) -> relax.Expr | None:
    """``call`` (an ``R.add`` already visited by ``mutator``) computed before the slice that takes
    a padded product back (``sliced``: the padded products' variables -> their true last extent)
    where its other operand is a bias vector: the bias gets zeros for the padded columns, the add
    runs on the padded product and the slice follows (so a library epilogue can take the bias).
    None where ``call`` is no such add."""
    if not is_op_call(call, "relax.add"):
        return None
    for value, bias in (call.args, call.args[::-1]):
        bound = mutator.lookup_binding(value) if isinstance(value, relax.Var) else None
        if not (is_op_call(bound, "relax.strided_slice") and isinstance(bound.args[0], relax.Var)
                and bound.args[0] in sliced):
            continue
        padded, extent = bound.args[0], sliced[bound.args[0]]
        shape = static_shape(value)
        if shape is None or not is_bias_vector(bias, shape) or dtype_of(bias) != dtype_of(value):
            continue
        extra = static_shape(padded)[-1] - extent
        if isinstance(bias, tvm.ir.Constant):
            values = bias.value.numpy()
            new_bias = relax.const(np.pad(values, [(0, 0)] * (values.ndim - 1) + [(0, extra)]), dtype_of(bias))
        else:
            new_bias = mutator.builder_.emit(zero_pad_last_axes(bias, (extra,)))
        total = mutator.builder_.emit(relax.op.add(padded, new_bias))
        sliced[total] = extent
        return relax.op.strided_slice(total, axes=[-1], begin=[0], end=[extent])
    return None


@relax.expr_functor.mutator
class _ChannelPadder(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, multiple: int | None):
        super().__init__(mod)
        self.multiple = multiple
        self.padded = 0
        self.sliced: dict = {}

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - visitor API
        call = super().visit_call_(call)
        moved = bias_before_slice(self, call, self.sliced)
        if moved is not None:
            return moved
        extra, filters = channel_padding(call, self.multiple), output_channel_padding(call)
        if not (extra or filters):
            return call
        data, weight = call.args
        if isinstance(weight, tvm.ir.Constant):
            values = weight.value.numpy()
            new_weight = relax.const(np.pad(values, [(0, filters), (0, 0), (0, 0), (0, extra)]), dtype_of(weight))
        else:
            new_weight = self.builder_.emit(relax.op.nn.pad(weight, [0, filters, 0, 0, 0, 0, 0, extra]))
        new_data = self.builder_.emit(zero_pad_last_axes(data, (extra,))) if extra else data
        self.padded += 1
        conv = relax.Call(call.op, [new_data, new_weight], call.attrs)
        if not filters:
            return conv
        out = self.builder_.emit(conv)
        self.sliced[out] = static_shape(call)[-1]
        return relax.op.strided_slice(out, axes=[-1], begin=[0], end=[static_shape(call)[-1]])


def remove_unused(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` without the bindings nothing reads (a slice :func:`bias_before_slice` replaced)."""
    return with_functions(mod, {gv: relax.analysis.remove_all_unused(f) for gv, f in mod.functions_items()
                                if isinstance(f, relax.Function) and not (f.attrs and "Codegen" in f.attrs)})


def pad_conv_channels(mod: tvm.IRModule, multiple: int | None = None) -> tvm.IRModule:
    """Pad the input channels of every NHWC/OHWI conv2d CUTLASS may take to a multiple of ``multiple``
    (default: one 128-bit access of its dtype, :func:`pad_multiple`), and odd output channels as
    the module docstring says."""
    padder = _ChannelPadder(mod, multiple)
    out = rewrite_relax_functions(mod, padder, skip_offloaded=True)
    if padder.padded:
        _LOG.info("padded the channels of %d convolutions (inputs to multiples of %s, odd outputs)", padder.padded,
                  multiple or f"{PAD_BITS} bits")
    return remove_unused(out) if padder.sliced else out


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.cutlass.PadConvChannels")
def PadConvChannels(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:  # noqa: N802
    """Pass form of :func:`pad_conv_channels` (multiples of one :data:`PAD_BITS` access)."""
    return pad_conv_channels(mod)
