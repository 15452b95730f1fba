"""Schedule builder: a :class:`~tvm_ext.tilegraph.plans.TilePlan` on a fused PrimFunc, as one kernel.

Welder's connections with ``s_tir.Schedule`` primitives (the digest's schedule recipe, not the
paper's kernel stitching):

* **register connection** — the plan's ``inline`` blocks are ``compute_inline``-d into their
  consumers (an elementwise producer recomputed where it is read);
* **top-level tile** — the output block's spatial loops are split by ``output_tile``; the tile
  loops, fused, are ``blockIdx.x``. A tile that does not divide the output (ViT's 197 tokens) is
  cut at the border: TVM predicates the border tiles' loops; the contractions the plan names in
  ``padded`` are padded to whole fragments first (:mod:`~tvm_ext.tilegraph.padding`, Welder pads
  tiles), so that they compute border tiles whole on tensor cores;
* **more outputs** — a kernel may store further tensors of the output's shape (a residual sum
  that its layer norm also reads): each such block writes its tile into shared memory like any
  producer (``cache_write``, its readers in the kernel read the shared copy), and a copy block
  tiled exactly as the output, its tile loop merged into the output's (``merge``), stores it. The
  tiles of the copy cover the tensor by construction, whatever the readers in the kernel need;
* **shared connection** — every other block is computed per tile (``compute_at`` at the block
  loop; TVM's region inference gives exactly Welder's propagated tile) into a ``shared`` buffer;
  TVM's lowering merges the shared buffers into one pool (``MergeSharedMemoryAllocations``) and
  inserts the barriers between stages (``ThreadSync``);
* **threads** — ``threads // 32`` warps: a row reduction (softmax's max and sum, a norm's mean)
  puts its rows on ``threadIdx.y`` and reduces each row across the 32 lanes of ``threadIdx.x``;
  every other block spreads its tile's outputs over ``threadIdx.y x threadIdx.x``;
* **contractions** (the GEMMs inside): those the plan names in ``tensor_core`` run on WMMA
  fragments, one 16x16 output fragment per warp at a time, their operands from global memory
  staged whole or, with the plan's ``kstep``, in reduction steps (:mod:`tvm_ext.tilegraph.tensor_core`);
  any other accumulates one output per thread in a register (``cache_write`` to ``local``,
  written back by the same thread; in place where TVM would size the register buffer over a cut
  border tile), reduction loop serial: SIMT code.

:mod:`~tvm_ext.tilegraph.block_work` weighs tiles with the same steps up to thread binding
(:func:`_staged`, :func:`_tiled`): the per-block work of every block for the gcd rule of the thread count.

Example
-------
>>> scheduled = build_tile_schedule(func, TilePlan(output_tile=(16, 128), threads=512))
>>> scheduled.attrs["tirx.is_scheduled"]
True
"""
from __future__ import annotations

from typing import NamedTuple

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlockRealize

from ..analysis import num_tiles
from ..errors import TVM_ERRORS, TvmExtError
from ..graph import element_bytes, is_contraction, sblocks
from ..tir.unchecked_schedule import UncheckedSchedule
from .plans import TilePlan
from .padding import PaddingError, pad_to_fragments
from .tensor_core import Misaligned, Unfit, WmmaFit, loops_below, schedule_wmma, wmma_fit
from .tensor_core import tensorize as tensorize_stages

#: Lanes of one warp: the ``threadIdx.x`` extent of every block (a row reduction's lanes).
WARP = 32
#: Thread counts the gcd rule may pick, largest first (Welder §4.1: the gcd of the tiles' sizes if
#: it lies in [128, 1024], else 128; :func:`~tvm_ext.tilegraph.block_work.gcd_threads`).
THREAD_CHOICES = (1024, 512, 256, 128)
_RED = tirx.IterVar.CommReduce


class TileScheduleError(TvmExtError):
    """The builder cannot realize a tile plan on a function (the kernel falls back, reported)."""


def _program_order(func: tirx.PrimFunc) -> list[str]:
    names = [b.name_hint for b, _ in sblocks(func)]
    if len(set(names)) != len(names):
        raise TileScheduleError("block names are not unique")
    return names


def _output_writers(func: tirx.PrimFunc, inline: tuple[str, ...]) -> list[str]:
    """Blocks writing an output parameter, in program order; the last block of the function is one
    of them (the tiled output block) and none is inlined."""
    names = _program_order(func)
    unknown = sorted(set(inline) - set(names))
    if unknown:
        raise TileScheduleError(f"the plan inlines blocks the function does not have: {unknown}")
    params = list(func.params)
    writers = [b.name_hint for b, _ in sblocks(func) if any(w.source.same_as(p) for w in b.writes for p in params)]
    if not writers or writers[-1] != names[-1]:
        raise TileScheduleError(f"a tile kernel's last block writes an output; output writers: {writers}")
    inlined = sorted(set(writers) & set(inline))
    if inlined:
        raise TileScheduleError(f"blocks writing an output cannot be inlined: {inlined}")
    return writers


