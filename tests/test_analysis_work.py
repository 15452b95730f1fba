"""Planned work counted on TIR: loops multiplied out, expression DAGs walked once."""
from __future__ import annotations

import pytest
from tvm import tirx
from tvm.script import tirx as T

from tvm_ext.analysis.work import ENUMERATION_LIMIT, Work, executed_work, function_work


@T.prim_func(s_tir=True)
def _exp_rows(x: T.Buffer((8, 16), "float32"), y: T.Buffer((8, 16), "float32")):
    for i, j in T.grid(8, 16):
        with T.sblock("y"):
            vi, vj = T.axis.remap("SS", [i, j])
            y[vi, vj] = T.exp(x[vi, vj]) + x[vi, vj]


def test_work_multiplies_loops_out():
    assert function_work(_exp_rows) == Work(transcendentals=128, global_loads=256, flops=128)


def test_a_shared_subexpression_dag_is_walked_once(monkeypatch):
    """A recurrence inlined 16 times shares each step twice: as a tree it has 2^16 leaves, as a
    DAG 16 nodes; each node is examined once."""
    import tvm_ext.analysis.work as work_module

    x = tirx.decl_buffer((4,), "float32", "x")
    y = tirx.decl_buffer((4,), "float32", "y")
    value = tirx.exp(tirx.BufferLoad(x, [tirx.IntImm("int32", 0)]))
    for _ in range(16):
        value = value + value
    func = tirx.PrimFunc([x, y], tirx.BufferStore(y, value, [tirx.IntImm("int32", 0)]))
    examined = []
    original = work_module._Counter._expr
    monkeypatch.setattr(work_module._Counter, "_expr", lambda self, e: examined.append(e) or original(self, e))
    work = function_work(func)
    assert work.transcendentals == 2 ** 16 and work.flops == 2 ** 16 - 1
    assert len(examined) < 40


@T.prim_func(s_tir=True)
def _one_thread_writes(x: T.Buffer((8,), "float32"), y: T.Buffer((8,), "float32")):
    """Each block's gate: one element computed by thread 0 of 256 (the rest idle at the guard)."""
    for b in T.thread_binding(8, thread="blockIdx.x"):
        for t in T.thread_binding(256, thread="threadIdx.x"):
            with T.sblock("gate"):
                vb = T.axis.spatial(8, b + t)
                T.where(t < 1)
                y[vb] = T.exp(x[vb])


@T.prim_func(s_tir=True)
def _nested_guards(x: T.Buffer((64,), "float32"), y: T.Buffer((64,), "float32")):
    for t in T.thread_binding(64, thread="threadIdx.x"):
        if t < 32:
            if t < 16:
                y[t] = T.exp(x[t])
            else:
                y[t] = x[t]


def test_executed_work_weighs_a_guard_by_the_threads_that_pass_it():
    assert function_work(_one_thread_writes).transcendentals == 8 * 256    # every thread, the larger side
    assert executed_work(_one_thread_writes) == Work(transcendentals=8, global_loads=8, flops=0)


def test_nested_guards_are_conditioned_on_the_enclosing_ones():
    """t < 16 inside t < 32 holds for half of the threads that reach it, 16 of 64 in all."""
    work = executed_work(_nested_guards)
    assert work.transcendentals == 16 and work.global_loads == 32


@T.prim_func(s_tir=True)
def _few_of_a_large_grid(x: T.Buffer((768,), "float32"), y: T.Buffer((768,), "float32")):
    """A stage of 768 elements on a resident grid of 264 x 1024 threads (the ViT and LSTM stitched
    kernels): 270,336 thread positions, past what is enumerated."""
    for b in T.thread_binding(264, thread="blockIdx.x"):
        for t in T.thread_binding(1024, thread="threadIdx.x"):
            if b * 1024 + t < 768:
                y[b * 1024 + t] = T.tanh(x[b * 1024 + t])


def test_a_guard_on_a_domain_past_the_enumeration_limit_is_sampled():
    assert 264 * 1024 > ENUMERATION_LIMIT
    work = executed_work(_few_of_a_large_grid)
    assert work.transcendentals == pytest.approx(768, rel=0.1)      # not 270,336: one per thread
    assert work.global_loads == pytest.approx(768, rel=0.1)
    assert executed_work(_few_of_a_large_grid) == work              # a fixed seed


def test_a_guard_over_an_unbounded_value_counts_as_taken():
    """A data-dependent guard cannot be enumerated: the count keeps every iteration (an overstatement)."""
    x = tirx.decl_buffer((4,), "float32", "x")
    y = tirx.decl_buffer((4,), "float32", "y")
    i = tirx.Var("i", "int32")
    zero = tirx.IntImm("int32", 0)
    body = tirx.For(i, zero, tirx.IntImm("int32", 4), tirx.ForKind.SERIAL,
                    tirx.IfThenElse(tirx.BufferLoad(x, [i]) > tirx.FloatImm("float32", 0.0),
                                    tirx.BufferStore(y, tirx.exp(tirx.BufferLoad(x, [i])), [i]), None))
    assert executed_work(tirx.PrimFunc([x, y], body)).transcendentals == 4
