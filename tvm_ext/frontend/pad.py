"""Pad as a Relax operator: the importer's ``call_tir`` pad lifted to ``R.nn.pad``, zero pads
folded into the convolution that reads them.

* :func:`lift_pad` (a :mod:`~tvm_ext.frontend.te_calls` lifter) recognises ``topi.nn.pad`` in
  constant mode, which the ONNX importer emits through ``emit_te``: ``out[v] = if_then_else(
  before <= v < before + extent, data[v - before], value)``. It becomes ``R.nn.pad`` with the
  same widths and value; a pad of width zero everywhere (TF-exported graphs have many) is
  dropped. The condition is checked axis by axis against the widths the indices imply, so only
  a real constant pad is lifted (mirror and edge pads read other positions and stay opaque).
* :class:`FoldPadIntoConv` merges a zero pad of the spatial axes into the ``padding`` of the one
  ``conv2d`` that reads it when the merged padding is symmetric. An asymmetric merge
  (TF "same" padding of a stride-2 convolution pads one row and column after) is not done: a
  convolution with asymmetric padding cannot be an implicit-GEMM library kernel (CUTLASS), while
  the separate ``R.nn.pad`` fuses into its producer.
"""
from __future__ import annotations

import logging

import tvm
from tvm import relax, tirx

from .te_calls import SingleStore, int_shape

logger = logging.getLogger(__name__)

_IF_THEN_ELSE = "prim.if_then_else"


def _offset(index, axis) -> int | None:
    """``c`` when ``index`` is ``axis - c`` (or ``axis + -c``, or ``axis`` with c = 0)."""
    if index.same_as(axis):
        return 0
    if isinstance(index, tirx.Sub) and index.a.same_as(axis) and isinstance(index.b, tirx.IntImm):
        return int(index.b.value)
    if isinstance(index, tirx.Add) and index.a.same_as(axis) and isinstance(index.b, tirx.IntImm):
        return -int(index.b.value)
    return None


def _bounds(cond, axes: tuple) -> dict[int, list[int | None]] | None:
    """Per axis ``[lo, hi)`` of a conjunction of comparisons between axes and constants
    (None when the condition has any other form)."""
    terms, out = [cond], {}
    while terms:
        term = terms.pop()
        if isinstance(term, tirx.And):
            terms += [term.a, term.b]
            continue
        if not isinstance(term, (tirx.LT, tirx.LE, tirx.GT, tirx.GE)):
            return None
        a, b, kind = term.a, term.b, type(term)
        if isinstance(a, tirx.IntImm):   # c < v  is  v > c
            a, b = b, a
            kind = {tirx.LT: tirx.GT, tirx.LE: tirx.GE, tirx.GT: tirx.LT, tirx.GE: tirx.LE}[kind]
        axis = next((i for i, ax in enumerate(axes) if a.same_as(ax)), None)
        if axis is None or not isinstance(b, tirx.IntImm):
            return None
        c = int(b.value)
        lo, hi = out.setdefault(axis, [None, None])
        if kind in (tirx.GE, tirx.GT):
            bound = c if kind is tirx.GE else c + 1
            out[axis][0] = bound if lo is None else max(lo, bound)
        else:
            bound = c if kind is tirx.LT else c + 1
            out[axis][1] = bound if hi is None else min(hi, bound)
    return out


