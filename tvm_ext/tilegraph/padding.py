"""Fragment padding: a contraction padded to whole WMMA fragments before its kernel is tiled.

A tensor-core stage computes 16x16x16 fragments; ViT's attention (197 tokens) has a score matrix
of 197x197 and a ``P @ V`` reduction of depth 197, which no tile cuts into whole fragments. Welder
pads such tiles; here the contraction's iteration domain is padded with TVM's ``pad_einsum``
(the matrix extents ``i``, ``j`` and the reduction ``k`` that are no multiples of 16 to multiples of
:data:`ROW_OF_FRAGMENTS`, batch extents kept),
before the builder tiles the kernel:

* every operand is read through a **pad block** (zero beyond the original extent). An operand
  computed in the kernel by an elementwise block (softmax's normalization) is computed in its pad
  block instead (``compute_inline``): the pad block is the producer the kernel stages in shared
  memory;
* the contraction writes a padded buffer; a **crop block** copies the original extent out. Where
  the contraction feeds the kernel's own blocks the crop is inlined (they read the padded buffer);
  where it writes the kernel's output the crop is the output block the builder tiles, and the
  contraction is computed per tile like any producer.

The padding is computed and discarded: zero rows and columns add to the contraction's flops
(at 197 tokens each GEMM computes 208 rows, the 13 tiles of 16, by 256 columns or a depth of 256:
1.37x) and nothing to global traffic (the pad blocks read what the contraction read, once).
:func:`padding_flops` counts it for the cost model.

Example
-------
>>> sch = tvm.s_tir.Schedule(attention_197)
>>> pad_to_fragments(sch, "matmul1", list(attention_197.params))
('T_softmax_norm_intermediate_pad', 'matmul_intermediate_1_pad', 'v_pad')

The planner pads a kernel's contractions where that puts more of them on tensor cores
(:func:`~tvm_ext.tilegraph.planning.plan_group`); the plan names them (``TilePlan.padded``) and
the builder pads them before it tiles (:func:`~tvm_ext.tilegraph.schedule.build_tile_schedule`).
A GEMM writing the kernel's output is padded in its rows only in effect: the tile of its crop
block bounds what it computes, so columns that no tile covers whole stay SIMT.
"""
from __future__ import annotations

import tvm
from tvm import tirx

from ..errors import TVM_ERRORS, TvmExtError
from ..graph import is_reduction, sblocks
from .enumerate import MMA_FRAGMENT as FRAGMENT

_RED = tirx.IterVar.CommReduce
#: What an extent that is no multiple of a fragment is padded to a multiple of: 4 fragments, one
#: per warp of the smallest thread block (128 threads). A tile spanning a whole padded row (the
#: score matrix a softmax reads, which ``P @ V`` reads padded to its own depth) then deals its
#: fragments evenly over the warps: 197 tokens padded to 208 would make 13 fragments per row, which
#: no warp count but 1 and 13 divides, and TVM's tensorize does not match a fragment stage
#: predicated by an uneven split. The cost: 256 columns instead of 208 (1.23x more than padding
#: to 16), on tensor cores.
ROW_OF_FRAGMENTS = 4 * FRAGMENT


class PaddingError(TvmExtError):
    """A contraction that cannot be padded to whole fragments (not an einsum of one reduction)."""


def fragment_padding(block: tirx.SBlock) -> list[int] | None:
    """``pad_einsum``'s factors for ``block`` (on the output's last two iterators and the one
    reduction iterator 16, or :data:`ROW_OF_FRAGMENTS` where the extent is no multiple of 16; 1
    elsewhere), or None where all three are multiples of 16."""
    store = block.body
    if not isinstance(store, tirx.BufferStore) or len(store.indices) < 2:
        raise PaddingError(f"block '{block.name_hint}' is not one store to a matrix")
    matrix = [store.indices[-2], store.indices[-1]]
    reduce = [iv for iv in block.iter_vars if iv.iter_type == _RED]
    if len(reduce) != 1 or not all(isinstance(x, tvm.ir.Var) for x in matrix):
        raise PaddingError(f"block '{block.name_hint}' is not a matrix contraction with one reduction")
    extents = [int(iv.dom.extent) for iv in block.iter_vars]
    padded = [iv.iter_type == _RED or iv.var.same_as(matrix[0]) or iv.var.same_as(matrix[1])
              for iv in block.iter_vars]
    if all(e % FRAGMENT == 0 for e, p in zip(extents, padded) if p):
        return None
    return [(FRAGMENT if e % FRAGMENT == 0 else ROW_OF_FRAGMENTS) if p else 1 for e, p in zip(extents, padded)]


