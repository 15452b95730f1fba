"""Reductions over thread-bound loops: the blocks TVM lowers to cross-thread allreduces.

TVM's ``LowerCrossThreadReduction`` turns a reduction block whose reduction iterator runs over a
``threadIdx`` loop into an allreduce (shuffles and shared staging) and a write-back of its result.
Two consumers need to find those blocks: the allreduce lint (a block the lowering left as it was
is a racy read-modify-write) and subprogram's virtual blocks (the write-back is not under the
reduction block's predicate, so a stage with one cannot be predicated off block by block).

Example
-------
>>> [b.name_hint for b in thread_bound_reductions(scheduled.body)]
['T_softmax_maxelem', 'T_softmax_expsum']
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx


def _uses(expr, var) -> bool:
    hits: list = []
    tvm_ffi.structural_walk(expr, (tvm.ir.Var, lambda v: hits.append(v) if v.same_as(var) else None))
    return bool(hits)


def thread_bound_reductions(stmt: tirx.Stmt) -> list:
    """The reduction blocks (``SBlock``, with an init) in ``stmt`` whose reduction iterators use a
    ``threadIdx``-bound loop, in the order they are found, each once."""
    found: list = []

    def on_loop(loop) -> None:
        tag = str(loop.thread_binding.thread_tag) if loop.thread_binding is not None else ""
        if not tag.startswith("threadIdx"):
            return
        var = loop.loop_var

        def on_realize(realize) -> None:
            block = realize.block
            if block.init is None or any(block.same_as(b) for b in found):
                return
            for iv, value in zip(block.iter_vars, realize.iter_values):
                if iv.iter_type == tirx.IterVar.CommReduce and _uses(value, var):
                    found.append(block)
                    return

        tvm_ffi.structural_walk(loop.body, (tvm.s_tir.SBlockRealize, on_realize))

    tvm_ffi.structural_walk(stmt, (tirx.For, on_loop))
    return found


__all__ = ["thread_bound_reductions"]
