"""``SplitToSlices``: a ``split`` whose parts are only read one by one becomes one slice per part.

A ``split`` is one multi-output kernel between its producer and its readers (GPT-2 splits the
fused QKV projection into q, k and v: one memory-intensive kernel per layer, three launches
under dlight's fallback). Written as independent ``strided_slice`` calls, each part is a
single-input, single-output layout node that a fusing generator can put into the kernel that
reads it: the stitch scope gives it to the GEMM that reads it (a layout prologue the GEMM's
schedule reads through), and the tile graph connects it to its reader like any injective node.
A part nobody reads is not computed at all.

Not part of the canonical form (:mod:`~tvm_ext.frontend.canonicalize`): a generator that fuses
slices into their readers asks for it (``prepare_passes``), so presets without one keep TVM's
own split.

Only splits whose tuple is used exclusively through ``TupleGetItem`` with a constant index
are rewritten, with static extents along the split axis; anything else is left as it is.

Example
-------
>>> mod = SplitToSlices()(mod)        # before legalization
"""
from __future__ import annotations

import tvm
from tvm import relax

from ..ir_update import reference_counts, with_functions

_SPLIT = tvm.ir.Op.get("relax.split")


def _is_split(value) -> bool:
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.same_as(_SPLIT)


def _bounds(call: relax.Call) -> list[tuple[int, int]] | None:
    """``(begin, end)`` of every part along the split axis, or None when not static."""
    ty = call.args[0].ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = ty.shape.values
    axis = int(call.attrs.axis) % len(dims)
    if not isinstance(dims[axis], tvm.tirx.IntImm):
        return None
    extent = int(dims[axis].value)
    spec = call.attrs.indices_or_sections
    if isinstance(spec, tvm.tirx.IntImm):
        sections = int(spec.value)
        if sections <= 0 or extent % sections:
            return None
        step = extent // sections
        cuts = [step * k for k in range(1, sections)]
    else:
        if not all(isinstance(i, tvm.tirx.IntImm) for i in spec):
            return None
        cuts = [int(i.value) for i in spec]
    edges = [0] + [min(max(c, 0), extent) for c in cuts] + [extent]
    return list(zip(edges[:-1], edges[1:]))


def _tuple_uses(func: relax.Function) -> dict:
    """Per variable: its references as the tuple of a TupleGetItem."""
    items: dict = {}

    def visit(expr) -> None:
        if isinstance(expr, relax.TupleGetItem) and isinstance(expr.tuple_value, relax.Var):
            items[expr.tuple_value] = items.get(expr.tuple_value, 0) + 1

    relax.analysis.post_order_visit(func.body, visit)
    return items


def split_to_slices(func: relax.Function) -> relax.Function:
    """Rewrite the eligible splits of ``func`` (see the module docstring)."""
    if not isinstance(func.body, relax.SeqExpr):
        return func
    refs, items = reference_counts(func), _tuple_uses(func)
    splits: dict = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            if isinstance(binding, relax.VarBinding) and _is_split(binding.value):
                bounds = _bounds(binding.value)
                var = binding.var
                if bounds is not None and refs.get(var, 0) == items.get(var, 0) > 0:
                    splits[var] = (binding.value, bounds)
    if not splits:
        return func
    bb = relax.BlockBuilder()
    blocks = []
    for block in func.body.blocks:
        bindings = []
        for binding in block.bindings:
            if binding.var in splits:
                continue
            value = binding.value
            if isinstance(value, relax.TupleGetItem) and value.tuple_value in splits:
                call, bounds = splits[value.tuple_value]
                begin, end = bounds[int(value.index)]
                axis = int(call.attrs.axis) % len(call.args[0].ty.shape.values)
                value = bb.normalize(relax.op.strided_slice(call.args[0], axes=[axis], begin=[begin], end=[end]))
                binding = relax.VarBinding(binding.var, value)
            bindings.append(binding)
        blocks.append(relax.DataflowBlock(bindings) if isinstance(block, relax.DataflowBlock)
                      else relax.BindingBlock(bindings))
    return bb.normalize(relax.Function(list(func.params), relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                                       func.is_pure, func.attrs))


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.SplitToSlices")
class SplitToSlices:
    """Relax pass form of :func:`split_to_slices`, on every Relax function of the module."""

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:  # noqa: D102 - pass protocol
        updates = {gv: split_to_slices(f) for gv, f in mod.functions_items() if isinstance(f, relax.Function)}
        updates = {gv: f for gv, f in updates.items() if not f.same_as(mod[gv])}
        return with_functions(mod, updates)


__all__ = ["SplitToSlices", "split_to_slices"]
