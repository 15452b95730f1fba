"""Row-reduction prologues: a softmax-like group stitched into the GEMM that consumes it.

AStitch's regional scheme keeps an intermediate in shared memory when the consumer's thread
block needs only rows that the same block can produce. A GEMM ``C[.., i, j] = sum_k P[.., i, k]
* V[.., k, j]`` has exactly that locality for its row operand ``P``: the block that computes rows
``i0 .. i0+BM`` of ``C`` reads rows ``i0 .. i0+BM`` of ``P`` whole (every ``k``). If ``P`` is the
output of a row-wise group (a softmax: max and sum over ``k``, then elementwise), the block can
compute its rows of ``P`` into shared memory itself and feed the GEMM from there, so the
group's kernel and ``P``'s round trip through global memory disappear (the attention
probabilities in a transformer layer). This module picks such pairs on the OpGraph;
:mod:`tvm_ext.stitch.prologue_schedule` builds the kernel.

A group qualifies when it holds a reduction, has exactly one escaping tensor ``P`` and ``P``
(not a graph output) feeds exactly one node: a single-block contraction that is the head of a
compute group and reads ``P`` with indices ``[spatial.., i, k]`` where ``k`` is its only
reduction iterator and ``P``'s last axis; every reduction of the group reduces the last axis of
a tensor of ``P``'s shape; and ``BM_MIN`` rows of ``P`` fit the shared-memory budget.

Example
-------
>>> softmax = graph.node("lv39").index        # BERT-base, legalized: the attention softmax
>>> graph.nodes[prologue_target(graph, {softmax})].func_name
'matmul2'
>>> [g.kind for g in stitch_scope(graph).groups].count("prologue")     # one per layer
12
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import tirx

from ..analysis import element_bytes
from ..graph import OpClass, OpGraph, TensorKind, sblocks

#: Fewest rows of the operand one block computes (the schedule builder's smallest row tile).
BM_MIN = 4
#: Shared memory the operand rows may take, in bytes (within the 48 KiB every device gives a block).
SHARED_BUDGET = 32 * 1024
#: Widest GEMM output row (``j`` extent) one block computes whole. The block runs a plain
#: thread-per-output GEMM on the shared rows, which pays off for attention's head dimension
#: (64-128) but not against dlight's tiled GEMM on wide layers (a layer norm feeding a
#: 3072-wide MLP stays its own kernel).
MAX_COLUMNS = 256


@dataclass(frozen=True)
class RowOperand:
    """How a contraction reads its row operand ``P``.

    Attributes
    ----------
    rows, row_length : int
        Rows of ``P`` (product of the leading dims) and the reduced axis length ``k``.
    columns : int
        Extent of the contraction's output axes that do not index ``P`` (``j``).
    dtype : str
        Element type of ``P``.
    """

    rows: int
    row_length: int
    columns: int
    dtype: str


def _const_ints(values) -> list[int] | None:
    out = []
    for v in values:
        if not isinstance(v, tirx.IntImm):
            return None
        out.append(int(v.value))
    return out


def row_operand_read(func: tirx.PrimFunc, param_index: int) -> RowOperand | None:
    """How the single contraction block of ``func`` reads parameter ``param_index``, if as a row
    operand (indices ``[spatial.., i, k]``, ``k`` the only reduction iterator), else None."""
    blocks = sblocks(func)
    if param_index >= len(func.params):
        return None
    contractions = [b for b, _ in blocks if any(iv.iter_type == tirx.IterVar.CommReduce for iv in b.iter_vars)]
    if len(contractions) != 1:
        return None
    block = contractions[0]
    red = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if len(red) != 1:
        return None
    param = func.params[param_index]
    loads: list = []
    tvm_ffi.structural_walk(block.body, (tvm.ir.TensorLoad, loads.append))
    mine = [ld for ld in loads if ld.source.same_as(param)]
    if len(mine) != 1 or not all(isinstance(i, tvm.ir.Var) for i in mine[0].indices):
        return None
    indices = list(mine[0].indices)
    if not indices[-1].same_as(red[0].var) or any(i.same_as(red[0].var) for i in indices[:-1]):
        return None
    shape = _const_ints(param.ty.shape)
    extents = {iv.var: iv.dom.extent for iv in block.iter_vars}
    spatial = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    free = [iv for iv in spatial if not any(iv.var.same_as(i) for i in indices)]
    cols = _const_ints([extents[iv.var] for iv in free])
    if shape is None or cols is None or len(shape) < 2:
        return None
    return RowOperand(math.prod(shape[:-1]), shape[-1], math.prod(cols), str(param.ty.dtype))


def _reduces_last_axis(func: tirx.PrimFunc, shape: tuple[int, ...]) -> bool:
    """Every reduction block of ``func`` reduces over one iterator that indexes only the last
    axis of loads from tensors of ``shape``."""
    for block, _ in sblocks(func):
        red = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
        if not red:
            continue
        if len(red) != 1:
            return False
        loads: list = []
        tvm_ffi.structural_walk(block.body, (tvm.ir.TensorLoad, loads.append))
        reading = [ld for ld in loads if any(_uses(i, red[0].var) for i in ld.indices)]
        if not reading:
            return False
        for ld in reading:
            dims = _const_ints(ld.source.ty.shape)
            if dims is None or tuple(dims) != tuple(shape) or not ld.indices[-1].same_as(red[0].var):
                return False
    return True


def _uses(expr, var) -> bool:
    found: list = []
    tvm_ffi.structural_walk(expr, (tvm.ir.Var, lambda v: found.append(v) if v.same_as(var) else None))
    return bool(found)


def prologue_target(graph: OpGraph, members: set[int]) -> int | None:
    """The contraction node a row-reduction group ``members`` can be stitched into, or None
    (conditions in the module docstring)."""
    if not any(graph.nodes[m].op_class == OpClass.REDUCE for m in members):
        return None
    _, escaping = graph.boundary(members)
    if len(escaping) != 1:
        return None
    tensor = graph.tensors[escaping[0]]
    if tensor.kind == TensorKind.OUTPUT or len(set(tensor.consumers)) != 1:
        return None
    consumer = graph.nodes[tensor.consumers[0]]
    func = consumer.func
    if func is None or len(func.params) != len(consumer.inputs) + len(consumer.outputs):
        return None
    slots = [k for k, t in enumerate(consumer.inputs) if t == escaping[0]]
    if len(slots) != 1:
        return None
    read = row_operand_read(func, slots[0])
    if read is None or read.columns > MAX_COLUMNS:
        return None
    if BM_MIN * read.row_length * element_bytes(read.dtype) > SHARED_BUDGET:
        return None
    shape = tuple(tensor.shape)
    for m in members:
        node = graph.nodes[m]
        if node.func is None or not _reduces_last_axis(node.func, shape):
            return None
    return consumer.index


__all__ = ["BM_MIN", "MAX_COLUMNS", "RowOperand", "SHARED_BUDGET", "prologue_target", "row_operand_read"]
