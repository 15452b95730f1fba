"""Per-PrimFunc facts: operator class and floating-point work.

The class is read from the PrimFunc's blocks rather than from TVM's op-pattern attribute
alone, because TVM marks matmul, softmax and layer-norm all as ``kOutEWiseFusable``
while the techniques must treat a contraction very differently from a row reduction.
"""
from __future__ import annotations

import enum
import functools
from functools import reduce as _fold
from collections.abc import Iterable
from operator import mul

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlock, SBlockRealize

#: TVM's ``relay::OpPatternKind`` values as written by ``AnnotateTIROpPattern``.
PATTERN_NAMES = {
    0: "elemwise",
    1: "broadcast",
    2: "injective",
    3: "comm_reduce",
    4: "out_ewise_fusable",
    7: "tuple",
    8: "opaque",
}


class OpClass(str, enum.Enum):
    """Our operator classes (AStitch / SOUFFLE vocabulary)."""

    ELEMENTWISE = "elementwise"
    BROADCAST = "broadcast"
    INJECTIVE = "injective"
    REDUCE = "reduce"
    COMPUTE = "compute"  # contraction: matmul, conv, ...
    OPAQUE = "opaque"

    @property
    def is_memory_class(self) -> bool:
        """Whether the class is memory-intensive by nature (everything but compute/opaque)."""
        return self not in (OpClass.COMPUTE, OpClass.OPAQUE)


_ARITH_NODES = (
    tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Mod, tirx.FloorDiv, tirx.FloorMod,
    tirx.Min, tirx.Max,
)


def sblocks(func: tirx.PrimFunc) -> list[tuple[SBlock, list[tirx.For]]]:
    """All non-root blocks of ``func`` with their enclosing loops, in program order (remembered
    for the functions seen last: planning asks for the same functions' blocks again and again)."""
    return list(_sblocks(func))


@functools.lru_cache(maxsize=4096)
def _sblocks(func: tirx.PrimFunc) -> tuple[tuple[SBlock, list[tirx.For]], ...]:
    found: list[tuple[SBlock, list[tirx.For]]] = []

    def visit(node, loops: list[tirx.For]) -> None:
        if isinstance(node, tirx.For):
            visit(node.body, loops + [node])
        elif isinstance(node, SBlockRealize):
            block = node.block
            if block.name_hint != "root":
                found.append((block, loops))
            visit(block.body, loops)
        elif isinstance(node, tirx.SeqStmt):
            for stmt in node.seq:
                visit(stmt, loops)
        elif isinstance(node, tirx.Bind):
            return  # 0.27's LetStmt is ``Bind``: no body, the binding scopes over later statements
        elif hasattr(node, "body"):  # AttrStmt, While, AssertStmt, ...
            visit(node.body, loops)
        elif isinstance(node, tirx.IfThenElse):
            visit(node.then_case, loops)
            if node.else_case is not None:
                visit(node.else_case, loops)

    visit(func.body, [])
    return tuple(found)


def _extent(loop: tirx.For) -> int:
    ext = loop.extent
    return int(ext.value) if isinstance(ext, tirx.IntImm) else 1


def _arith_count(expr) -> int:
    """Number of arithmetic operations in ``expr`` (calls such as exp count as one)."""
    count = 0

    def visit(node) -> None:
        nonlocal count
        if not str(getattr(node, "ty", "")).startswith(("float", "bfloat")):
            return  # index arithmetic is not floating-point work
        if isinstance(node, _ARITH_NODES):
            count += 1
        elif isinstance(node, tvm.ir.Call) and isinstance(node.op, tvm.ir.Op):
            if node.op.name.startswith("tirx.") and node.op.name not in ("tirx.if_then_else",):
                count += 1

    tvm_ffi.structural_walk(expr, (tvm.ir.Expr, visit))
    return count


def _block_store(block: SBlock) -> tirx.BufferStore | None:
    stores: list[tirx.BufferStore] = []
    tvm_ffi.structural_walk(block.body, (tirx.BufferStore, stores.append))
    return stores[0] if len(stores) == 1 else None


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def block_float_work(func: tirx.PrimFunc) -> list[tuple[str, int]]:
    """``(dtype, flops)`` of each block of ``func`` that stores one floating-point value per
    iteration, in program order (arith ops x iteration volume)."""
    work: list[tuple[str, int]] = []
    for block, loops in sblocks(func):
        store = _block_store(block)
        if store is None or not _is_float(str(store.buffer.ty.dtype)):
            continue
        volume = _fold(mul, (_extent(loop) for loop in loops), 1)
        work.append((str(store.buffer.ty.dtype), volume * _arith_count(store.value)))
    return work


def func_flops(func: tirx.PrimFunc) -> int:
    """Floating-point operations of one call of ``func`` (arith ops x iteration volume)."""
    return sum(flops for _, flops in block_float_work(func))


