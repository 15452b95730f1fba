"""Layout rules (``FRelaxInferLayout``) for Relax operators TVM 0.27 ships without one.

``relax.transform.ConvertLayout`` asks each operator's ``FRelaxInferLayout`` attribute which
layout its inputs should have and which its output gets; an operator without one is given its
inputs in the original layout, so a converted tensor is transposed back before it and the
result transposed again after it. :func:`register_layout_rules` registers, once per process:

* ``relax.nn.pad``: the pad follows its input's layout; the widths are permuted to the new
  axis order (``NCHW`` widths ``[n0, n1, c0, c1, h0, h1, w0, w1]`` become
  ``[n0, n1, h0, h1, w0, w1, c0, c1]`` for an NHWC input). Inputs whose layout is not a plain
  permutation (a split axis such as ``NCHW4c``) or whose rank is unknown keep the original layout.

:func:`keep_spatial_reductions_nchw` (a context manager) replaces, only while it is active, the
rule of global pools over H and W (``mean``/``sum``/``max``/``min`` over the last two axes of an
NCHW tensor) with one that keeps their input NCHW; outside it TVM's own rule runs unchanged.

Layouts are written as ConvertLayout writes them: a permutation of the initial layout
``"ABCD..."`` (an NCHW tensor converted to NHWC has layout ``"ACDB"``).
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import string

import tvm
import tvm.s_tir
from tvm import relax

logger = logging.getLogger(__name__)

_ATTR = "FRelaxInferLayout"


def _decision(name: str):
    return tvm.ir.make_node("relax.transform.LayoutDecision", layout=tvm.s_tir.slayout(name),
                            is_unknown_dim=False)


def _input_layout(var_layout_map, arg: relax.Expr, ndim: int) -> str:
    """The layout of ``arg`` as a permutation of ``"ABCD..."[:ndim]`` (the initial layout when it
    is not a plain permutation or is not recorded)."""
    initial = string.ascii_uppercase[:ndim]
    decision = var_layout_map.get(arg) if isinstance(arg, relax.Var) else None
    layout = getattr(decision, "layout", None)
    if layout is None or getattr(decision, "is_unknown_dim", False):
        return initial
    name = str(layout.name)
    return name if sorted(name) == list(initial) else initial


def infer_layout_pad(call: relax.Call, _desired_layouts, var_layout_map):
    """``FRelaxInferLayout`` of ``relax.nn.pad`` (see the module docstring)."""
    data = call.args[0]
    ndim = int(data.ty.ndim)
    layout = _input_layout(var_layout_map, data, ndim)
    widths = [int(w) for w in call.attrs.pad_width]
    permuted = [w for axis in layout for w in widths[2 * (ord(axis) - ord("A")): 2 * (ord(axis) - ord("A")) + 2]]
    info = type(call.attrs).__tvm_ffi_type_info__
    fields = {f.name: getattr(call.attrs, f.name) for f in info.fields}
    fields["pad_width"] = permuted
    decision = _decision(layout)
    return tvm.ir.make_node("relax.transform.InferLayoutOutput", input_layouts=[decision],
                            output_layouts=[decision], new_attrs=tvm.ir.make_node(info.type_key, **fields),
                            new_args={})


#: The rules this module provides, by operator.
RULES = {"relax.nn.pad": infer_layout_pad}

#: Reductions :func:`keep_spatial_reductions_nchw` keeps in the original layout.
SPATIAL_REDUCTIONS = ("relax.mean", "relax.sum", "relax.max", "relax.min")
_KEEP_NCHW = contextvars.ContextVar("tvm_ext_keep_spatial_reductions_nchw", default=False)
_ORIGINAL: dict = {}


def _reduces_all_but_two(call: relax.Call) -> bool:
    """A reduction of a 4-D tensor over its two last axes (a global pool over H and W in NCHW)."""
    ndim = int(call.args[0].ty.ndim)
    axes = call.attrs.axis
    return ndim == 4 and axes is not None and sorted(int(a) % 4 for a in axes) == [2, 3]


def _spatial_reduction_rule(original):
    def rule(call, desired_layouts, var_layout_map):
        if not (_KEEP_NCHW.get() and _reduces_all_but_two(call)):
            return original(call, desired_layouts, var_layout_map)
        initial = _decision(string.ascii_uppercase[:4])
        out_ndim = int(call.ty.ndim) if isinstance(call.ty, relax.TensorType) else 4
        return tvm.ir.make_node("relax.transform.InferLayoutOutput", input_layouts=[initial],
                                output_layouts=[_decision(string.ascii_uppercase[:out_ndim])],
                                new_attrs=call.attrs, new_args={})
    return rule


@contextlib.contextmanager
def keep_spatial_reductions_nchw():
    """While active, ``ConvertLayout`` gives a global pool over H and W (``mean``/``sum``/``max``/``min``
    over the last two axes of an NCHW tensor) its input in NCHW: TVM schedules such a reduction
    over the contiguous innermost axes, and over strided ones in NHWC (NAFNet's full-resolution
    channel attention: modelled 310 us per call instead of 12 us in the cutlass preset)."""
    for name in SPATIAL_REDUCTIONS:
        if name not in _ORIGINAL:
            original = tvm.ir.Op.get(name).get_attr(_ATTR)
            _ORIGINAL[name] = original
            tvm.ir.register_op_attr(name, _ATTR, _spatial_reduction_rule(original), level=11)
    token = _KEEP_NCHW.set(True)
    try:
        yield
    finally:
        _KEEP_NCHW.reset(token)


def register_layout_rules() -> list[str]:
    """Register :data:`RULES` for operators that have no layout rule yet; returns the operators
    registered now (empty when already done, or when TVM has its own rule)."""
    added = []
    for name, rule in RULES.items():
        op = tvm.ir.Op.get(name)
        if op.get_attr(_ATTR) is None:
            tvm.ir.register_op_attr(name, _ATTR, rule)
            added.append(name)
    if added:
        logger.debug("registered layout rules for %s", ", ".join(added))
    return added


__all__ = ["RULES", "SPATIAL_REDUCTIONS", "infer_layout_pad", "keep_spatial_reductions_nchw", "register_layout_rules"]