def _realize(sch, block):
    """The ``SBlockRealize`` of ``block`` in the schedule's current function."""
    name = sch.get(block).name_hint
    found: list = []
    tvm_ffi.structural_walk(sch.mod["main"].body,
                            (SBlockRealize, lambda r: found.append(r) if r.block.name_hint == name else None))
    if len(found) != 1:
        raise TileScheduleError(f"block '{name}' is realized {len(found)} times")
    return found[0]


def _spatial_and_reduce(sch, block, loops) -> tuple[list, list]:
    """``loops`` split into those that bind a spatial iterator of ``block`` (or none) and those that
    bind a reduction iterator."""
    realize = _realize(sch, block)
    reduce_vars: set = set()
    for iv, value in zip(realize.block.iter_vars, realize.iter_values):
        if iv.iter_type == _RED:
            tvm_ffi.structural_walk(value, (tvm.ir.Var, reduce_vars.add))
    spatial, reduce = [], []
    for loop in loops:
        (reduce if sch.get(loop).loop_var in reduce_vars else spatial).append(loop)
    return spatial, reduce


def _under_tile(sch, block, anchor) -> tuple[list, list]:
    """The spatial and reduction loops of ``block`` under the tile loop. A block that computes one
    element per tile has no spatial loop there (``compute_at`` makes none of extent 1): it gets a
    unit loop, above its reduction loops, for the threads to bind."""
    spatial, reduce = _spatial_and_reduce(sch, block, _below(sch, block, anchor))
    if not spatial:
        spatial = [sch.add_unit_loop(reduce[0] if reduce else block)]
    return spatial, reduce


def _extent(sch, loop) -> int:
    ext = sch.get(loop).extent
    if not isinstance(ext, tirx.IntImm):
        raise TileScheduleError("dynamic loop extents")
    return int(ext.value)


class _Tiled(NamedTuple):
    """A function after inlining, output staging, output tiling and ``compute_at`` (:func:`_tiled`)."""

    sch: tvm.s_tir.Schedule
    bx: object                    # the tile loop (LoopRV)
    names: list[str]              # blocks in program order, the copies and the tiled output block last
    stores: tuple[str, ...]       # blocks storing an output to global (the copies, then the output block)
    totals: dict[str, tuple[int, int]]
    tiles: int
    cut: bool                     # border tiles are cut
    staging: frozenset[str] = frozenset()   # pad blocks copying a kernel input into shared memory


def _stage_outputs(sch, writers: list[str], scope: str) -> list[str]:
    """Each block of ``writers`` computes into a ``scope`` buffer its readers in the kernel read; a
    copy block (returned, by name) stores it to the output."""
    copies = []
    for name in writers:
        block = sch.get_sblock(name)
        readers = list(sch.get_consumers(block))
        copies.append(sch.get(sch.cache_write(block, 0, scope, consumer_blocks=readers)).name_hint)
    return copies


def _tile_loop(sch, block, tile: tuple[int, ...]) -> tuple[object, list[int]]:
    """Split the spatial loops of ``block`` by ``tile`` (reduction loops innermost) and fuse the
    tile loops: (the fused tile loop, the spatial extents)."""
    spatial, reduce = _spatial_and_reduce(sch, block, list(sch.get_loops(block)))
    if len(spatial) != len(tile):
        name = sch.get(block).name_hint
        raise TileScheduleError(f"output tile {tile} for {len(spatial)} output dimensions of '{name}'")
    extents = [_extent(sch, loop) for loop in spatial]
    if not all(0 < size <= extent for size, extent in zip(tile, extents)):
        raise TileScheduleError(f"tile {tile} does not fit the output {tuple(extents)}")
    outer, inner = [], []
    for loop, size in zip(spatial, tile):
        o, i = sch.split(loop, [None, size])
        outer.append(o)
        inner.append(i)
    sch.reorder(*outer, *inner, *reduce)
    return (sch.fuse(*outer) if len(outer) > 1 else outer[0]), extents


class _Staged(NamedTuple):
    """A function after inlining, fragment padding and output staging: what every tile of it starts
    from (:func:`_staged`)."""

    sch: tvm.s_tir.Schedule
    writers: list[str]            # blocks writing an output, the tiled output block last
    copies: list[str]             # the copy blocks storing the staged outputs
    names: list[str]              # blocks in program order, the copies and the tiled output block last
    totals: dict[str, tuple[int, int]]
    staging: frozenset[str]


