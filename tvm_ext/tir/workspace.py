"""Global workspaces: intermediates a kernel keeps in global memory become parameters.

A CUDA kernel cannot allocate global memory, so a scheduled function's ``global``-scope
allocations (values one stage of a multi-stage kernel hands to the next) become trailing
parameters; the Relax VM allocates them at the call site (the schedule stage appends them to
the ``call_tir`` outputs).

Example
-------
>>> func, workspaces = promote_workspace(scheduled)
>>> [w.name for w in workspaces]
['T_softmax_maxelem_intermediate']
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx


def buffer_scope(buffer) -> str:
    """The storage scope of ``buffer`` (``"global"`` when it has none)."""
    return str(getattr(buffer.ty, "storage_scope", "") or "global")


def global_workspaces(func: tirx.PrimFunc) -> list:
    """Buffers allocated in global scope inside ``func`` (intermediates a kernel cannot allocate)."""
    found: list = []

    def on_block(block) -> None:
        for buf in block.alloc_buffers:
            if buffer_scope(buf) == "global":
                found.append(buf)

    tvm_ffi.structural_walk(func.body, (tvm.s_tir.SBlock, on_block))
    return found


def promote_workspace(func: tirx.PrimFunc) -> tuple[tirx.PrimFunc, list]:
    """Move global allocations of ``func`` to new trailing parameters; returns them too."""
    buffers = global_workspaces(func)
    if not buffers:
        return func, []
    drop = set(buffers)

    def on_block(block, mutator):
        new = mutator.default_mutate(block)
        kept = [b for b in new.alloc_buffers if b not in drop]
        if len(kept) == len(new.alloc_buffers):
            return new
        return tvm.s_tir.SBlock(new.iter_vars, new.reads, new.writes, new.name_hint, new.body, new.init,
                                kept, new.match_buffers, new.annotations)

    body = tvm_ffi.structural_mutate(func.body, (tvm.s_tir.SBlock, on_block))
    new_func = tirx.PrimFunc(list(func.params) + buffers, body, func.ret_type, func.attrs)
    return new_func, buffers


__all__ = ["global_workspaces", "promote_workspace"]
