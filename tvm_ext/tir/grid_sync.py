"""Grid-barrier insertion: a TIR pass that puts ``tirx.cuda.grid_sync`` between kernel stages.

A *stage* is a top-level statement of a kernel body, i.e. a child of the statement sequence
directly under the ``blockIdx`` binding (after unwrapping allocations and attributes). When a
stage touches a global buffer (a parameter, or an allocation in global scope) that an earlier
stage since the last barrier wrote, or writes one that an earlier stage read, every block must
wait for every other block: a grid-wide barrier goes before that stage. Stages that do not
conflict (remote-stitched independent work, or producers whose consumers read the data from
shared memory) get none.

The barrier is only safe if every block of the grid is resident at once; such kernels must be
launched cooperatively (:mod:`tvm_ext.tir.launch_params`), which makes the driver refuse an
oversized grid instead of deadlocking.

Works on scheduled ``s_tir`` PrimFuncs (``T.thread_binding`` loops) and on lowered ones
(``T.launch_thread``).

Example
-------
>>> func, count = insert_grid_sync(scheduled_func)
>>> count
1
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.backend.cuda import op as cuda_op

GRID_SYNC_OP = "tirx.cuda.grid_sync"


def is_block_binding(node) -> bool:
    """Whether ``node`` binds ``blockIdx``: a thread-bound ``For`` (scheduled) or a ``thread_extent``
    attribute (lowered); each such binding is one kernel."""
    if isinstance(node, tirx.For) and node.thread_binding is not None:
        return str(node.thread_binding.thread_tag).startswith("blockIdx")
    if isinstance(node, tirx.AttrStmt) and node.attr_key == "thread_extent":
        return str(node.node.thread_tag).startswith("blockIdx")
    return False


def _is_grid_sync(node) -> bool:
    return isinstance(node, tvm.ir.Call) and isinstance(node.op, tvm.ir.Op) and node.op.name == GRID_SYNC_OP


def has_grid_sync(node) -> bool:
    """Whether ``node`` (a PrimFunc or statement) contains a grid barrier."""
    found = []
    root = node.body if isinstance(node, tirx.PrimFunc) else node
    tvm_ffi.structural_walk(root, (tvm.ir.Call, lambda c: found.append(c) if _is_grid_sync(c) else None))
    return bool(found)


def _scope(buffer) -> str:
    ty = getattr(buffer, "ty", None)
    scope = str(getattr(ty, "storage_scope", "") or "")
    return scope or "global"


def _accesses(stmt, global_buffers: set) -> tuple[set, set]:
    reads: set = set()
    writes: set = set()

    def on_load(load) -> None:
        if load.source in global_buffers or _scope(load.source) == "global":
            reads.add(load.source)

    def on_store(store) -> None:
        if store.buffer in global_buffers or _scope(store.buffer) == "global":
            writes.add(store.buffer)

    tvm_ffi.structural_walk(stmt, [(tvm.ir.TensorLoad, on_load), (tirx.BufferStore, on_store)])
    return reads, writes


def _sync_stmt() -> tirx.Stmt:
    return tirx.Evaluate(cuda_op.cuda_grid_sync())


def _with_barriers(seq: tirx.SeqStmt, global_buffers: set) -> tuple[tirx.Stmt, int]:
    out: list = []
    written: set = set()
    read: set = set()
    count = 0
    for stmt in seq.seq:
        if isinstance(stmt, tirx.Evaluate) and _is_grid_sync(stmt.value):
            written, read = set(), set()
            out.append(stmt)
            continue
        r, w = _accesses(stmt, global_buffers)
        if (written & (r | w)) or (read & w):
            out.append(_sync_stmt())
            count += 1
            written, read = set(), set()
        written |= w
        read |= r
        out.append(stmt)
    return tirx.SeqStmt(out), count


def _rewrite_kernel_body(body, global_buffers: set) -> tuple[tirx.Stmt, int]:
    """Find the stage sequence below wrappers (nested block bindings, attributes) and fill it."""
    if isinstance(body, tirx.SeqStmt):
        return _with_barriers(body, global_buffers)
    wrapper = is_block_binding(body) or (isinstance(body, tirx.AttrStmt) and body.attr_key != "thread_extent")
    if wrapper:
        inner, count = _rewrite_kernel_body(body.body, global_buffers)
        return _replace_body(body, inner), count
    return body, 0


def _replace_body(node, body):
    if isinstance(node, tirx.For):
        return tirx.For(node.loop_var, node.min, node.extent, node.kind, body, node.thread_binding,
                        node.annotations)
    return tirx.AttrStmt(node.node, node.attr_key, node.value, body)


def _global_buffers(func: tirx.PrimFunc) -> set:
    buffers = set(func.params)

    def on_block(block) -> None:
        for buf in block.alloc_buffers:
            if _scope(buf) == "global":
                buffers.add(buf)

    tvm_ffi.structural_walk(func.body, (tvm.s_tir.SBlock, on_block))
    return buffers


def insert_grid_sync(func: tirx.PrimFunc) -> tuple[tirx.PrimFunc, int]:
    """Insert grid barriers into every kernel of ``func`` (see the module docstring).

    Returns
    -------
    (tvm.tirx.PrimFunc, int)
        The rewritten function and the number of barriers inserted.
    """
    global_buffers = _global_buffers(func)
    total = 0

    def on_kernel(node, mutator):
        nonlocal total
        if not is_block_binding(node):
            return mutator.default_mutate(node)
        new_body, count = _rewrite_kernel_body(node.body, global_buffers)
        total += count
        return _replace_body(node, new_body)

    body = tvm_ffi.structural_mutate(func.body, ((tirx.For, tirx.AttrStmt), on_kernel))
    return func.with_body(body), total


@tirx.transform.prim_func_pass(opt_level=0, name="tvm_ext.InsertGridSync")
class InsertGridSync:
    """PrimFunc pass form of :func:`insert_grid_sync` (no-op on kernels without conflicts)."""

    def transform_function(self, func, mod, ctx):  # noqa: D102 - pass protocol
        new_func, count = insert_grid_sync(func)
        return new_func if count else func


__all__ = ["GRID_SYNC_OP", "InsertGridSync", "has_grid_sync", "insert_grid_sync", "is_block_binding"]