def _staged(func: tirx.PrimFunc, inline: tuple[str, ...], padded: tuple[str, ...], shared_scope: str) -> _Staged:
    """Inline ``inline``, pad ``padded`` to whole fragments and stage every output but the last
    (see the module docstring): the part of a tile kernel's schedule that does not depend on the tile."""
    writers = _output_writers(func, inline)
    sch = UncheckedSchedule(func)          # built per tile weighed: the Python type check is a fifth of it
    for name in inline:
        sch.compute_inline(sch.get_sblock(name))
    params = list(func.params)
    added: list[str] = []
    try:
        for name in padded:
            added += pad_to_fragments(sch, name, params)
    except PaddingError as err:
        raise TileScheduleError(str(err)) from None
    if added:
        writers = _output_writers(sch.mod["main"], ())
    staging = frozenset(n for n in added if all(any(r.source.same_as(p) for p in params)
                                                for r in sch.get(sch.get_sblock(n)).reads))
    copies = _stage_outputs(sch, writers[:-1], shared_scope)
    staged = sch.mod["main"]
    anchor = writers[-1]                  # the copies follow it in program order
    names = [n for n in _program_order(staged) if n not in copies and n != anchor] + [*copies, anchor]
    return _Staged(sch, writers, copies, names, _totals(staged), staging)


def _tiled(func: tirx.PrimFunc, plan: TilePlan, staged: _Staged | None = None) -> _Tiled:
    """The kernel's schedule up to thread binding (see the module docstring), from ``staged``
    (:func:`_staged` of ``func`` and the plan's inlined and padded blocks, left unchanged) if given."""
    if staged is None:
        staged = _staged(func, plan.inline, plan.padded, plan.shared_scope)
    sch = staged.sch.copy()
    writers, copies, names = staged.writers, staged.copies, staged.names
    anchor = writers[-1]
    bx, extents = _tile_loop(sch, sch.get_sblock(anchor), plan.output_tile)
    for copy in copies:
        loop, copy_extents = _tile_loop(sch, sch.get_sblock(copy), plan.output_tile)
        if copy_extents != extents:
            raise TileScheduleError(f"output '{copy}' has extents {tuple(copy_extents)}, the tiled output "
                                    f"{tuple(extents)}: a tile kernel's outputs share one tile")
        bx = sch.merge(bx, loop)
    outputs = set(writers[:-1])
    for name in reversed(names[:-1]):
        if name in copies:
            continue
        block = sch.get_sblock(name)
        if name not in outputs:           # a staged output already computes into its scope buffer
            sch.set_scope(block, 0, plan.shared_scope)
        sch.compute_at(block, bx)
    cut = any(extent % size for size, extent in zip(plan.output_tile, extents))
    return _Tiled(sch, bx, names, (*copies, names[-1]), staged.totals, num_tiles(extents, plan.output_tile), cut,
                  staged.staging)


def _below(sch, block, anchor) -> list:
    loops = loops_below(sch, block, anchor)
    if loops is None:
        raise TileScheduleError(f"block '{sch.get(block).name_hint}' is not under the tile loop")
    return loops


def _totals(func: tirx.PrimFunc) -> dict[str, tuple[int, int]]:
    """Block name -> (spatial iteration volume, bytes of one element it writes)."""
    out = {}
    for block, _ in sblocks(func):
        volume = 1
        for iv in block.iter_vars:
            if iv.iter_type != _RED:
                if not isinstance(iv.dom.extent, tirx.IntImm):
                    raise TileScheduleError("dynamic extents")
                volume *= int(iv.dom.extent.value)
        out[block.name_hint] = (volume, element_bytes(str(block.writes[0].source.dtype)) if block.writes else 4)
    return out


def _bind(sch, block, anchor, ty: int) -> None:
    spatial, reduce = _under_tile(sch, block, anchor)
    sch.reorder(*spatial, *reduce)
    fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    stmt = sch.get(block)
    if reduce and not is_contraction(stmt):          # a row reduction: rows on y, lanes reduce the row
        row = sch.fuse(*reduce) if len(reduce) > 1 else reduce[0]
        if _extent(sch, fused) == 1:                 # one row per tile (a global pooling): every thread reduces it
            _, y, x = sch.split(row, [None, ty, WARP])
        else:
            _, y = sch.split(fused, [None, ty])
            _, x = sch.split(row, [None, WARP])
        sch.bind(y, "threadIdx.y")
        sch.bind(x, "threadIdx.x")
        return
    _, y, x = sch.split(fused, [None, ty, WARP])
    sch.bind(y, "threadIdx.y")
    sch.bind(x, "threadIdx.x")
    if reduce:                                          # a contraction: accumulate in a register
        _accumulate_in_register(sch, block, x)


