"""Tensor-core stages of tile kernels: a contraction inside a tile kernel on WMMA 16x16x16 fragments.

Welder binds the GEMMs of a connected kernel to warps with MMA fragments; this module does that
for one contraction block of a tile kernel with TVM's WMMA tensor intrinsics
(``tvm.s_tir.tensor_intrin.cuda``), after the builder has tiled the kernel and computed the block
per tile (:mod:`tvm_ext.tilegraph.schedule`).

**Which blocks** (:func:`wmma_fit`): ``C[..., i, j] += A[..., i, k] * B[..., k, j]`` (or
``B[..., j, k]``) with float16 operands and a float16 or float32 accumulator (casts to it
allowed); per tile ``i``, ``j`` and ``k`` are multiples of 16 (where extents are not, the
planner pads the contraction: :mod:`~tvm_ext.tilegraph.padding`) and the output tile is one row
(``i`` = 16) or one column (``j`` = 16) of fragments; the two innermost spatial loops
under the tile are ``i`` and ``j`` and the one reduction loop is ``k``. Every other index of
``A``, ``B`` and ``C`` is independent of ``i``, ``j``, ``k`` (batch dimensions). An operand
that is an expression (an elementwise producer inlined into it) does not qualify: the block stays
a one-output-per-thread (SIMT) contraction.

**How** (:func:`schedule_wmma`):

* an operand read from global memory is staged per tile into shared memory, copied by all
  threads of the block (no ``cp.async`` yet): whole, or ``kstep`` rows of the reduction at a time
  where the whole operand does not fit (below); an operand produced in the kernel is already in
  shared memory (shared connection);
* the tile's 16x16 output fragments (batch dimensions included) are spread over the warps
  (``threadIdx.y``); a warp accumulates one fragment at a time over ``k`` in steps of 16 in a
  ``wmma.accumulator`` fragment, loading its ``A`` and ``B`` fragments from shared memory;
* the fragment is stored to the block's buffer: shared memory for an intermediate, global memory
  for the kernel's output.

**Reduction steps** (``kstep``, the plan's choice where the whole operands exceed shared memory,
e.g. a layer norm feeding a 768-wide GEMM in one 16 x 768 tile): the reduction runs in steps of
``kstep``; each step all threads copy the step's rows of the staged operands, and every warp
advances all its fragments, each held in its own accumulator across the steps (a warp takes
neighbouring fragments, so they store as one box). Only for a tile that is one row or column of
fragments without batch dimensions.

``tensorize=False`` builds the same loops without the intrinsics: the program a tensor-core
kernel computes, which the CPU can run thread-serialized (TVM's ``tensorize`` replaces each
16x16 block only after checking that the intrinsic computes the same thing).

Example
-------
>>> fit = wmma_fit(sch, sch.get_sblock("matmul"), tile_loop)
>>> fit.fragments, fit.trans_b, fit.accumulator
(8, True, 'float16')
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import tirx

from ..tir.script_import import import_tensor_intrinsics
from ..tir.workspace import buffer_scope
from .enumerate import MMA_FRAGMENT as FRAGMENT
_RED = tirx.IterVar.CommReduce


@dataclass(frozen=True)
class WmmaFit:
    """How a contraction block maps onto WMMA fragments (see :func:`wmma_fit`).

    Attributes
    ----------
    trans_b : bool
        ``B`` is indexed ``[..., j, k]`` (a column-major fragment).
    accumulator : str
        ``"float16"`` or ``"float32"``: the fragment's accumulation type (the block's output type).
    fragments : int
        16x16 output fragments per tile (batch dimensions included): the block's warp jobs.
    staged_bytes : int
        Shared memory of the operands staged from global memory, per tile (per reduction step).
    kstep : int
        Reduction rows staged at a time (0: the whole reduction of the tile at once).
    depth : int
        The reduction's extent per tile.
    a, b : int
        Buffer positions, in the block's reads, of the ``A`` and ``B`` operands.
    """

    trans_b: bool
    accumulator: str
    fragments: int
    staged_bytes: int
    a: int
    b: int
    kstep: int = 0
    depth: int = 0


class Unfit(str):
    """Why a contraction runs on tensor cores in no tile at all: its body (accumulator type, an
    operand that is not a float16 load, the index layout) is not ``C += A * B`` on fragments. The
    planner counts such a block as a SIMT contraction of every tile of the kernel."""


class Misaligned(str):
    """Why a contraction does not run on tensor cores, where the cause is its extents (no whole
    fragments per tile, a border tile cut, rows not 32-byte aligned): padding it to whole
    fragments (:mod:`~tvm_ext.tilegraph.padding`) may fit it."""


def _load(expr, accumulator: str):
    """The float16 load under ``expr`` (``load`` or ``cast(accumulator, load)``), else None."""
    if isinstance(expr, tirx.Cast) and str(expr.ty.dtype) == accumulator:
        expr = expr.value
    if isinstance(expr, tvm.ir.TensorLoad) and str(expr.source.ty.dtype) == "float16":
        return expr
    return None


def _vars(expr) -> set:
    found: set = set()
    tvm_ffi.structural_walk(expr, (tvm.ir.Var, found.add))
    return found


def _layout(load, first, second) -> bool:
    """``load`` is indexed ``[..., first, second]`` (its last two indices are those iterators)."""
    idx = list(load.indices)
    return len(idx) >= 2 and idx[-2].same_as(first) and idx[-1].same_as(second)


def _operands(block):
    """(store, A load, B load, i var, j var, k var) of ``C = C + A * B``, or a reason string."""
    store = block.body
    if not isinstance(store, tirx.BufferStore):
        return "the block body is not one store"
    acc = str(store.buffer.ty.dtype)
    if acc not in ("float16", "float32"):
        return f"accumulator type {acc}"
    value = store.value
    if not isinstance(value, tirx.Add):
        return "not an accumulation"
    own = [x for x in (value.a, value.b) if isinstance(x, tvm.ir.TensorLoad) and x.source.same_as(store.buffer)]
    product = value.b if own and own[0].same_as(value.a) else value.a
    if not own or not isinstance(product, tirx.Mul):
        return "not C + A * B"
    x, y = _load(product.a, acc), _load(product.b, acc)
    if x is None or y is None:
        return "an operand is not a float16 load (an inlined producer?)"
    reduce = [iv.var for iv in block.iter_vars if iv.iter_type == _RED]
    if len(reduce) != 1 or len(store.indices) < 2:
        return "not one reduction iterator over a matrix output"
    i, j, k = store.indices[-2], store.indices[-1], reduce[0]
    if not all(isinstance(v, tvm.ir.Var) for v in (i, j)):
        return "the output's last two indices are not iterators"
    if _layout(y, i, k) and not _layout(x, i, k):      # A is the operand indexed [..., i, k]
        x, y = y, x
    return store, x, y, i, j, k


def _independent(load, moving: set) -> bool:
    return not any(_vars(e) & moving for e in list(load.indices)[:-2])


def wmma_fit(sch, block, realize, spatial: list, reduce: list, extent, kstep: int = 0) -> WmmaFit | str:
    """How ``block`` (a contraction computed per tile) maps onto WMMA fragments, or why it cannot.

    ``realize`` is its ``SBlockRealize``; ``spatial`` and ``reduce`` are its loops under the tile
    loop; ``extent(loop)`` their extents. ``kstep`` stages operands that many reduction rows at a
    time, where it applies (:func:`stepped_reduction`); else whole.
    """
    stmt = sch.get(block)
    found = _operands(stmt)
    if isinstance(found, str):
        return Unfit(found)
    store, a, b, i, j, k = found
    moving = {i, j, k}
    if not _layout(a, i, k):
        return Unfit("A is not indexed [..., i, k]")
    trans_b = _layout(b, j, k)
    if not (trans_b or _layout(b, k, j)):
        return Unfit("B is not indexed [..., k, j] or [..., j, k]")
    if not (_independent(a, moving) and _independent(b, moving) and not any(_vars(e) & moving
                                                                            for e in list(store.indices)[:-2])):
        return Unfit("a batch index moves with i, j or k")
    if len(reduce) != 1 or len(spatial) < 2:
        return "the tile has not one reduction loop and two matrix loops"
    binding = {iv.var: value for iv, value in zip(realize.block.iter_vars, realize.iter_values)}
    for loop, var in ((spatial[-2], i), (spatial[-1], j), (reduce[0], k)):
        if sch.get(loop).loop_var not in _vars(binding[var]):
            return "the innermost loops under the tile are not i, j and k"
    m, n, depth = extent(spatial[-2]), extent(spatial[-1]), extent(reduce[0])
    if m % FRAGMENT or n % FRAGMENT or depth % FRAGMENT:
        return Misaligned(f"tile {m}x{n}x{depth} is not a multiple of {FRAGMENT}")
    if buffer_scope(store.buffer) == "global" and int(store.buffer.ty.shape[-1]) % FRAGMENT:
        return Misaligned("the output's rows are not 32-byte aligned")
    lead = math.prod(extent(lp) for lp in spatial[:-2])
    if lead * m > FRAGMENT and n > FRAGMENT:
        # fragments are dealt to warps from one fused loop: an operand fragment indexed by only
        # part of it (A by the row, B by the column) is no iterator map TVM can blockize
        return f"tile {lead * m}x{n} is not one row or one column of {FRAGMENT}x{FRAGMENT} fragments"
    from_global = [buffer_scope(load.source) == "global" for load in (a, b)]
    step = stepped_reduction(kstep, depth, lead) if any(from_global) else 0
    rows_k = step or depth
    staged = sum(lead * rows * cols * 2 for glob, rows, cols in zip(from_global, (m, rows_k), (rows_k, n)) if glob)
    reads = [r.source for r in stmt.reads]
    pos_a = next(p for p, buf in enumerate(reads) if buf.same_as(a.source))
    pos_b = next(p for p, buf in enumerate(reads) if buf.same_as(b.source))
    if pos_a == pos_b:
        return Unfit("A and B are the same buffer")
    return WmmaFit(trans_b, str(store.buffer.ty.dtype), lead * (m // FRAGMENT) * (n // FRAGMENT), staged,
                   pos_a, pos_b, step, depth)


def stepped_reduction(kstep: int, depth: int, lead: int = 1) -> int:
    """The reduction step a tensor-core stage of reduction ``depth`` per tile stages its operands
    in, for the plan's ``kstep``: ``kstep`` where it is a multiple of 16 below ``depth`` that
    divides it and the tile has no batch dimensions (``lead`` 1), else 0 (whole).

    Examples
    --------
    >>> stepped_reduction(64, 768), stepped_reduction(64, 64), stepped_reduction(48, 64)
    (64, 0, 0)
    """
    if kstep <= 0 or kstep % FRAGMENT or kstep >= depth or depth % kstep or lead != 1:
        return 0
    return kstep


def _intrinsics(fit: WmmaFit, output_scope: str, dynamic: bool) -> dict[str, str]:
    # Imported here, fast (tvm_ext.tir.script_import): registering TVM's CUDA tensor intrinsics
    # parses ~250 TVMScript functions, which fp32 plans and CPU builds never need.
    wmma_intrin = import_tensor_intrinsics()
    acc = "F16" if fit.accumulator == "float16" else "F32"
    sync = "f16f16f16" if fit.accumulator == "float16" else "f16f16f32"
    trans = "_TRANS" if fit.trans_b else ""
    dyn = "_DYN" if dynamic else ""
    where = "GLOBAL" if output_scope == "global" else f"SHARED{dyn}"
    return {"a": getattr(wmma_intrin, f"WMMA_LOAD_16x16x16_F16_A{dyn}_INTRIN"),
            "b": getattr(wmma_intrin, f"WMMA_LOAD_16x16x16_F16_B{trans}{dyn}_INTRIN"),
            "fill": getattr(wmma_intrin, f"WMMA_FILL_16x16x16_{acc}_INTRIN"),
            "store": getattr(wmma_intrin, f"WMMA_STORE_16x16x16_{acc}_{where}_INTRIN"),
            "sync": getattr(wmma_intrin, f"WMMA_SYNC_16x16x16_{sync}{trans}_INTRIN")}


def schedule_wmma(sch, block, anchor, spatial: list, reduce: list, fit: WmmaFit, *, warps: int,
                  bind_copy: Callable, shared_scope: str = "shared") -> list:
    """Schedule ``block`` (computed per tile under ``anchor``) on WMMA fragments (module docstring).

    ``bind_copy(block, loop)`` spreads a staging copy computed under ``loop`` over the block's
    threads; ``shared_scope`` is the kernel's shared memory (``"shared"``, or ``"shared.dyn"``
    beyond the static limit). ``fit.kstep`` stages the operands in reduction steps.
    Returns its stages and their intrinsics, for :func:`tensorize` once the kernel is scheduled.
    """
    stmt = sch.get(block)
    a_buf, b_buf = stmt.reads[fit.a].source, stmt.reads[fit.b].source
    output_scope = buffer_scope(stmt.writes[0].source)
    *lead, i, j = spatial
    io, ii = sch.split(i, [None, FRAGMENT])
    jo, ji = sch.split(j, [None, FRAGMENT])
    ko, ki = sch.split(reduce[0], [None, FRAGMENT])
    if fit.kstep:
        step, ko = sch.split(ko, [None, fit.kstep // FRAGMENT])
        sch.reorder(*lead, io, jo, step, ko, ii, ji, ki)
        warp_loop, each = sch.split(sch.fuse(*lead, io, jo), [warps, None])    # neighbouring fragments
        sch.reorder(warp_loop, step, each)
        stage_at, accumulate_at = step, warp_loop
    else:
        sch.reorder(*lead, io, jo, ko, ii, ji, ki)
        each, warp_loop = sch.split(sch.fuse(*lead, io, jo), [None, warps])
        sch.reorder(warp_loop, each)
        stage_at, accumulate_at = anchor, each
    sch.bind(warp_loop, "threadIdx.y")

    def position(buf) -> int:
        return next(p for p, r in enumerate(sch.get(block).reads) if r.source.same_as(buf))

    sources = []
    for buf in (a_buf, b_buf):
        if buffer_scope(buf) == "global":
            staged = sch.cache_read(block, position(buf), shared_scope, consumer_blocks=[block])
            sch.compute_at(staged, stage_at)
            bind_copy(staged, stage_at)
            buf = sch.get(staged).writes[0].source
        sources.append(buf)
    frag_a = sch.cache_read(block, position(sources[0]), "wmma.matrix_a", consumer_blocks=[block])
    sch.compute_at(frag_a, ko)
    frag_b = sch.cache_read(block, position(sources[1]), "wmma.matrix_b", consumer_blocks=[block])
    sch.compute_at(frag_b, ko)
    accumulate = sch.cache_write(block, 0, "wmma.accumulator")
    sch.reverse_compute_at(accumulate, accumulate_at)
    if fit.kstep:       # the warp's fragments, stored one 16x16 fragment at a time
        *_, rows, cols = loops_below(sch, accumulate, warp_loop)
        rows_o, rows_i = sch.split(rows, [None, FRAGMENT])
        cols_o, cols_i = sch.split(cols, [None, FRAGMENT])
        sch.reorder(rows_o, cols_o, rows_i, cols_i)
    init = sch.decompose_reduction(block, step if fit.kstep else ko)
    use = _intrinsics(fit, output_scope, dynamic=shared_scope == "shared.dyn")
    return [(frag_a, use["a"]), (frag_b, use["b"]), (init, use["fill"]), (accumulate, use["store"]),
            (block, use["sync"])]


def loops_below(sch, block, loop) -> list | None:
    """The loops of ``block`` nested in ``loop`` (None: ``block`` is not under ``loop``)."""
    loops = list(sch.get_loops(block))
    target = sch.get(loop)
    for k, lp in enumerate(loops):
        if sch.get(lp).same_as(target):
            return loops[k + 1:]
    return None


def tensorize(sch, stages: list) -> None:
    """Replace the 16x16(x16) loops of every stage :func:`schedule_wmma` returned by its WMMA
    intrinsic (after every block of the kernel is scheduled: a tensorized block reads its buffers
    through pointers, and later ``compute_at`` could no longer analyse the scope)."""
    for block, intrinsic in stages:
        loops = sch.get_loops(block)
        if intrinsic.startswith("wmma_sync"):
            sch.tensorize(sch.blockize(loops[-3]), intrinsic)
        else:
            sch.tensorize(loops[-2], intrinsic)


__all__ = ["Misaligned", "Unfit", "WmmaFit", "schedule_wmma", "stepped_reduction", "tensorize", "wmma_fit"]
