"""Schedule builder for a GEMM with a row-reduction prologue (see :mod:`tvm_ext.stitch.prologue`).

The fused PrimFunc holds the prologue blocks (a softmax: max, exp, sum, normalize; casts), one
contraction ``C[.., i, j] = sum_k P[.., i, k] * V[.., k, j]`` and its epilogue (layout blocks).
One kernel, ``s_tir.Schedule`` primitives only:

* elementwise prologue blocks other than ``P``'s producer are inlined into their consumers
  (``exp`` is recomputed by the sum and the normalization), layout blocks on ``V`` into ``C``;
  ``C`` accumulates in a register (``cache_write``); the epilogue's blocks but the last are inlined
  into their consumers (a value read twice, as in GELU, is recomputed) and the last into the
  write-back (``reverse_compute_inline``), so the output is written once, in its final layout;
* ``C``'s loops are ordered ``[rows.., columns.., k]``; the last row axis is split by the row
  tile ``BM``; the leading row axes and the tile index form ``blockIdx.x``; the tile's
  ``BM x N`` outputs are spread over ``threadIdx.y x threadIdx.x`` (``k`` serial);
* ``P`` is computed at the block loop into **shared memory** (regional scheme): ``BM`` rows,
  rows on ``threadIdx.y``, the row on ``threadIdx.x``; the row reductions are computed at
  ``P``'s row loop in **registers**, as cross-thread (warp) reductions over ``k``.

Example
-------
>>> tiles = plan_prologue_tiles(func, load_device("h100"))
>>> scheduled = build_prologue_schedule(func, tiles)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import tirx

from ..analysis import element_bytes
from ..errors import TVM_ERRORS
from ..graph import is_reduction, sblocks
from ..hardware import DeviceSpec
from ..graph import is_contraction
from .prologue import MAX_COLUMNS, SHARED_BUDGET
from .schedule import StitchScheduleError, zero_unit_bindings

#: Rows per block the builder tries, largest first.
ROW_TILES = (32, 16, 8, 4)
#: Warps per block (one row of the tile per warp at a time).
THREADS_Y = 4


@dataclass(frozen=True)
class PrologueTiles:
    """Tile sizes of a GEMM-with-prologue kernel.

    Attributes
    ----------
    rows_per_block : int
        ``BM``: rows of ``P`` (and of the output) one block computes.
    threads_y, threads_x : int
        Block shape.
    grid : int
        Blocks in the launch.
    shared_bytes : int
        Shared memory of the ``P`` tile.
    """

    rows_per_block: int
    threads_y: int
    threads_x: int
    grid: int
    shared_bytes: int


@dataclass(frozen=True)
class _Anatomy:
    contraction: str
    operand_block: str
    prologue: tuple[str, ...]
    epilogue: tuple[str, ...]
    row_axes: tuple[int, ...]      # positions of C's loops that index P's rows
    column_axes: tuple[int, ...]
    reduce_axis: int
    extents: tuple[int, ...]
    dtype: str



def _anatomy(func: tirx.PrimFunc) -> _Anatomy:
    blocks = [b for b, _ in sblocks(func)]
    names = [b.name_hint for b in blocks]
    if len(set(names)) != len(names):
        raise StitchScheduleError("block names are not unique")
    contractions = [k for k, b in enumerate(blocks) if is_contraction(b)]
    if len(contractions) != 1:
        raise StitchScheduleError(f"expected one contraction block, found {len(contractions)}")
    ci = contractions[0]
    c = blocks[ci]
    red = [k for k, iv in enumerate(c.iter_vars) if iv.iter_type == tirx.IterVar.CommReduce]
    if len(red) != 1:
        raise StitchScheduleError("the contraction must have exactly one reduction iterator")
    k_var = c.iter_vars[red[0]].var
    params = list(func.params)
    loads: list = []
    tvm_ffi.structural_walk(c.body, (tvm.ir.TensorLoad, loads.append))
    operand = [ld for ld in loads if len(ld.indices) and ld.indices[-1].same_as(k_var)
               and not any(ld.source.same_as(p) for p in params)]
    if len(operand) != 1:
        raise StitchScheduleError("no intermediate row operand P[.., i, k] in the contraction")
    source = operand[0].source
    writers = [b.name_hint for b in blocks[:ci] if any(w.source.same_as(source) for w in b.writes)]
    if len(writers) != 1:
        raise StitchScheduleError("the row operand must have one producer block")
    index_vars = list(operand[0].indices[:-1])
    rows, cols = [], []
    for k, iv in enumerate(c.iter_vars):
        if k == red[0]:
            continue
        (rows if any(iv.var.same_as(v) for v in index_vars) else cols).append(k)
    if len(rows) != len(index_vars) or not rows:
        raise StitchScheduleError("the row operand is not indexed by plain row iterators")
    extents = []
    for iv in c.iter_vars:
        if not isinstance(iv.dom.extent, tirx.IntImm):
            raise StitchScheduleError("dynamic extents")
        extents.append(int(iv.dom.extent.value))
    return _Anatomy(names[ci], writers[0], tuple(names[:ci]), tuple(names[ci + 1:]), tuple(rows), tuple(cols),
                    red[0], tuple(extents), str(source.ty.dtype))


def plan_prologue_tiles(func: tirx.PrimFunc, device: DeviceSpec) -> PrologueTiles:
    """Pick the row tile: the largest of :data:`ROW_TILES` whose ``P`` tile fits the shared budget
    and whose grid still fills every SM once; else the smallest that fits.

    Raises
    ------
    StitchScheduleError
        The function is not a GEMM with a row operand, or no tile fits.
    """
    a = _anatomy(func)
    k_len = a.extents[a.reduce_axis]
    columns = math.prod(a.extents[i] for i in a.column_axes)
    if columns > MAX_COLUMNS:
        raise StitchScheduleError(f"{columns} output columns per row exceed {MAX_COLUMNS}")
    last = a.extents[a.row_axes[-1]]
    lead = math.prod(a.extents[i] for i in a.row_axes[:-1])
    budget = min(SHARED_BUDGET, device.max_shared_memory_per_block)
    fitting = [bm for bm in ROW_TILES if bm * k_len * element_bytes(a.dtype) <= budget and bm % THREADS_Y == 0]
    if not fitting:
        raise StitchScheduleError(f"no row tile of {k_len} x {a.dtype} fits {budget} B of shared memory")
    useful = [bm for bm in fitting if bm <= max(last, fitting[-1])]
    chosen = next((bm for bm in useful if lead * math.ceil(last / bm) >= device.sm_count), useful[-1])
    return PrologueTiles(chosen, THREADS_Y, device.warp_size, lead * math.ceil(last / chosen),
                         chosen * k_len * element_bytes(a.dtype))


def _loops_below(sch, block, anchor) -> list:
    loops = sch.get_loops(block)
    target = sch.get(anchor)
    for k, lp in enumerate(loops):
        if sch.get(lp).same_as(target):
            return list(loops[k + 1:])
    raise StitchScheduleError("block is not under its anchor loop")


def _bind_rows_and_lanes(sch, loops: list, tiles: PrologueTiles):
    """``loops`` = [row loops.., the row's loop]: rows on threadIdx.y, the row on threadIdx.x;
    returns the serial loop over row groups."""
    if len(loops) < 2:
        raise StitchScheduleError("a prologue block has no row loop")
    row = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    row_outer, ty = sch.split(row, [None, tiles.threads_y])
    _, tx = sch.split(loops[-1], [None, tiles.threads_x])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    return row_outer


def build_prologue_schedule(func: tirx.PrimFunc, tiles: PrologueTiles) -> tirx.PrimFunc:
    """Schedule a GEMM with a row-reduction prologue as one kernel with the row tile ``tiles``
    (from :func:`plan_prologue_tiles`; see the module docstring).

    Raises
    ------
    StitchScheduleError
        The function does not have the expected anatomy or a schedule primitive refused it.
    """
    a = _anatomy(func)
    sch = tvm.s_tir.Schedule(func)
    try:
        kept = []
        for name in a.prologue:
            block = sch.get_sblock(name)
            if name == a.operand_block or is_reduction(sch.get(block)):
                kept.append(name)
                continue
            sch.compute_inline(block)
        c = sch.get_sblock(a.contraction)
        write_back = sch.cache_write(c, 0, "local")
        # an epilogue may read a value twice (GELU's x * (1 + erf(x / sqrt 2)) / 2): every block but the
        # last is inlined into its consumers (recomputed, elementwise), the last into the write-back
        for name in a.epilogue[:-1]:
            sch.compute_inline(sch.get_sblock(name))
        if a.epilogue:
            sch.reverse_compute_inline(sch.get_sblock(a.epilogue[-1]))
        loops = sch.get_loops(c)
        if len(loops) != len(a.extents):
            raise StitchScheduleError("the contraction's loops do not follow its iterators")
        rows = [loops[i] for i in a.row_axes]
        cols = [loops[i] for i in a.column_axes]
        sch.reorder(*rows, *cols, loops[a.reduce_axis])
        tile, in_tile = sch.split(rows[-1], [None, tiles.rows_per_block])
        bx = sch.fuse(*rows[:-1], tile) if len(rows) > 1 else tile
        outputs = sch.fuse(in_tile, *cols)
        _, ty, tx = sch.split(outputs, [None, tiles.threads_y, tiles.threads_x])
        sch.bind(bx, "blockIdx.x")
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        sch.reverse_compute_at(write_back, tx)
        operand = sch.get_sblock(a.operand_block)
        sch.set_scope(operand, 0, "shared")
        sch.compute_at(operand, bx)
        row_outer = _bind_rows_and_lanes(sch, _loops_below(sch, operand, bx), tiles)
        for name in reversed([n for n in kept if n != a.operand_block]):
            block = sch.get_sblock(name)
            sch.set_scope(block, 0, "local" if is_reduction(sch.get(block)) else "shared")
            sch.compute_at(block, row_outer)
            _bind_rows_and_lanes(sch, _loops_below(sch, block, row_outer), tiles)
    except TVM_ERRORS as err:
        raise StitchScheduleError(f"schedule failed: {str(err).strip().splitlines()[0][:300]}") from None
    return zero_unit_bindings(sch.mod["main"]).with_attr("tirx.is_scheduled", True)


__all__ = ["PrologueTiles", "ROW_TILES", "THREADS_Y", "build_prologue_schedule", "plan_prologue_tiles"]