def pad_to_fragments(sch: tvm.s_tir.Schedule, name: str, outputs: list) -> tuple[str, ...]:
    """Pad the contraction ``name`` of ``sch`` to whole fragments (see the module docstring);
    ``outputs`` are the function's output buffers. Returns the blocks the padding added and kept.

    Raises
    ------
    PaddingError
        The block is no matrix contraction, or ``pad_einsum`` refused it.
    """
    block = sch.get_sblock(name)
    factors = fragment_padding(sch.get(block))
    if factors is None:
        return ()
    before = {b.name_hint for b, _ in sblocks(sch.mod["main"])}
    try:
        sch.pad_einsum(block, factors)
    except TVM_ERRORS as err:
        raise PaddingError(f"block '{name}' cannot be padded: {str(err).strip().splitlines()[0][:200]}") from None
    padded_out = sch.get(block).writes[0].source
    kept = []
    for pad_block in (*sch.get_producers(block), *sch.get_consumers(block)):
        stmt = sch.get(pad_block)
        if stmt.name_hint in before:
            continue
        crop = any(r.source.same_as(padded_out) for r in stmt.reads)
        if crop and not any(w.source.same_as(o) for w in stmt.writes for o in outputs):
            sch.compute_inline(pad_block)             # a crop the kernel reads: read the padded buffer
            continue
        if not crop:
            _inline_producer(sch, pad_block, outputs)
        kept.append(stmt.name_hint)                   # a pad block, or the crop of a kernel output
    return tuple(sorted(kept))


def _inline_producer(sch, pad, outputs: list) -> None:
    """Compute an elementwise in-kernel producer of the pad block ``pad`` in it (the pad block
    takes its place in shared memory)."""
    for producer in sch.get_producers(pad):
        stmt = sch.get(producer)
        if is_reduction(stmt) or any(w.source.same_as(o) for w in stmt.writes for o in outputs):
            continue
        if len(sch.get_consumers(producer)) == 1:
            sch.compute_inline(producer)


def paddable(block: tirx.SBlock) -> bool:
    """Whether padding ``block`` to whole fragments changes it (a matrix contraction with extents
    that are no multiples of a fragment; a convolution's several reductions are not padded)."""
    try:
        return fragment_padding(block) is not None
    except PaddingError:
        return False


def padding_flops(func: tirx.PrimFunc, work: list, padded: tuple[str, ...]) -> int:
    """Flops the ``padded`` contractions of ``func`` compute beyond their own: their padded outputs
    per tile (``work``, :class:`~tvm_ext.tilegraph.block_work.BlockWork` of the padded kernel) over
    the grid times their padded depth, less their own (2 per multiply-add)."""
    if not padded:
        return 0
    blocks = {b.name_hint: b for b, _ in sblocks(func)}
    done = {w.name: w for w in work}
    extra = 0
    for name in padded:
        block, factors = blocks[name], fragment_padding(blocks[name])
        spatial = depth = padded_depth = 1
        for iv, f in zip(block.iter_vars, factors):
            extent = int(iv.dom.extent)
            if iv.iter_type == _RED:
                depth, padded_depth = extent, -(-extent // f) * f
            else:
                spatial *= extent
        extra += 2 * (done[name].outputs * done[name].tiles * padded_depth - spatial * depth)
    return extra


__all__ = ["PaddingError", "fragment_padding", "pad_to_fragments", "paddable", "padding_flops"]