def weighted_dtype(work: Iterable[tuple[str, int]]) -> str:
    """The floating-point dtype carrying the most flops in ``work`` (``(dtype, flops)`` pairs in
    program order, each weighing at least one): the dtype a kernel's arithmetic is priced in, by
    the selection (over graph nodes) and by the report (over a built function's blocks) alike.
    A tie goes to the later dtype (the one nearer the output); ``float32`` when none is floating."""
    weight: dict[str, int] = {}
    last: dict[str, int] = {}
    for position, (dtype, flops) in enumerate(work):
        if _is_float(dtype):
            weight[dtype] = weight.get(dtype, 0) + max(int(flops), 1)
            last[dtype] = position
    return max(weight, key=lambda d: (weight[d], last[d])) if weight else "float32"


def _reduce_vars(block: SBlock) -> set:
    return {iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce}


def is_reduction(block: SBlock) -> bool:
    """Whether ``block`` has a reduction iterator (a contraction, a row sum or max, ...)."""
    return bool(_reduce_vars(block))


def _moving_load(expr, reduce_vars: set, accumulator) -> tvm.ir.TensorLoad | None:
    """The first load in ``expr`` (not of ``accumulator``) indexed by a reduction iterator, or None."""
    loads: list = []
    tvm_ffi.structural_walk(expr, (tvm.ir.TensorLoad, loads.append))
    for load in loads:
        if load.source.same_as(accumulator):
            continue
        used: set = set()
        for index in load.indices:
            tvm_ffi.structural_walk(index, (tvm.ir.Var, used.add))
        if used & reduce_vars:
            return load
    return None


def is_contraction(block: SBlock) -> bool:
    """Whether ``block`` is a contraction (matmul, convolution): a reduction whose update
    multiplies two loads that both move with the reduction iterators and are not the same load.

    The loads may read parameters or the function's own intermediates (a padded conv2d reads its
    ``pad_temp`` buffer), but not the accumulator. ``x[k] * x[k]`` (a sum of squares: norms,
    variances) is not a contraction; ``x[i, k] * x[j, k]`` is.
    """
    rvars = _reduce_vars(block)
    store = _block_store(block)
    if not rvars or store is None:
        return False
    hit = False

    def visit(node) -> None:
        nonlocal hit
        a = _moving_load(node.a, rvars, store.buffer)
        b = _moving_load(node.b, rvars, store.buffer)
        if a is not None and b is not None and not tvm_ffi.structural_equal(a, b):
            hit = True

    tvm_ffi.structural_walk(store.value, (tirx.Mul, visit))
    return hit


def has_contraction(func: tirx.PrimFunc) -> bool:
    """Whether some block of ``func`` is a contraction (see :func:`is_contraction`)."""
    return any(is_contraction(block) for block, _ in sblocks(func))


def _broadcasts(block: SBlock, params: set) -> bool:
    """Whether some parameter is read without a (non-unit) iterator the store is indexed by.

    ``AnnotateTIROpPattern`` marks a bias add ``out[i, j] = x[i, j] + b[j]`` as elementwise;
    for stitching it is a broadcast (each ``b[j]`` feeds a whole column). Scalar operands
    (read at constant indices) do not count.
    """
    store = _block_store(block)
    if store is None:
        return False
    extents = {iv.var: iv.dom.extent for iv in block.iter_vars}
    stored: set = set()
    for idx in store.indices:
        tvm_ffi.structural_walk(idx, (tvm.ir.Var, stored.add))
    wide = {v for v in stored if not (isinstance(extents.get(v), tirx.IntImm) and extents[v].value == 1)}
    loads: list = []
    tvm_ffi.structural_walk(store.value, (tvm.ir.TensorLoad, loads.append))
    for load in loads:
        if load.source not in params:
            continue
        used: set = set()
        for idx in load.indices:
            tvm_ffi.structural_walk(idx, (tvm.ir.Var, used.add))
        if used and wide - used:  # a scalar operand (no iterator at all) stays elementwise
            return True
    return False


def classify(func: tirx.PrimFunc | None, pattern: int | None) -> OpClass:
    """Our class of a PrimFunc (``None`` means an external/opaque call)."""
    if func is None or pattern == 8:
        return OpClass.OPAQUE
    params = set(func.params)
    blocks = sblocks(func)
    if any(is_contraction(block) for block, _ in blocks):
        return OpClass.COMPUTE
    if any(_reduce_vars(block) for block, _ in blocks):
        return OpClass.REDUCE
    if pattern in (0, 1):
        if any(_broadcasts(block, params) for block, _ in blocks):
            return OpClass.BROADCAST
        return OpClass.ELEMENTWISE if pattern == 0 else OpClass.INJECTIVE
    if pattern in (2, 7):
        return OpClass.INJECTIVE
    if pattern in (3, 4):
        return OpClass.REDUCE
    return OpClass.OPAQUE