def _pad_widths(compute: SingleStore) -> tuple[list[int], float] | None:
    """``([before_0, after_0, ...], value)`` of a constant pad, or None."""
    if len(compute.inputs) != 1:
        return None
    in_shape, out_shape = int_shape(compute.inputs[0]), int_shape(compute.output)
    if in_shape is None or out_shape is None or len(in_shape) != len(out_shape):
        return None
    value = compute.value
    if compute.is_elementwise_load(value):
        return ([0] * (2 * len(in_shape)), 0.0) if in_shape == out_shape else None
    if not (isinstance(value, tvm.ir.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == _IF_THEN_ELSE):
        return None
    cond, load, fill = value.args
    if not (isinstance(load, tvm.ir.TensorLoad) and compute.input_index(load) == 0
            and isinstance(fill, (tirx.FloatImm, tirx.IntImm)) and len(load.indices) == len(compute.axes)):
        return None
    before = [_offset(i, ax) for i, ax in zip(load.indices, compute.axes)]
    bounds = _bounds(cond, compute.axes)
    if bounds is None or any(b is None or b < 0 for b in before):
        return None
    widths = []
    for k, (b, n_in, n_out) in enumerate(zip(before, in_shape, out_shape)):
        after = n_out - n_in - b
        lo, hi = bounds.get(k, [None, None])
        inside = (max(lo if lo is not None else 0, 0), min(hi if hi is not None else n_out, n_out))
        if after < 0 or inside != (b, b + n_in):
            return None
        widths += [b, after]
    return widths, float(fill.value)


def lift_pad(compute: SingleStore, args: list) -> relax.Expr | None:
    """``R.nn.pad`` for the importer's constant ``topi.nn.pad`` (the input itself for a zero-width
    pad); None for any other computation."""
    found = _pad_widths(compute)
    if found is None:
        return None
    widths, value = found
    if not any(widths):
        return args[0]
    return relax.op.nn.pad(args[0], widths, pad_mode="constant", pad_value=value)


# ----------------------------------------------------------------------------------------
# folding zero pads into convolutions
# ----------------------------------------------------------------------------------------
def _spatial_pad(pad_call: relax.Call, data_layout: str) -> tuple[int, int, int, int] | None:
    """``(top, left, bottom, right)`` of a zero constant pad of only the H and W axes."""
    attrs = pad_call.attrs
    if str(attrs.pad_mode) != "constant" or float(attrs.pad_value) != 0.0:
        return None
    widths = [int(w) for w in attrs.pad_width]
    if len(widths) != 2 * len(data_layout) or set(data_layout) != set("NCHW"):
        return None
    per_axis = {ax: (widths[2 * i], widths[2 * i + 1]) for i, ax in enumerate(data_layout)}
    if per_axis["N"] != (0, 0) or per_axis["C"] != (0, 0):
        return None
    (top, bottom), (left, right) = per_axis["H"], per_axis["W"]
    return top, left, bottom, right


def _with_fields(attrs: tvm.ir.Attrs, **changes) -> tvm.ir.Attrs:
    info = type(attrs).__tvm_ffi_type_info__
    fields = {f.name: getattr(attrs, f.name) for f in info.fields}
    fields.update(changes)
    return tvm.ir.make_node(info.type_key, **fields)


@relax.expr_functor.mutator
class _PadFolder(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.uses: dict = {}
        self.folded = 0

    def count_uses(self, func: relax.Function) -> None:
        uses: dict = {}

        @relax.expr_functor.visitor
        class _Uses(relax.PyExprVisitor):
            def visit_var_(self, var):  # noqa: N802 - visitor API
                uses[var] = uses.get(var, 0) + 1

            def visit_dataflow_var_(self, var):  # noqa: N802 - visitor API
                uses[var] = uses.get(var, 0) + 1

        _Uses().visit_expr(func)
        self.uses = uses

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - visitor API
        original = call
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d"):
            return call
        data = original.args[0]
        if not isinstance(data, relax.Var) or self.uses.get(data, 0) != 1:
            return call
        producer = self.lookup_binding(call.args[0]) if isinstance(call.args[0], relax.Var) else None
        if not (isinstance(producer, relax.Call) and isinstance(producer.op, tvm.ir.Op)
                and producer.op.name == "relax.nn.pad"):
            return call
        extra = _spatial_pad(producer, str(call.attrs.data_layout))
        padding = [int(p) for p in call.attrs.padding]
        if extra is None or len(padding) != 4:
            return call
        merged = [p + e for p, e in zip(padding, extra)]
        if merged[0] != merged[2] or merged[1] != merged[3]:
            return call
        self.folded += 1
        return relax.Call(call.op, [producer.args[0], call.args[1]], _with_fields(call.attrs, padding=merged))


def fold_pad_into_conv(mod: tvm.IRModule) -> tvm.IRModule:
    """Merge each zero spatial ``R.nn.pad`` read only by a ``conv2d`` into its padding when the
    result is symmetric (the pad binding is left for dead-code elimination)."""
    folder = _PadFolder(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            folder.count_uses(func)
            folder.builder_.update_func(gvar, folder.visit_expr(func))
    if not folder.folded:
        return mod
    logger.info("folded %d zero pads into the padding of the convolutions reading them", folder.folded)
    return folder.builder_.get()


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.FoldPadIntoConv")
def FoldPadIntoConv(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:  # noqa: N802
    """Pass form of :func:`fold_pad_into_conv`."""
    return fold_pad_into_conv(mod)


__all__ = ["FoldPadIntoConv", "fold_pad_into_conv", "lift_pad"]
