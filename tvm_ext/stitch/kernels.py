"""Count the GPU kernels of a scheduled module, split into memory-intensive and compute kernels.

Each top-level ``blockIdx`` binding of a scheduled PrimFunc becomes one kernel (that is what
``SplitHostDevice`` does), counted once per ``call_tir`` site of the PrimFunc in the Relax
functions. A kernel is *compute* if one of its blocks is a contraction (a reduction whose
update multiplies two loads that both move with the reduction iterators: matmul, conv) and
its PrimFunc's arithmetic intensity (flops per byte of its parameters) reaches the
:data:`~tvm_ext.graph.DEFAULT_INTENSITY_THRESHOLD` that OpGraph uses; otherwise it is
*memory-intensive* (a matrix-vector product is memory-bound). No GPU and no nvcc are needed.

Example
-------
>>> counts = count_kernels(scheduled_mod)
>>> counts.memory_intensive, counts.compute
(5, 8)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import relax, tirx

from ..tir.grid_sync import is_block_binding


@dataclass(frozen=True)
class KernelCounts:
    """Kernel launches of one forward pass.

    Attributes
    ----------
    memory_intensive, compute : int
        Launches of each kind (call sites x kernels per PrimFunc).
    per_function : dict
        PrimFunc name -> (call sites, memory-intensive kernels, compute kernels) per call.
    """

    memory_intensive: int
    compute: int
    per_function: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """All kernel launches."""
        return self.memory_intensive + self.compute


def _vars(expr) -> set:
    found: set = set()
    tvm_ffi.structural_walk(expr, (tvm.ir.Var, found.add))
    return found


def is_contraction(block) -> bool:
    """Whether ``block`` is a contraction: a reduction whose update multiplies two loads (of any
    buffers, including intermediates such as a padded input) that both move with the reduction
    iterators (matmul, convolution). A sum of squares of one buffer also counts only when the
    two loads differ (``x[k] * w[k]``), so norms and variances are not contractions."""
    red = {iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce}
    if not red:
        return False
    hit = False

    def on_mul(node) -> None:
        nonlocal hit
        a, b = _moving_load(node.a, red), _moving_load(node.b, red)
        if a is None or b is None:
            return
        hit = hit or not tvm_ffi.structural_equal(a, b)

    tvm_ffi.structural_walk(block.body, (tirx.Mul, on_mul))
    return hit


def _moving_load(expr, red: set):
    """The first load in ``expr`` indexed by a reduction iterator (its source and indices), or None."""
    loads: list = []
    tvm_ffi.structural_walk(expr, (tvm.ir.TensorLoad, loads.append))
    for ld in loads:
        if any(_vars(i) & red for i in ld.indices):
            return ld
    return None


def has_contraction(func: tirx.PrimFunc) -> bool:
    """Whether some block of ``func`` is a contraction (see :func:`is_contraction`)."""
    flags: list = []
    tvm_ffi.structural_walk(func.body, (tvm.s_tir.SBlock, lambda b: flags.append(is_contraction(b))))
    return any(flags)


_ARITH = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.FloorDiv, tirx.FloorMod, tirx.Min, tirx.Max)


def _block_flops(block) -> int:
    """Float operations of all instances of ``block``: its iteration domain times the arithmetic
    of its update (independent of how the block is scheduled)."""
    count = 0

    def visit(node) -> None:
        nonlocal count
        if not str(getattr(node, "ty", "")).startswith(("float", "bfloat")):
            return
        if isinstance(node, _ARITH):
            count += 1
        elif isinstance(node, tvm.ir.Call) and isinstance(node.op, tvm.ir.Op) and node.op.name != "tirx.if_then_else":
            count += 1

    stores: list = []
    tvm_ffi.structural_walk(block.body, (tirx.BufferStore, stores.append))
    for st in stores:
        tvm_ffi.structural_walk(st.value, (tvm.ir.Expr, visit))
    volume = 1
    for iv in block.iter_vars:
        volume *= int(iv.dom.extent.value) if isinstance(iv.dom.extent, tirx.IntImm) else 1
    return volume * count


def intensity(func: tirx.PrimFunc) -> float:
    """Flops of one call per byte of the function's parameters (its unfused global traffic)."""
    from ..analysis import element_bytes

    moved = 0
    for p in func.params:
        ty = getattr(p, "ty", None)
        if ty is None or not hasattr(ty, "shape"):
            continue
        n = 1
        for d in ty.shape:
            n *= int(d.value) if isinstance(d, tirx.IntImm) else 1
        moved += n * element_bytes(str(ty.dtype))
    flops: list[int] = []
    tvm_ffi.structural_walk(func.body, (tvm.s_tir.SBlock, lambda b: flops.append(_block_flops(b))))
    return sum(flops) / moved if moved else 0.0


def kernels_of(func: tirx.PrimFunc, threshold: float | None = None) -> list[bool]:
    """One entry per kernel of a scheduled PrimFunc: True for a compute kernel."""
    from ..graph import DEFAULT_INTENSITY_THRESHOLD

    bound = intensity(func) >= (DEFAULT_INTENSITY_THRESHOLD if threshold is None else threshold)
    kernels: list[bool] = []

    def visit(node) -> None:
        if is_block_binding(node):
            flags: list[bool] = []
            tvm_ffi.structural_walk(node.body, (tvm.s_tir.SBlock, lambda b: flags.append(is_contraction(b))))
            kernels.append(any(flags) and bound)
            return
        for child in _children(node):
            visit(child)

    visit(func.body)
    return kernels


def _children(node) -> list:
    if isinstance(node, tirx.SeqStmt):
        return list(node.seq)
    if isinstance(node, tvm.s_tir.SBlockRealize):
        return [node.block.body]
    if isinstance(node, tirx.IfThenElse):
        return [node.then_case] + ([node.else_case] if node.else_case is not None else [])
    body = getattr(node, "body", None)
    return [body] if body is not None else []


def _call_sites(mod: tvm.IRModule) -> dict[str, int]:
    call_tir = tvm.ir.Op.get("relax.call_tir")
    sites: dict[str, int] = {}
    for _, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue

        def visit(expr) -> None:
            if isinstance(expr, relax.Call) and expr.op.same_as(call_tir):
                name = expr.args[0].name_hint
                sites[name] = sites.get(name, 0) + 1

        relax.analysis.post_order_visit(func.body, visit)
    return sites


def count_kernels(mod: tvm.IRModule) -> KernelCounts:
    """Kernel launches of ``mod`` (scheduled: after the schedule stage of a preset)."""
    sites = _call_sites(mod)
    mi = comp = 0
    per: dict[str, tuple[int, int, int]] = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc) or gv.name_hint not in sites:
            continue
        flags = kernels_of(func)
        n = sites[gv.name_hint]
        k_comp = sum(flags)
        k_mi = len(flags) - k_comp
        per[gv.name_hint] = (n, k_mi, k_comp)
        mi += n * k_mi
        comp += n * k_comp
    return KernelCounts(mi, comp, per)


__all__ = ["KernelCounts", "count_kernels", "has_contraction", "intensity", "is_contraction", "kernels_of"]
