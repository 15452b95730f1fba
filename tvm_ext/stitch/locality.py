"""Block locality of a producer -> consumer edge, in units of rows (AStitch §4.3, step 3).

Every stitched op is laid out by rows: a group's dominant reduction fixes ``R`` rows (its
results), and an op of the group is *row-aligned* when its leading dimensions multiply to
``R`` (the rest is the row's content). Blocks process whole rows, so a consumer block reads
only what the same block produced exactly when the consumer reads, for its row ``r``, only row
``r`` of the producer: the producer's leading indices, flattened, equal the consumer's row
index. That is the passive check of the paper (contiguous elements produced per block against
those needed per block) with rows as the unit; the proactive adaptation of elementwise groups
is choosing the producer's ``R`` for them when they are row-aligned with it.

Example
-------
>>> row_split((64, 128, 256), 8192)      # T_layer_norm over 64*128 rows
2
>>> reads_same_row(x_sum_op, T_layer_norm_op, 8192)
True
"""
from __future__ import annotations

import tvm
from tvm import tirx

from .ops import StitchOp


def row_split(dims, rows: int) -> int | None:
    """Smallest ``k`` with ``prod(dims[:k]) == rows`` (``None`` if there is none)."""
    acc = 1
    if rows == 1:
        return 0
    for k, d in enumerate(dims, start=1):
        acc *= int(d)
        if acc == rows:
            return k
        if acc > rows:
            return None
    return None


def _flatten(indices, dims):
    expr = None
    for idx, d in zip(indices, dims):
        term = idx if expr is None else expr * tirx.const(int(d), str(idx.ty)) + idx
        expr = term
    return expr


def _cast(expr, dtype: str):
    return expr if str(expr.ty) == dtype else tirx.Cast(dtype, expr)


def reads_same_row(producer: StitchOp, consumer: StitchOp, rows: int) -> bool:
    """Whether ``consumer`` reads, for each of its ``rows`` rows, only the same row of ``producer``.

    Both ops must be row-aligned with ``rows`` (see the module docstring); reads through a
    reduction iterator in the row part, remaps of rows and data-dependent reads fail.
    """
    kp = row_split(producer.shape, rows)
    kc = row_split(consumer.spatial, rows) if consumer.out_vars else None
    if kp is None or kc is None:
        return False
    accesses = consumer.read_indices.get(producer.buffer, ())
    if not accesses:
        return False
    if kp == 0 or kc == 0:
        return rows == 1
    analyzer = tvm.sym.Analyzer()
    for var, extent in zip(consumer.out_vars, consumer.spatial):
        analyzer.bind(var, tvm.ir.Range.from_min_extent(tirx.const(0, str(var.ty)), tirx.const(extent, str(var.ty))))
    for var, (start, extent) in consumer.reduce_vars.items():
        analyzer.bind(var, tvm.ir.Range.from_min_extent(tirx.const(start, str(var.ty)),
                                                        tirx.const(extent, str(var.ty))))
    consumer_row = _flatten(consumer.out_vars[:kc], consumer.spatial[:kc])
    for indices in accesses:
        if len(indices) < kp:
            return False
        produced_row = _flatten([_cast(i, "int64") for i in indices[:kp]], producer.shape[:kp])
        diff = analyzer.simplify(produced_row - _cast(consumer_row, "int64"))
        if not (isinstance(diff, tirx.IntImm) and int(diff.value) == 0):
            return False
    return True


__all__ = ["reads_same_row", "row_split"]
