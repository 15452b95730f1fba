"""Merging scheduled stage kernels into one multi-stage kernel (SOUFFLE §6, persistent blocks).

Each scheduled stage function holds one or more kernels: loop nests that start with their
``blockIdx`` loops. The merged kernel launches ``grid`` blocks (all resident, so it can be
launched cooperatively) with the stages' common thread shape, and runs every stage kernel in
turn. A stage kernel of ``G`` blocks becomes *virtual blocks*: block ``bx`` runs blocks
``bx, bx + grid, ...`` below ``G``; the stage's ``blockIdx`` loop variables are decoded from that
linear index (``blockIdx.y``-major, as its loops were nested). The trip count is the same for
every thread of a block, so the stage's own ``__syncthreads`` stay safe.

Between stages, :func:`tvm_ext.tir.insert_grid_sync` puts a grid barrier where a stage reads or
overwrites global data an earlier one wrote; values passed between stages are global
workspaces (extra parameters, :func:`tvm_ext.tir.promote_workspace`). The kernel carries
``"tvm_ext.min_blocks_per_sm"``, so its launch bound keeps ``grid`` blocks resident.

Example
-------
>>> merged = merge_stages(fused, [scheduled_qkv, scheduled_softmax], grid=264, blocks_per_sm=2)
>>> merged.grid_syncs
1
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import tirx

from ..tir import MIN_BLOCKS_ATTR, insert_grid_sync, is_block_binding, promote_workspace
from ..tir.predicates import conjoin
from ..tir.workspace import buffer_scope
from ..tir.substitute import substitute_vars
from ..tir.thread_reductions import thread_bound_reductions
from .stages import StageError, root_block
from .uniform import ThreadShape, thread_shape


@dataclass(frozen=True)
class StageKernel:
    """One kernel of a scheduled stage: its ``blockIdx`` loops (outermost first) and what they hold."""

    block_loops: tuple
    body: tirx.Stmt

    @property
    def grid(self) -> int:
        """Blocks of its own launch."""
        total = 1
        for loop in self.block_loops:
            total *= int(loop.extent.value)
        return total


@dataclass(frozen=True)
class MergedKernel:
    """The merged function, the workspaces it needs, and its launch facts."""

    func: tirx.PrimFunc
    grid: int
    threads: ThreadShape
    grid_syncs: int
    stage_grids: tuple[int, ...]
    workspaces: list = field(default_factory=list)


def _peel(stmt: tirx.Stmt) -> StageKernel:
    loops = []
    node = stmt
    while isinstance(node, tirx.For) and is_block_binding(node):
        if not isinstance(node.extent, tirx.IntImm):
            raise StageError("a stage kernel's grid is not static")
        loops.append(node)
        node = node.body
    if not loops:
        raise StageError("a stage statement does not start with its blockIdx loops")
    return StageKernel(tuple(loops), node)


def stage_kernels(func: tirx.PrimFunc) -> tuple[list[StageKernel], list]:
    """The kernels of a scheduled stage function and its root allocations."""
    root = root_block(func)
    body = root.body
    stmts = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
    return [_peel(s) for s in stmts], list(root.alloc_buffers)


def _virtual(kernel: StageKernel, bx: tvm.ir.Var, grid: int) -> tirx.Stmt:
    """``kernel`` run as virtual blocks of a ``grid``-block launch whose block index is ``bx``.

    Block ``bx`` runs the virtual blocks ``bx + k * grid``, ``k < ceil(own / grid)``: a loop of a
    constant trip count, unconditional, so every thread of the block reaches every barrier and
    TVM's ``LowerCrossThreadReduction`` still lowers the reductions over thread-bound loops to
    allreduces (with a trip count computed from ``blockIdx.x`` it leaves them as plain
    read-modify-writes that every thread runs at once: the H200's wrong MMoE outputs). Where
    ``own`` is no multiple of ``grid``, the blocks past the end decode ``linear mod own`` (a
    ``min`` clamp would make the block bindings non-affine, and the reduction lowering skips
    those too). The loop is never unrolled (``pragma_auto_unroll_max_step`` 0): TVM unifies the
    stages' thread bindings and lifts one stage's unroll pragma over all of them, which unrolled
    whole stages (a merged kernel of 500 KB of CUDA) and, where a stage's allreduce was unrolled
    with its loop, made ``LowerThreadAllreduce`` fail on the repeated reduction buffer. And:

    * where no reduction over a thread-bound loop writes global memory, every block of theirs is
      predicated off (``linear < own``, uniform per block: the loops and barriers still run);
      without it they would redo virtual block ``linear mod own``, a 392-block stage in a
      2112-block grid executed 5.4 times over (MobileNet-V2's first convolution);
    * where one does, they redo virtual block ``linear mod own``: the same values to the same
      addresses. TVM's allreduce write-back does not carry the reduction block's predicate, so a
      predicated-off block would write its identity-valued result over block ``linear mod own``'s
      (ViT-B/16's patch embedding, found by ``tvm-ext verify``; into shared or local memory it
      stays in the block). An ``if`` around the stage is no way out: TVM's ``ThreadSync`` refuses
      barriers under one.
    """
    own = kernel.grid
    dtype = str(bx.ty.dtype)
    vb = tvm.ir.Var("vb", bx.ty)
    trips = -(-own // grid)
    linear = vb * tirx.IntImm(dtype, grid) + bx
    if own % grid:
        linear = tvm.tirx.floormod(linear, tirx.IntImm(dtype, own))   # quasi-affine, unlike a min
    mapping: dict = {}
    rest = linear
    for loop in reversed(kernel.block_loops):
        ext = int(loop.extent.value)
        value = rest % tirx.IntImm(dtype, ext) if ext > 1 else tirx.IntImm(dtype, 0)
        rest = rest // tirx.IntImm(dtype, ext)
        var = loop.loop_var
        mapping[var] = value if str(var.ty.dtype) == dtype else tirx.Cast(str(var.ty.dtype), value)
    body = substitute_vars(kernel.body, mapping)
    if trips * grid > own and not _reduces_into_global(body):
        body = _predicated(body, vb * tirx.IntImm(dtype, grid) + bx < tirx.IntImm(dtype, own))
    return tirx.For(vb, tirx.IntImm(dtype, 0), tirx.IntImm(dtype, trips), tirx.ForKind.SERIAL, body,
                    annotations={"pragma_auto_unroll_max_step": 0})


def _reduces_into_global(body: tirx.Stmt) -> bool:
    """Whether a reduction over a thread-bound loop in ``body`` writes a global buffer (its
    allreduce's write-back then lands in memory other blocks own; one into shared or local memory
    stays in its block, whose consumers are predicated off with it)."""
    return any(buffer_scope(region.source) == "global"
               for block in thread_bound_reductions(body) for region in block.writes)


def _predicated(body: tirx.Stmt, condition: tirx.PrimExpr) -> tirx.Stmt:
    """``body`` with ``condition`` added to the predicate of every block it realizes."""

    def on_realize(realize):
        return tvm.s_tir.SBlockRealize(realize.iter_values, conjoin([realize.predicate, condition]), realize.block)

    return tvm_ffi.structural_map(body, (tvm.s_tir.SBlockRealize, on_realize))


def _param_mapping(scheduled: tirx.PrimFunc, unscheduled: tirx.PrimFunc) -> dict:
    if len(scheduled.params) != len(unscheduled.params):
        raise StageError("a scheduled stage changed its parameters")
    return {s: u for s, u in zip(scheduled.params, unscheduled.params) if not s.same_as(u)}


def merge_stages(fused: tirx.PrimFunc, stages: list[tuple[tirx.PrimFunc, tirx.PrimFunc]], grid: int,
                 blocks_per_sm: int) -> MergedKernel:
    """Merge scheduled stages of ``fused`` into one kernel of ``grid`` blocks (module docstring).

    Parameters
    ----------
    fused : tirx.PrimFunc
        The unscheduled fused function the stages were cut from (its parameters and root
        allocations are the merged function's).
    stages : list of (scheduled, unscheduled) PrimFunc pairs
        In execution order; each scheduled function's kernels all use one thread shape.
    grid : int
        Blocks of the merged launch (all resident at ``blocks_per_sm`` blocks per SM).
    blocks_per_sm : int
        The launch bound the merged kernel carries.

    Raises
    ------
    StageError
        The stages' thread shapes differ, or a stage is not a sequence of kernels.
    """
    shapes = {thread_shape(s) for s, _ in stages}
    if len(shapes) != 1:
        raise StageError(f"stages use different thread shapes: {sorted((s.x, s.y) for s in shapes)}")
    (shape,) = shapes
    kernels: list[StageKernel] = []
    allocs = list(root_block(fused).alloc_buffers)
    for scheduled, unscheduled in stages:
        mapping = _param_mapping(scheduled, unscheduled)
        scheduled = scheduled.with_body(substitute_vars(scheduled.body, mapping)) if mapping else scheduled
        own, own_allocs = stage_kernels(scheduled)
        allocs += own_allocs
        kernels += own
    first = kernels[0].block_loops[0]
    bx = tvm.ir.Var("bx", first.loop_var.ty)
    dtype = str(first.loop_var.ty.dtype)
    body = tirx.SeqStmt([_virtual(k, bx, grid) for k in kernels]) if len(kernels) > 1 else _virtual(kernels[0], bx, grid)
    iv = tirx.IterVar(tvm.ir.Range(tirx.IntImm(dtype, 0), tirx.IntImm(dtype, grid)), bx,
                      tirx.IterVar.ThreadIndex, "blockIdx.x")
    loop = tirx.For(bx, tirx.IntImm(dtype, 0), tirx.IntImm(dtype, grid), tirx.ForKind.THREAD_BINDING, body, iv)
    root = root_block(fused)
    used = _used_vars(loop)
    kept = [b for b in dict.fromkeys(allocs) if b in used]
    block = tvm.s_tir.SBlock(root.iter_vars, [], [], "root", loop, None, kept,
                             root.match_buffers, root.annotations)
    func = tirx.PrimFunc(list(fused.params), tvm.s_tir.SBlockRealize([], True, block), fused.ret_type, fused.attrs)
    func, syncs = insert_grid_sync(func)
    func, workspaces = promote_workspace(func)
    func = func.with_attr("tirx.is_scheduled", True).with_attr(MIN_BLOCKS_ATTR, int(blocks_per_sm))
    return MergedKernel(func, grid, shape, syncs, tuple(k.grid for k in kernels), workspaces)


def _used_vars(stmt) -> set:
    out: set = set()
    tvm_ffi.structural_walk(stmt, (tvm.ir.Var, out.add))
    return out


__all__ = ["MergedKernel", "StageKernel", "merge_stages", "stage_kernels"]