def _accumulate_in_register(sch, block, thread_loop) -> None:
    """A contraction accumulates its output in a register (``cache_write`` to ``local``), written
    back by the same thread; unless TVM sizes that buffer over the cut border tile (the tile loops
    relaxed without their predicate, EfficientNet's 144 channels in 128-channel tiles gave 256):
    the write-back would then store past the end of the output, so the block accumulates in place,
    under its own predicate."""
    probe = sch.copy()
    register = probe.get(probe.cache_write(block, 0, "local")).reads[0].source
    written = sch.get(block).writes[0].source
    if any(int(r) > int(w) for r, w in zip(register.shape, written.shape)):
        return
    write_back = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(write_back, thread_loop)


#: Why a contraction of a kernel with cut border tiles stays SIMT.
CUT_TILE = Misaligned("the tile does not divide the output (a cut border tile has no whole WMMA fragments)")


def _fit(sch, block, spatial: list, reduce: list, cut: bool, kstep: int = 0) -> WmmaFit | str:
    """:func:`~tvm_ext.tilegraph.tensor_core.wmma_fit` of ``block`` with its loops under the tile.
    Where a cut border tile predicates the block it is refused as :data:`CUT_TILE` (a contraction
    padded to whole fragments computes its border tile whole, into its padded buffer, and is not
    predicated), unless its body fits no tile at all: that stays :class:`~.tensor_core.Unfit`."""
    realize = _realize(sch, block)
    fit = wmma_fit(sch, block, realize, spatial, reduce, lambda lp: _extent(sch, lp), kstep)
    if cut and not isinstance(fit, Unfit) and not (isinstance(realize.predicate, tirx.IntImm)
                                                   and int(realize.predicate.value) == 1):
        return CUT_TILE
    return fit


def _bind_wmma(sch, block, anchor, ty: int, shared_scope: str, cut: bool, kstep: int) -> list:
    spatial, reduce = _under_tile(sch, block, anchor)
    fit = _fit(sch, block, spatial, reduce, cut, kstep)
    if isinstance(fit, str):
        raise TileScheduleError(f"block '{sch.get(block).name_hint}' cannot run on tensor cores: {fit}")
    if fit.fragments % ty:
        raise TileScheduleError(f"{fit.fragments} tensor-core fragments of '{sch.get(block).name_hint}' "
                                f"do not divide over {ty} warps")
    return schedule_wmma(sch, block, anchor, spatial, reduce, fit, warps=ty,
                         bind_copy=lambda copy, loop: _bind(sch, copy, loop, ty), shared_scope=shared_scope)


def build_tile_schedule(func: tirx.PrimFunc, plan: TilePlan, *, tensorize: bool = True) -> tirx.PrimFunc:
    """Schedule ``func`` as the one kernel ``plan`` describes (see the module docstring).

    ``tensorize=False`` leaves the tensor-core stages as the 16x16x16 loops the WMMA intrinsics
    replace: the same program, runnable on the CPU (thread-serialized checks).

    Raises
    ------
    TileScheduleError
        The function has not the anatomy of a tile kernel, the plan does not fit it, or a
        schedule primitive refused it.
    """
    if plan.threads % WARP or not WARP <= plan.threads <= THREAD_CHOICES[0]:
        raise TileScheduleError(f"threads must be a multiple of {WARP} up to {THREAD_CHOICES[0]}, got {plan.threads}")
    ty = plan.threads // WARP
    try:
        t = _tiled(func, plan)
        sch, bx, names, cut = t.sch, t.bx, t.names, t.cut
        unknown = sorted(set(plan.tensor_core) - set(names))
        if unknown:
            raise TileScheduleError(f"the plan puts blocks on tensor cores the kernel does not have: {unknown}")
        sch.bind(bx, "blockIdx.x")
        stages = []
        for name in names:
            if name in plan.tensor_core:
                stages += _bind_wmma(sch, sch.get_sblock(name), bx, ty, plan.shared_scope, cut, plan.kstep)
            else:
                _bind(sch, sch.get_sblock(name), bx, ty)
        if tensorize:
            tensorize_stages(sch, stages)
    except TVM_ERRORS as err:
        raise TileScheduleError(f"schedule failed: {str(err).strip().splitlines()[0][:300]}") from None
    return _simplified(sch.mod["main"]).with_attr("tirx.is_scheduled", True)


def _simplified(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with its index expressions simplified, so that lowering sizes each shared buffer
    by the tile the plan weighed. TVM's pipeline compacts buffers before it simplifies: a layer
    norm's rows read back through a reshape as ``bx // 4 * 64 + bx % 4 * 16 + i`` and written as
    ``bx * 16 + i`` are one region only once simplified, and unsimplified the whole tensor was
    allocated in shared memory (262 KB per block for Segformer-B0's 64x64x32 norm)."""
    return tvm.s_tir.transform.StmtSimplify()(tvm.IRModule({"main": func}))["main"]


__all__ = ["WARP", "THREAD_CHOICES", "TileScheduleError", "build_tile_schedule"]
