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


def _vars(expr) -> list:
    found: list = []
    tvm_ffi.structural_walk(expr, (tvm.ir.Var, found.append))
    return found


def unguarded_write_backs(stmt: tirx.Stmt) -> list[str]:
    """Thread-bound reductions in ``stmt`` whose block predicate constrains more than their
    reduction loops: TVM's ``LowerCrossThreadReduction`` guards the reduction by the predicate but
    not its write-back (``if threadIdx.x == 0: out[...] = red_result``), so every block and thread
    the predicate excludes still stores, at indices the schedule never meant (YOLOv5's dlight-built
    conv + concatenate: a shared tile written at a negative index). Names, in order found."""
    found: list[str] = []

    def on_loop(loop) -> None:
        tag = str(loop.thread_binding.thread_tag) if loop.thread_binding is not None else ""
        if not tag.startswith("threadIdx"):
            return

        def on_realize(realize) -> None:
            block = realize.block
            if block.init is None or block.name_hint in found:
                return
            reduce = [v for iv, value in zip(block.iter_vars, realize.iter_values)
                      if iv.iter_type == tirx.IterVar.CommReduce for v in _vars(value)]
            if not any(v.same_as(loop.loop_var) for v in reduce):
                return
            predicate = realize.predicate
            if isinstance(predicate, tirx.IntImm) and predicate.value:
                return
            if any(not any(v.same_as(r) for r in reduce) for v in _vars(predicate)):
                found.append(block.name_hint)

        tvm_ffi.structural_walk(loop.body, (tvm.s_tir.SBlockRealize, on_realize))

    tvm_ffi.structural_walk(stmt, (tirx.For, on_loop))
    return found


__all__ = ["thread_bound_reductions", "unguarded_write_backs"]
