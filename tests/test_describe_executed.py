"""A built kernel that executes more than its function plans is priced from what it executes (issue 36)."""
from __future__ import annotations

import pytest
import tvm
from tvm import te

from tvm_ext.analysis.work import TRANSCENDENTAL_FLOPS
from tvm_ext.graph import func_flops
from tvm_ext.hardware import load_device
from tvm_ext.select.analytic import AnalyticCostModel
from tvm_ext.select.describe import describe_scheduled

ROWS, K = 256, 1024


def activation_then_scale() -> tvm.tirx.PrimFunc:
    """out[i, j] = tanh(x[j]) * w[i, j]: the activation computed once per column."""
    x = te.placeholder((K,), name="x")
    w = te.placeholder((ROWS, K), name="w")
    y = te.compute((K,), lambda j: te.tanh(x[j]), name="y")
    out = te.compute((ROWS, K), lambda i, j: y[j] * w[i, j], name="out")
    return te.create_prim_func([x, w, out])


def _bind(sch: tvm.s_tir.Schedule, block: str) -> None:
    i, j = sch.get_loops(sch.get_sblock(block))[-2:]
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")


def recomputing() -> tvm.tirx.PrimFunc:
    """tanh inlined into every row: each of 256 rows recomputes all 1024 activations."""
    sch = tvm.s_tir.Schedule(activation_then_scale())
    sch.compute_inline(sch.get_sblock("y"))
    _bind(sch, "out")
    return sch.mod["main"]


def planned_once() -> tvm.tirx.PrimFunc:
    """The same computation with the activation in its own kernel (computed once)."""
    sch = tvm.s_tir.Schedule(activation_then_scale())
    j_o, j_i = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, 256])
    sch.bind(j_o, "blockIdx.x")
    sch.bind(j_i, "threadIdx.x")
    _bind(sch, "out")
    return sch.mod["main"]


def test_a_recomputing_kernel_is_priced_from_its_executed_work():
    graph = activation_then_scale()
    kernel = describe_scheduled(graph, recomputing())
    planned = ROWS * K + TRANSCENDENTAL_FLOPS * K                 # the multiplies, tanh once per column
    executed = ROWS * K + TRANSCENDENTAL_FLOPS * ROWS * K         # tanh once per element
    assert kernel.recomputes
    assert kernel.executed_flops_ratio == pytest.approx(executed / planned)
    assert kernel.flops == int(func_flops(graph) * executed / planned)
    device = load_device("h100")
    model = AnalyticCostModel()
    once = describe_scheduled(graph, planned_once())
    assert not once.recomputes and once.flops == func_flops(graph)
    assert model.parts(kernel, device)["compute_s"] > 5 * model.parts(once, device)["compute_s"]
