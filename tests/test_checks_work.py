"""Planned work counted on TIR: loops multiplied out, expression DAGs walked once."""
from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from tvm_ext.checks.work import Work, function_work


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
    import tvm_ext.checks.work as work_module

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
