"""Schedule builder: a :class:`~tvm_ext.stitch.planner.StitchPlan` to a scheduled PrimFunc.

All with ``s_tir.Schedule`` primitives, starting from the plan's function (local ops already
inlined, a split reduction already factored):

* regional ops: ``set_scope`` (a reduction keeps its result in ``local`` scope: TVM's
  cross-thread reduction leaves it in a shared-memory slot every thread of the row reads;
  other ops in ``shared``), then ``compute_at`` into their stage root's row loop, their inner
  loops split by ``threads_x`` and bound to ``threadIdx.x`` (an op of one value per row is
  written by ``threadIdx.x < 1``: the schedule stage puts the ``__syncthreads`` ThreadSync misses
  before its readers, :func:`tvm_ext.tir.sync_shared_broadcasts`);
* every stage root: leading row loops fused and split ``[grid, tasks, rows_per_block]``
  (vertical and horizontal packing), the row's inner loops split by ``threads_x``; a flat
  stage splits all its loops ``[grid, tasks, rows_per_block, threads_x]``;
* the stages' grid loops are merged into one loop bound to ``blockIdx.x`` (one kernel), and
  :func:`tvm_ext.tir.insert_grid_sync` puts grid barriers where a global value crosses stages;
* global intermediates stay ``global`` allocations; :func:`tvm_ext.tir.promote_workspace` turns them into
  extra output parameters (a kernel cannot allocate global memory).

Example
-------
>>> plan = plan_prim_func(func, load_device("h100"))
>>> scheduled = build_schedule(plan)        # a plan read back from JSON: build_schedule(realize(func, plan))
>>> scheduled.attrs["tirx.is_scheduled"]
True
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

from ..errors import TVM_ERRORS, TvmExtError
from ..tir import MIN_BLOCKS_ATTR, insert_grid_sync
from .locality import row_split
from .ops import StitchGraph
from .planner import Stage, StitchPlan


class StitchScheduleError(TvmExtError):
    """The schedule builder cannot realize a plan (the caller falls back to TVM's default schedules)."""


def _extent(sch, loop) -> int:
    ext = sch.get(loop).extent
    if not isinstance(ext, tirx.IntImm):
        raise StitchScheduleError(f"loop extent {ext} is not constant")
    return int(ext.value)


def _bind_inner(sch, loops: list, threads_x: int) -> None:
    """Fuse ``loops`` (at least one) and bind the threads_x-sized inner part to threadIdx.x."""
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    _, tx = sch.split(fused, [None, threads_x])
    sch.bind(tx, "threadIdx.x")


def _reduce_loop_vars(sch, block) -> list:
    """Loop variables that drive a reduction iterator of ``block`` (from its block realize)."""
    target = sch.get(block)
    realizes: list = []

    def visit(node) -> None:
        if node.block.same_as(target):
            realizes.append(node)

    tvm_ffi.structural_walk(sch.mod["main"].body, (tvm.s_tir.SBlockRealize, visit))
    if len(realizes) != 1:
        raise StitchScheduleError(f"cannot find the realize of block '{target.name_hint}'")
    used: list = []
    for iv, value in zip(target.iter_vars, realizes[0].iter_values):
        if iv.iter_type == tirx.IterVar.CommReduce:
            tvm_ffi.structural_walk(value, (tvm.ir.Var, used.append))
    return used


def _member_inner(sch, block, n_outer: int, threads_x: int) -> None:
    """Bind a compute_at'ed member's loops below the row loop to threadIdx.x: its reduction loops
    for a reduction (a cross-thread reduction leaves the result in every thread), else its row."""
    loops = sch.get_loops(block)[n_outer:]
    red_vars = _reduce_loop_vars(sch, block)
    red = [lp for lp in loops if any(sch.get(lp).loop_var.same_as(v) for v in red_vars)]
    if red:
        others = [lp for lp in loops if lp not in red]
        if others and loops.index(others[-1]) > loops.index(red[0]):
            sch.reorder(*others, *red)  # a cross-thread reduction needs its loops innermost
        _bind_inner(sch, red, threads_x)
        return
    if not loops:
        loops = [sch.add_unit_loop(block)]
    _bind_inner(sch, loops, threads_x)


def _split_rows(sch, row_loop, stage: Stage, grid: int, rows_per_block: int, threads_x: int | None):
    factors = [grid, stage.tasks] + ([rows_per_block] if rows_per_block > 1 else []) + \
        ([threads_x] if threads_x else [])
    parts = sch.split(row_loop, factors)
    k = 2
    if rows_per_block > 1:
        sch.bind(parts[k], "threadIdx.y")
        k += 1
    if threads_x:
        sch.bind(parts[k], "threadIdx.x")
    return parts[0]


def _schedule_row_stage(sch, g1: StitchGraph, stage: Stage, plan: StitchPlan):
    root = sch.get_sblock(stage.root)
    op = g1.op(stage.root)
    members = list(stage.members)
    if op.is_reduce:
        # A cross-thread reduction drops the row predicate of a partial last row group on its
        # write-back; reduce into a register and let an elementwise copy (predicated) write out.
        copy = sch.cache_write(root, 0, "local")
        members.append(stage.root)
        root = copy
    loops = sch.get_loops(root)
    k = len(op.spatial) if op.is_reduce else row_split(op.spatial, stage.rows)
    if k is None:
        raise StitchScheduleError(f"stage root '{stage.root}' is not row-aligned with {stage.rows} rows")
    extents = [_extent(sch, lp) for lp in loops[:len(op.spatial)]]
    if tuple(extents) != tuple(op.spatial):
        raise StitchScheduleError(f"loops of '{stage.root}' ({extents}) do not follow its index order {op.spatial}")
    row_loops = list(loops[:k])
    inner_loops = list(loops[k:]) if not op.is_reduce else []
    if not row_loops:  # a single row: a unit loop above everything carries the grid
        row_loops = [sch.add_unit_loop(loops[0] if len(loops) else root)]
    n_outer = len(row_loops)
    for name in reversed(members):
        member = sch.get_sblock(name)
        sch.compute_at(member, row_loops[-1], preserve_unit_loops=True)
        _member_inner(sch, member, n_outer, plan.threads_x)
    if not inner_loops:
        inner_loops = [sch.add_unit_loop(root)]
    _bind_inner(sch, inner_loops, plan.threads_x)
    fused = sch.fuse(*row_loops) if len(row_loops) > 1 else row_loops[0]
    return _split_rows(sch, fused, stage, plan.grid, plan.rows_per_block, None)


def _schedule_flat_stage(sch, stage: Stage, plan: StitchPlan):
    root = sch.get_sblock(stage.root)
    loops = sch.get_loops(root)
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    return _split_rows(sch, fused, stage, plan.grid, plan.rows_per_block, plan.threads_x)


def zero_unit_bindings(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Bind every block iterator with a domain of extent 1 to the constant 0.

    Always valid (a binding must stay inside the iterator's domain whenever the block runs). It
    keeps a one-row stage's register buffers indexed by a literal 0 under a predicated row
    split, which TVM's cross-thread reduction lowering requires.
    """
    def on_realize(realize, mutator):
        new = mutator.default_mutate(realize)
        values = list(new.iter_values)
        changed = False
        for k, iv in enumerate(new.block.iter_vars):
            ext = iv.dom.extent
            if isinstance(ext, tirx.IntImm) and int(ext.value) == 1 and not (
                    isinstance(values[k], tirx.IntImm) and int(values[k].value) == 0):
                values[k] = tirx.const(0, str(values[k].ty))
                changed = True
        return tvm.s_tir.SBlockRealize(values, new.predicate, new.block) if changed else new

    return func.with_body(tvm_ffi.structural_mutate(func.body, (tvm.s_tir.SBlockRealize, on_realize)))


def build_schedule(plan: StitchPlan) -> tirx.PrimFunc:
    """Realize ``plan`` (see the module docstring); returns the scheduled PrimFunc.

    The result carries ``tirx.is_scheduled`` and, for kernels with a grid barrier,
    ``"tvm_ext.min_blocks_per_sm"`` (the launch bound).

    Raises
    ------
    StitchScheduleError
        A schedule primitive refused the plan.
    """
    if plan.inlined_func is None or plan.graph is None:
        raise StitchScheduleError("the plan carries no function to schedule")
    sch = tvm.s_tir.Schedule(plan.inlined_func)
    g1 = plan.graph
    try:
        for name in plan.ops_with_scheme("regional"):
            sch.set_scope(sch.get_sblock(name), 0, "local" if g1.op(name).is_reduce else "shared")
        grid_loops = []
        for stage in plan.stages:
            if stage.rows is not None:
                grid_loops.append(_schedule_row_stage(sch, g1, stage, plan))
            else:
                grid_loops.append(_schedule_flat_stage(sch, stage, plan))
        bx = sch.merge(*grid_loops) if len(grid_loops) > 1 else grid_loops[0]
        sch.bind(bx, "blockIdx.x")
    except TVM_ERRORS as err:
        raise StitchScheduleError(f"schedule failed: {str(err).splitlines()[0][:300]}") from None
    func = zero_unit_bindings(sch.mod["main"])
    func, barriers = insert_grid_sync(func)
    if barriers != 0 and not plan.needs_grid_sync:
        raise StitchScheduleError("the kernel needs a grid barrier the plan did not foresee")
    func = func.with_attr("tirx.is_scheduled", True)
    if barriers:
        func = func.with_attr(MIN_BLOCKS_ATTR, plan.launch.blocks_per_sm)
    return func


__all__ = ["StitchScheduleError", "build_schedule"]
