"""Channel padding for CUTLASS convolutions (Bolt §3.2.3): input channels to one 128-bit access.

A 16-bit NHWC convolution whose input channels ``C`` are not a multiple of 8 (ResNet's first
convolution: ``C = 3``) gets narrow vector loads (alignment 1, 2 or 4 instead of 128-bit) or,
for odd ``C``, is not offloaded at all; a float32 one (TF32, :mod:`.precision`) needs a multiple
of 4 for 128-bit loads. :func:`pad_conv_channels` rounds ``C`` up:

* the weight ``[K, R, S, C]`` gets zero input channels; a constant weight is padded here, at
  compile time (Bolt pre-pads the parameters), any other weight through an ``R.nn.pad``;
* the activation gets a zero-filled ``R.nn.pad`` on its channel axis. ``R.nn.pad`` is an
  injective Relax operator, so the baseline graph passes fuse it into its producer (for a model
  input, into the NCHW -> NHWC transpose), and it costs no launch of its own.

Zero channels contribute nothing to the sums, so the padded graph computes the same values.
"""
from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax

from ..ir_update import rewrite_relax_functions
from .checks import OUTPUT_DTYPES, dtype_of, min_alignment, static_shape
from .precision import input_dtypes

_LOG = logging.getLogger(__name__)

#: Bits of the vector access the channel count is padded to (8 16-bit or 4 32-bit elements).
PAD_BITS = 128


def pad_multiple(dtype: str) -> int:
    """Channel multiple for ``dtype`` operands: one :data:`PAD_BITS` access."""
    return PAD_BITS // tvm.DataType(dtype).bits


def channel_padding(call: relax.Call, multiple: int | None = None) -> int:
    """Zero input channels to add to a ``relax.nn.conv2d`` call (0 when none are needed or possible);
    ``multiple`` defaults to :func:`pad_multiple` of its dtype."""
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d"):
        return 0
    attrs = call.attrs
    if str(attrs.data_layout) != "NHWC" or str(attrs.kernel_layout) != "OHWI" or int(attrs.groups) != 1:
        return 0
    data, weight = call.args
    d_shape, w_shape = static_shape(data), static_shape(weight)
    if d_shape is None or w_shape is None or dtype_of(data) not in input_dtypes() or dtype_of(weight) != dtype_of(data):
        return 0
    pad = [int(v) for v in attrs.padding]
    if len(pad) != 4 or pad[0] != pad[2] or pad[1] != pad[3] or dtype_of(call) not in OUTPUT_DTYPES:
        return 0  # CUTLASS would not take the conv anyway (see checks.conv2d_reject_reason)
    channels, out_channels = d_shape[3], w_shape[0]
    if out_channels % min_alignment(dtype_of(data)):
        return 0
    return -channels % (multiple or pad_multiple(dtype_of(data)))


def zero_pad_last_axes(expr: relax.Expr, extras: tuple[int, ...]) -> relax.Expr:
    """``R.nn.pad`` with zeros after the last ``len(extras)`` axes of ``expr`` (static rank)."""
    widths = [0, 0] * (len(static_shape(expr)) - len(extras))
    for extra in extras:
        widths += [0, extra]
    return relax.op.nn.pad(expr, widths)


@relax.expr_functor.mutator
class _ChannelPadder(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, multiple: int | None):
        super().__init__(mod)
        self.multiple = multiple
        self.padded = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - visitor API
        call = super().visit_call_(call)
        extra = channel_padding(call, self.multiple)
        if not extra:
            return call
        data, weight = call.args
        if isinstance(weight, tvm.ir.Constant):
            values = weight.value.numpy()
            new_weight = relax.const(np.pad(values, [(0, 0)] * 3 + [(0, extra)]), dtype_of(weight))
        else:
            new_weight = self.builder_.emit(zero_pad_last_axes(weight, (extra,)))
        new_data = self.builder_.emit(zero_pad_last_axes(data, (extra,)))
        self.padded += 1
        return relax.Call(call.op, [new_data, new_weight], call.attrs)


def pad_conv_channels(mod: tvm.IRModule, multiple: int | None = None) -> tvm.IRModule:
    """Pad the input channels of every NHWC/OHWI conv2d CUTLASS may take to a multiple of ``multiple``
    (default: one 128-bit access of its dtype, :func:`pad_multiple`)."""
    padder = _ChannelPadder(mod, multiple)
    out = rewrite_relax_functions(mod, padder, skip_offloaded=True)
    if padder.padded:
        _LOG.info("padded the input channels of %d convolutions to multiples of %s", padder.padded,
                  multiple or f"{PAD_BITS} bits")
    return out


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.cutlass.PadConvChannels")
def PadConvChannels(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:  # noqa: N802
    """Pass form of :func:`pad_conv_channels` (multiples of one :data:`PAD_BITS` access)."""
    return pad_conv_channels(mod)
