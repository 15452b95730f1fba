"""Horizontal transform on tensor expressions (SOUFFLE §6.1, Fig. 3): independent TEs as one TE.

When the independent TEs do not share an operand that a concatenated GEMM could read
(:mod:`.horizontal` covers that case at the Relax level), their outputs are stacked along one
axis and each output element selects its TE by a range predicate on that axis, with the index
shifted by the TE's offset. Fig. 3 stacks a (4, 16) and a (2, 16) GEMM into (6, 16) and reads
``A2[i, rk]`` for rows 4 and 5: the offset is missing, the rows must read ``A2[i - 4, rk]``.
Reductions must agree on the reduction extents and the combiner; they then share one reduction
axis, as in the figure. The predicate selects the whole reduction source (``if_then_else(i < 4,
A1[i, rk] * B1[rk, j], A2[i - 4, rk] * B2[rk, j])``), which is the figure's per-load selection
with the product moved inside. This is a building block of the merged multi-stage kernel
(issue 14 item 5); the driver does not use it yet.

Example
-------
>>> C = stack_computes([C1, C2], axis=0)          # (4, 16) + (2, 16) -> (6, 16)
>>> te.create_prim_func([A1, B1, A2, B2, C])
"""
from __future__ import annotations

from typing import Sequence

import tvm
import tvm_ffi
from tvm import te, tirx


def _body(tensor: te.Tensor):
    op = tensor.op
    if not isinstance(op, te.ComputeOp) or len(op.body) != 1:
        raise ValueError(f"'{op.name}' is not a single-output compute TE")
    return op.body[0]


def _substitute(expr, binding: dict):
    return tvm_ffi.structural_map(expr, (tvm.ir.Var, lambda v: binding.get(v, v)))


def _check(tensors: Sequence[te.Tensor], axis: int) -> None:
    first = tensors[0]
    rank = len(first.shape)
    if not 0 <= axis < rank:
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    for t in tensors[1:]:
        if len(t.shape) != rank or t.dtype != first.dtype:
            raise ValueError(f"'{t.op.name}' {list(t.shape)} {t.dtype} cannot stack with "
                             f"'{first.op.name}' {list(first.shape)} {first.dtype}")
        if any(int(a) != int(b) for d, (a, b) in enumerate(zip(t.shape, first.shape)) if d != axis):
            raise ValueError(f"'{t.op.name}' {list(t.shape)} and '{first.op.name}' {list(first.shape)} differ "
                             f"outside axis {axis}")
    reduces = [isinstance(_body(t), tirx.Reduce) for t in tensors]
    if any(reduces) and not all(reduces):
        raise ValueError("cannot stack a reduction with a non-reduction TE")
    if all(reduces):
        extents = {tuple(int(r.dom.extent) for r in t.op.reduce_axis) for t in tensors}
        if len(extents) != 1:
            raise ValueError(f"reduction extents differ: {sorted(extents)}")
        combiners = [_body(t).combiner for t in tensors]
        if not all(tvm_ffi.structural_equal(c, combiners[0], map_free_vars=True) for c in combiners[1:]):
            raise ValueError("reductions use different combiners")


def stack_computes(tensors: Sequence[te.Tensor], axis: int = 0, name: str = "horizontal") -> te.Tensor:
    """One TE whose output is the outputs of ``tensors`` stacked along ``axis``.

    Parameters
    ----------
    tensors : sequence of te.Tensor
        Outputs of independent single-output compute TEs: same rank and dtype, same extents
        outside ``axis``; reductions need equal reduction extents and the same combiner.
    axis : int
        The axis to stack along.
    name : str
        Name of the new TE.

    Raises
    ------
    ValueError
        When the TEs cannot be stacked (the caller leaves them as they are).
    """
    tensors = list(tensors)
    _check(tensors, axis)
    offsets, total = [], 0
    for t in tensors:
        offsets.append(total)
        total += int(t.shape[axis])
    shape = [int(d) for d in tensors[0].shape]
    shape[axis] = total
    first = _body(tensors[0])
    is_reduce = isinstance(first, tirx.Reduce)
    shared = [te.reduce_axis((0, int(r.dom.extent)), name=f"rk{k}") for k, r in enumerate(tensors[0].op.reduce_axis)]

    def source(t: te.Tensor, offset: int, idx: Sequence) -> tirx.PrimExpr:
        binding = {iv.var: (i - offset if d == axis and offset else i) for d, (iv, i) in enumerate(zip(t.op.axis, idx))}
        body = _body(t)
        if not is_reduce:
            return _substitute(body, binding)
        binding.update({r.var: s.var for r, s in zip(t.op.reduce_axis, shared)})
        if not (isinstance(body.condition, tirx.IntImm) and int(body.condition.value) == 1):
            raise ValueError(f"'{t.op.name}' has a reduction condition")
        return _substitute(body.source[body.value_index], binding)

    def fcompute(*idx):
        expr = source(tensors[-1], offsets[-1], idx)
        for t, offset, end in reversed(list(zip(tensors[:-1], offsets[:-1], offsets[1:]))):
            expr = tirx.if_then_else(idx[axis] < end, source(t, offset, idx), expr)
        if not is_reduce:
            return expr
        return tirx.Reduce(first.combiner, [expr], shared, tirx.const(True, "bool"), 0, first.init)

    return te.compute(shape, fcompute, name=name)


__all__ = ["stack_computes"]
