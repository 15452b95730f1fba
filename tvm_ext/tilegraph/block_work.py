"""What a tile costs a kernel's blocks: per-block work of a tile, weighed without building the kernel.

The planner weighs many output tiles per group (:mod:`~tvm_ext.tilegraph.planning`). For each it
needs what every block of the kernel would compute per tile (TVM's region inference after
``compute_at``, halos and index maps it cannot invert included), how each contraction maps onto
tensor-core fragments, and the thread count Welder's gcd rule gives. :class:`TileWork` takes the
schedule builder's steps up to thread binding (:mod:`~tvm_ext.tilegraph.schedule`) and reads
that off, the tile-independent prefix of the schedule built once per function and copied per tile.

Example
-------
>>> work = tile_work(func, (8, 64), ("T_softmax_exp",))
>>> gcd_threads(work)
256
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import tirx

from ..errors import TVM_ERRORS
from ..graph import is_contraction, is_reduction
from .plans import TilePlan
from .schedule import (THREAD_CHOICES, WARP, TileScheduleError, _extent, _fit, _staged, _Staged, _tiled,
                       _under_tile)
from .tensor_core import WmmaFit


@dataclass(frozen=True)
class BlockWork:
    """One block of a tile kernel: its outputs per tile and in all, and what one output costs.

    ``outputs`` is what TVM's region inference makes the block compute per tile; where it cannot
    invert an index map (a reshape between a GEMM and the tiled output) that is more than the tile
    needs, and ``outputs x tiles`` exceeds ``total``: the kernel would recompute.
    """

    name: str
    outputs: int
    row_reduction: bool
    total: int
    itemsize: int
    #: The block stores a kernel output to global memory (no shared buffer of its own).
    stores: bool = False
    #: A contraction: how it maps onto tensor-core fragments, or why it does not (None otherwise).
    wmma: WmmaFit | str | None = None
    #: Tiles of the kernel (its grid): the product of ``ceil(extent / tile)`` over the output.
    tiles: int = 1
    #: A pad block staging a kernel input in shared memory for a padded tensor-core stage
    #: (:mod:`~tvm_ext.tilegraph.padding`): every tile copies what it reads, which is no
    #: recomputation (an unpadded stage stages its operands alike).
    staging: bool = False
    #: Elements each output of a row reduction reduces per tile (1 for other blocks).
    row: int = 1

    @property
    def recompute(self) -> float:
        """How many times the grid computes each of its outputs: more than 1 where producer tiles
        overlap (halos, index maps TVM's region inference does not invert) or border tiles are
        cut (their predicated-off part counted)."""
        return self.outputs * self.tiles / self.total

    @property
    def tensor_core(self) -> bool:
        """Whether the block can run on WMMA fragments (:func:`~tvm_ext.tilegraph.tensor_core.wmma_fit`)."""
        return isinstance(self.wmma, WmmaFit)

    @property
    def work(self) -> int:
        """Thread slots it can use: its outputs, times a warp's lanes for a row reduction or a
        tensor-core fragment (one warp per 16x16 fragment); a row reduction of one output per tile
        spreads its row over every thread (the builder's ``_bind``): the row's length."""
        if self.tensor_core:
            return self.wmma.fragments * WARP
        if self.row_reduction:
            return self.row if self.outputs == 1 else self.outputs * WARP
        return self.outputs

    def shared_bytes(self, tensor_core: bool = True) -> int:
        """Shared memory of its per-tile buffer (none for a block storing an output to global),
        plus, on tensor cores, the operands it stages from global memory."""
        own = 0 if self.stores else self.outputs * self.itemsize
        return own + (self.wmma.staged_bytes if tensor_core and self.tensor_core else 0)



class TileWork:
    """:func:`tile_work` of one function and inlined blocks, tile after tile: the part of the
    schedule that does not depend on the tile (inlining, fragment padding, output staging) is built
    once per padding and copied for each tile (a copy takes microseconds, rebuilding it milliseconds).

    Example
    -------
    >>> works = TileWork(func, ("T_softmax_exp",))
    >>> [w.outputs for w in works((8, 64))] == [w.outputs for w in tile_work(func, (8, 64), ("T_softmax_exp",))]
    True
    """

    def __init__(self, func: tirx.PrimFunc, inline: tuple[str, ...] = ()):
        self.func, self.inline = func, tuple(inline)
        self._staged: dict[tuple[str, ...], _Staged | str] = {}

    def _prefix(self, padded: tuple[str, ...]) -> _Staged:
        if padded not in self._staged:
            try:
                # the shared scope (static or dynamic) changes no block's work
                self._staged[padded] = _staged(self.func, self.inline, padded, "shared")
            except TileScheduleError as err:
                self._staged[padded] = str(err)
            except TVM_ERRORS as err:
                self._staged[padded] = f"cannot tile: {str(err).strip().splitlines()[0][:300]}"
        found = self._staged[padded]
        if isinstance(found, str):
            raise TileScheduleError(found)
        return found

    def __call__(self, output_tile: tuple[int, ...], padded: tuple[str, ...] = (), kstep: int = 0) -> list[BlockWork]:
        """See :func:`tile_work`."""
        padded = tuple(padded)
        staged = self._prefix(padded)
        try:
            t = _tiled(self.func, TilePlan(tuple(output_tile), WARP, self.inline, padded=padded), staged)
            out = []
            for name in t.names:
                block = t.sch.get_sblock(name)
                spatial, reduce = _under_tile(t.sch, block, t.bx)
                contraction = is_contraction(t.sch.get(block))
                red = is_reduction(t.sch.get(block)) and not contraction
                fit = _fit(t.sch, block, spatial, reduce, t.cut, kstep) if contraction else None
                out.append(BlockWork(name, math.prod(_extent(t.sch, lp) for lp in spatial), red, *t.totals[name],
                                     stores=name in t.stores, wmma=fit, tiles=t.tiles, staging=name in t.staging,
                                     row=math.prod(_extent(t.sch, lp) for lp in reduce) if red else 1))
        except TVM_ERRORS as err:
            raise TileScheduleError(f"cannot tile: {str(err).strip().splitlines()[0][:300]}") from None
        return out


def tile_work(func: tirx.PrimFunc, output_tile: tuple[int, ...], inline: tuple[str, ...] = (),
              padded: tuple[str, ...] = (), kstep: int = 0) -> list[BlockWork]:
    """Per-tile work of every block of the kernel ``output_tile`` makes of ``func`` (the tiled
    output block last), its ``padded`` contractions padded to whole fragments
    (:mod:`~tvm_ext.tilegraph.padding`), its tensor-core stages staging operands ``kstep``
    reduction rows at a time where that applies (:func:`~tvm_ext.tilegraph.tensor_core.stepped_reduction`).
    Weighing many tiles of one function: :class:`TileWork`.

    Raises
    ------
    TileScheduleError
        The function's last block writes no output, or the tile does not fit its outputs.
    """
    return TileWork(func, inline)(output_tile, padded, kstep)


def gcd_threads(work: list[BlockWork]) -> int:
    """Welder §4.1's block size: the largest of :data:`THREAD_CHOICES` dividing the work of every
    block that can fill the smallest of them (so none of those is predicated; a block with less
    work, a pooling's final division, is predicated at any size), else 128."""
    filling = [w.work for w in work if w.work >= THREAD_CHOICES[-1]]
    if not filling:
        return THREAD_CHOICES[-1]
    g = math.gcd(*filling)
    return next((t for t in THREAD_CHOICES if g % t == 0), THREAD_CHOICES[-1])


__all__ = ["BlockWork", "TileWork", "gcd_threads", "tile_work"]
