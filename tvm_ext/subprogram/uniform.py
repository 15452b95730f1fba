"""Memory-intensive stages scheduled to a given thread shape, so they can share a merged kernel.

Every stage of a merged kernel runs with the same threads (a ``__syncthreads`` must be reached
by all of them), so the memory-intensive stages take the thread shape of the compute stages
instead of their own. The rule follows dlight's ``Fallback`` idea (inline what can be inlined,
then map what remains), with the thread shape given:

* a spatial block: its loops fused and split ``[blocks, threadIdx.y, threadIdx.x]``;
* a reduction block: its spatial loops fused and split ``[blocks, threadIdx.y]`` (one row per
  ``threadIdx.y``), its reduction loops fused and split ``[serial, threadIdx.x]`` (TVM's
  cross-thread reduction combines the ``threadIdx.x`` partial results of a row); when the rows
  do not divide by ``threadIdx.y``, one row per block and its reduction split
  ``[serial, threadIdx.y, threadIdx.x]`` (a partial row tile would put ``__syncthreads`` under a
  condition).

A *row chain* -- reductions over rows followed by one spatial block over the same rows (softmax,
layer norm; dlight's ``GeneralReduction`` pattern) -- is one kernel instead: the rows split
``[blocks, threadIdx.y]``, the reductions computed at the row loop into registers (each thread
holds its row's allreduce result; shared memory would make ``compute_at`` relax ``threadIdx.y``
and compute every row of the block at each ``threadIdx.y``), every row's loops split
``[serial, threadIdx.x]``; it needs no grid barrier inside. Any other block
left after inlining is a kernel of its own; the merged kernel runs them as stages.

Example
-------
>>> shape = ThreadShape(x=32, y=16)
>>> scheduled = schedule_to_shape(stage_func, shape)
>>> thread_shape(scheduled) == shape
True
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline

from ..errors import TVM_ERRORS
from .stages import StageError


@dataclass(frozen=True)
class ThreadShape:
    """Threads of a block: ``threadIdx.x`` and ``threadIdx.y`` extents (``threadIdx.z`` unused)."""

    x: int
    y: int = 1

    @property
    def threads(self) -> int:
        """Threads per block."""
        return self.x * self.y

    def to_json(self) -> list[int]:
        """JSON form ``[x, y]``."""
        return [self.x, self.y]

    @classmethod
    def from_json(cls, data) -> "ThreadShape":
        """Inverse of :meth:`to_json`."""
        return cls(int(data[0]), int(data[1]))


def thread_shape(func: tirx.PrimFunc) -> ThreadShape:
    """The thread shape of a scheduled function whose kernels all use the same threads.

    Raises
    ------
    StageError
        It binds ``threadIdx.z``, binds one thread axis with two extents, or binds no thread.
    """
    extents: dict[str, set] = {}

    def on_for(loop) -> None:
        if loop.thread_binding is not None:
            tag = str(loop.thread_binding.thread_tag)
            if tag.startswith("threadIdx"):
                ext = loop.extent
                extents.setdefault(tag, set()).add(int(ext.value) if isinstance(ext, tirx.IntImm) else -1)

    tvm_ffi.structural_walk(func.body, (tirx.For, on_for))
    if not extents:
        raise StageError("the function binds no thread")
    if "threadIdx.z" in extents or any(len(v) != 1 or -1 in v for v in extents.values()):
        raise StageError(f"thread extents {({k: sorted(v) for k, v in extents.items()})} are not one (x, y) shape")
    return ThreadShape(next(iter(extents.get("threadIdx.x", {1}))), next(iter(extents.get("threadIdx.y", {1}))))


def _fused(sch: s_tir.Schedule, loops: list):
    return sch.fuse(*loops) if len(loops) > 1 else loops[0]


def _extent(sch: s_tir.Schedule, loop) -> int | None:
    ext = sch.get(loop).extent
    return int(ext.value) if isinstance(ext, tirx.IntImm) else None


def _bind_rows(sch: s_tir.Schedule, loops: list, shape: ThreadShape):
    """Fuse the row loops and bind them: ``[blockIdx.x, threadIdx.y]`` when the rows divide by
    ``threadIdx.y`` (else one row per block: a partial row tile would put the reduction's
    ``__syncthreads`` under a condition, which TVM refuses). Returns the innermost row loop, how
    many row loops there are now, and whether ``threadIdx.y`` is left for the lanes."""
    rows = _fused(sch, loops)
    count = _extent(sch, rows)
    if shape.y > 1 and count is not None and count % shape.y == 0:
        bx, ty = sch.split(rows, [None, shape.y])
        sch.bind(bx, "blockIdx.x")
        sch.bind(ty, "threadIdx.y")
        return ty, 2, False
    sch.bind(rows, "blockIdx.x")
    return rows, 1, shape.y > 1


def _bind_lanes(sch: s_tir.Schedule, loops: list, shape: ThreadShape, with_y: bool) -> None:
    """Fuse ``loops`` and split them ``[serial, (threadIdx.y,) threadIdx.x]``."""
    if with_y:
        _, ty, tx = sch.split(_fused(sch, loops), [None, shape.y, shape.x])
        sch.bind(ty, "threadIdx.y")
    else:
        _, tx = sch.split(_fused(sch, loops), [None, shape.x])
    sch.bind(tx, "threadIdx.x")


def _bind_spatial(sch: s_tir.Schedule, loops: list, shape: ThreadShape) -> None:
    if shape.y > 1:
        bx, ty, tx = sch.split(_fused(sch, loops), [None, shape.y, shape.x])
        sch.bind(ty, "threadIdx.y")
    else:
        bx, tx = sch.split(_fused(sch, loops), [None, shape.x])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def _bind_reduction(sch: s_tir.Schedule, spatial: list, reduce: list, shape: ThreadShape) -> None:
    sch.reorder(*spatial, *reduce)
    _, _, lanes_y = _bind_rows(sch, spatial, shape)
    _bind_lanes(sch, reduce, shape, lanes_y)


def _row_chain(sch: s_tir.Schedule, infos: list, shape: ThreadShape) -> bool:
    """Schedule ``infos`` as one row-chain kernel if they are one (module docstring); False if not."""
    if len(infos) < 2:
        return False   # a lone block: the caller schedules block by block
    *reductions, last = infos
    kinds = [info.dom_kind() for info in reductions]
    if last.dom_kind().count("R") or any(set(k) - {"S", "R"} or "R" not in k for k in kinds):
        return False
    leading = {len(k) - len(k.lstrip("S")) for k in kinds}
    if len(leading) != 1 or any(k.lstrip("S").count("S") for k in kinds):
        return False
    (rows_n,) = leading
    last_loops = sch.get_loops(last.block_rv)
    if rows_n == 0 or len(last_loops) <= rows_n:
        return False
    row_extents = [_extent(sch, lp) for lp in last_loops[:rows_n]]
    if None in row_extents or any([_extent(sch, lp) for lp in sch.get_loops(i.block_rv)[:rows_n]] != row_extents
                                  for i in reductions):
        return False
    anchor, depth, lanes_y = _bind_rows(sch, last_loops[:rows_n], shape)
    _bind_lanes(sch, sch.get_loops(last.block_rv)[depth:], shape, lanes_y)
    for info, kind in zip(reversed(reductions), reversed(kinds)):
        block = info.block_rv
        for i, _ in enumerate(sch.get(block).writes):   # local: shared would relax threadIdx.y and
            sch.set_scope(block, buffer_index=i, storage_scope="local")   # compute all rows at every y
        sch.compute_at(block, anchor, preserve_unit_loops=True)
        _bind_lanes(sch, sch.get_loops(block)[-kind.count("R"):], shape, lanes_y)
    return True


def _chains(infos: list) -> list[list]:
    """``infos`` cut after every block without a reduction (each piece a candidate row chain)."""
    out: list[list] = [[]]
    for info in infos:
        out[-1].append(info)
        if "R" not in info.dom_kind():
            out.append([])
    return [c for c in out if c]


def _chain_or_block(sch: s_tir.Schedule, chain: list, shape: ThreadShape) -> bool:
    if len(chain) == 1:
        _block_by_block(sch, chain, shape)
        return True
    return _row_chain(sch, chain, shape)


def _block_by_block(sch: s_tir.Schedule, infos: list, shape: ThreadShape) -> None:
    for info in infos:
        block = info.block_rv
        loops = sch.get_loops(block)
        kinds = info.dom_kind()
        if not loops:
            loops = [sch.add_unit_loop(block)]
            kinds = "S"
        if set(kinds) - {"S", "R"}:
            raise StageError(f"block '{sch.get(block).name_hint}' has opaque iterators ({kinds})")
        spatial = [lp for lp, k in zip(loops, kinds) if k == "S"]
        reduce = [lp for lp, k in zip(loops, kinds) if k == "R"]
        if not reduce:
            _bind_spatial(sch, spatial, shape)
            continue
        if not spatial:
            spatial = [sch.add_unit_loop(block)]
        _bind_reduction(sch, spatial, reduce, shape)


def _inlined(func: tirx.PrimFunc) -> tuple[s_tir.Schedule, list]:
    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if infos is None:
        raise StageError("the stage cannot be normalized (dlight's normal form)")
    return sch, try_inline(sch, infos)


def schedule_to_shape(func: tirx.PrimFunc, shape: ThreadShape) -> tirx.PrimFunc:
    """Schedule a memory-intensive stage with ``shape`` threads (see the module docstring).

    Raises
    ------
    StageError
        A block whose loops are neither spatial nor reduction (opaque), or TVM refused a step.
    """
    try:
        sch, infos = _inlined(func)
        chains = _chains(infos)
        if any(len(c) > 1 for c in chains) and all(_chain_or_block(sch, c, shape) for c in chains):
            return sch.mod["main"].with_attr("tirx.is_scheduled", True)
    except (TVM_ERRORS + (StageError,)):
        pass   # not row chains TVM accepts: block by block below
    try:
        sch, infos = _inlined(func)
        _block_by_block(sch, infos, shape)
    except TVM_ERRORS as err:
        raise StageError(f"cannot schedule the stage to {shape.x}x{shape.y} threads: "
                         f"{str(err).splitlines()[0][:200]}") from None
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


__all__ = ["ThreadShape", "schedule_to_shape", "thread_shape"]
