"""Block barriers after shared-memory values that some threads write and others read.

TVM's ``ThreadSync`` decides whether two shared-memory accesses need a ``__syncthreads`` between
them by comparing their indices, and takes the same index for the same thread ("assumes no race
between threads"). That holds only when the index tells the threads apart. A value written at an
index that does not depend on every thread dimension of the kernel is written by one thread (or
redundantly by several) and read by others at the *same* index, and ThreadSync leaves it
unsynchronized:

* a reduction over ``threadIdx.x`` into shared memory (a layer norm's row sum on
  ``threadIdx.y``): TVM's cross-thread reduction lowering has lane 0 store ``sum[threadIdx.y]``
  after the allreduce, and the row's other lanes (or a later stage's threads) read it with no
  barrier between;
* a value of one element per row written by ``threadIdx.x < 1`` (stitch's squeeze-excite gate).

:func:`sync_shared_broadcasts` puts a ``tvm_storage_sync("shared")`` after each such writer, at
the innermost statement sequence that every thread of the block reaches (never under a block
predicate or a branch, where a barrier would deadlock). The schedule stage applies it to every
kernel a generator schedules; :class:`SyncSharedBroadcasts` runs it in the ``"tvm_ext"`` TIR
pipeline for every other scheduled function (hand-written TIR, dlight).

Example
-------
>>> synced = sync_shared_broadcasts(scheduled)     # a scheduled s_tir PrimFunc
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlockRealize

from ..ir_update import with_functions
from .predicates import is_true
from .substitute import vars_of
from .workspace import buffer_scope

_SHARED = ("shared", "shared.dyn")


def _thread_tag(loop: tirx.For) -> str | None:
    if loop.thread_binding is None:
        return None
    tag = str(loop.thread_binding.thread_tag)
    return tag if tag.startswith("threadIdx") else None


def _kernel_threads(body) -> set[str]:
    """The thread dimensions (``threadIdx.*``) a kernel runs with more than one thread in."""
    tags: set[str] = set()

    def on_for(loop) -> None:
        tag = _thread_tag(loop)
        if tag and not (isinstance(loop.extent, tirx.IntImm) and int(loop.extent.value) == 1):
            tags.add(tag)
    tvm_ffi.structural_walk(body, (tirx.For, on_for))
    return tags


def _broadcasts(realize: SBlockRealize, tags_of: dict, threads: set[str]) -> bool:
    """Whether ``realize`` writes shared memory at an index that leaves some thread dimension out."""
    block = realize.block
    bound = {iv.var: vars_of([value]) for iv, value in zip(block.iter_vars, realize.iter_values)}
    for region in block.writes:
        if buffer_scope(region.source) not in _SHARED:
            continue
        loops: set = set()
        for var in vars_of([r.min for r in region.region]):
            loops |= bound.get(var, {var})
        used = {tags_of[v] for v in loops if v in tags_of}
        if threads - used:
            return True
    return False


def _is_sync(stmt) -> bool:
    return (isinstance(stmt, tirx.Evaluate) and isinstance(stmt.value, tvm.ir.Call)
            and isinstance(stmt.value.op, tvm.ir.Op) and stmt.value.op.name == "tirx.tvm_storage_sync")


def _sync() -> tirx.Stmt:
    return tirx.Evaluate(tirx.call_intrin("void", "tirx.tvm_storage_sync", "shared"))


class _Inserter:
    def __init__(self, threads: set[str]):
        self.threads = threads
        self.tags_of: dict = {}       # loop variable -> thread tag, for the enclosing thread loops
        self.inserted = 0

    def visit(self, stmt, uniform: bool):
        """``(new statement, whether it holds a writer still owed a barrier)``."""
        if isinstance(stmt, tirx.SeqStmt):
            out, owed_any = [], False
            items = list(stmt.seq)
            for k, item in enumerate(items):
                new, owed = self.visit(item, uniform)
                out.append(new)
                if owed and uniform:
                    if not (k + 1 < len(items) and _is_sync(items[k + 1])):
                        out.append(_sync())
                        self.inserted += 1
                else:
                    owed_any |= owed
            return tirx.SeqStmt(out), owed_any
        if isinstance(stmt, tirx.For):
            tag = _thread_tag(stmt)
            if tag:
                self.tags_of[stmt.loop_var] = tag
            constant = isinstance(stmt.extent, tirx.IntImm) and isinstance(stmt.min, tirx.IntImm)
            body, owed = self.visit(stmt.body, uniform and (constant or tag is not None))
            return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding,
                            stmt.annotations), owed
        if isinstance(stmt, SBlockRealize):
            predicated = not is_true(stmt.predicate)
            block = stmt.block
            body, owed = self.visit(block.body, uniform and not predicated)
            owed = owed or _broadcasts(stmt, self.tags_of, self.threads)
            new_block = tvm.s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body,
                                         block.init, block.alloc_buffers, block.match_buffers, block.annotations)
            return SBlockRealize(stmt.iter_values, stmt.predicate, new_block), owed
        if isinstance(stmt, tirx.IfThenElse):
            then, owed_then = self.visit(stmt.then_case, False)
            other, owed_else = (self.visit(stmt.else_case, False) if stmt.else_case is not None else (None, False))
            return tirx.IfThenElse(stmt.condition, then, other), owed_then or owed_else
        if isinstance(stmt, tirx.AttrStmt):
            body, owed = self.visit(stmt.body, uniform)
            return tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body), owed
        return stmt, False


def sync_shared_broadcasts(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` (a scheduled ``s_tir`` PrimFunc) with a block barrier after every shared-memory
    write whose index leaves out a thread dimension of the kernel (see the module docstring);
    ``func`` itself when there is none."""
    threads = _kernel_threads(func.body)
    if not threads:
        return func
    inserter = _Inserter(threads)
    body, _ = inserter.visit(func.body, True)
    return func.with_body(body) if inserter.inserted else func


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.SyncSharedBroadcasts")
class SyncSharedBroadcasts:
    """:func:`sync_shared_broadcasts` on every scheduled PrimFunc of a module."""

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc) and func.attrs is not None and func.attrs.get("tirx.is_scheduled"):
                synced = sync_shared_broadcasts(func)
                if not synced.same_as(func):
                    updates[gv] = synced
        return with_functions(mod, updates)


__all__ = ["SyncSharedBroadcasts", "sync_shared_broadcasts"]
