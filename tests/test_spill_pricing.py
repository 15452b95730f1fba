"""A kernel that spills is priced with its spill traffic, in the report and in the selection.

ptxas decides registers; a plan cannot know them. The driver compiles the scheduled kernels
once, attaches ptxas's facts, prices the spills, and re-runs a cost-based selection whose chosen
kernels spill, so such a kernel stays only where it still pays.
"""
from __future__ import annotations

import dataclasses

import pytest
import tvm
from test_select import Small
from tvm import tirx
from tvm.script import tirx as T

from tvm_ext.driver import Preset, build, ptxas_facts
from tvm_ext.driver.ptxas_facts import attach_built_facts
from tvm_ext.hardware import load_device
from tvm_ext.inspect.render import summary_lines
from tvm_ext.inspect.report import report_from_stages
from tvm_ext.select import Candidate, LaunchShape
from tvm_ext.select.analytic import AnalyticCostModel
from tvm_ext.select.built_facts import (
    BUILT_FACTS_ATTR,
    BuiltFacts,
    built_facts,
    spill_traffic,
    with_spills,
)
from tvm_ext.select.candidate import CodePath, StageWork
from tvm_ext.select.describe import describe_scheduled
from tvm_ext.toolchain import KernelUsage, nvcc_available

H100 = tvm.target.Target("tvm_ext/h100")
DEVICE = load_device("h100")


@T.prim_func(s_tir=True)
def spiller(x: T.Buffer((131072,), "float32"), y: T.Buffer((131072,), "float32")):
    """128 live values per thread where 1024 threads per block leave ptxas 64 registers."""
    T.func_attr({"tirx.is_scheduled": True})
    for b in T.thread_binding(1, thread="blockIdx.x"):
        for t in T.thread_binding(1024, thread="threadIdx.x"):
            acc = T.alloc_buffer((128,), "float32", scope="local")
            for j in T.unroll(128):
                acc[j] = x[b * 131072 + t * 128 + j]
            for k in range(64):
                for j in T.unroll(128):
                    acc[j] = acc[j] * acc[(j + 1) % 128] + T.float32(1)
            for j in T.unroll(128):
                y[b * 131072 + t * 128 + j] = acc[j]


def _memory_bound(**changes) -> Candidate:
    base = Candidate(nodes=(0,), plan=None, inputs=("x",), outputs=("y",), flops=1 << 20, global_bytes=1 << 20,
                     launch=LaunchShape(grid=132, threads=256), code_path=CodePath.SIMT, dtype="float32")
    return dataclasses.replace(base, **changes)


def test_spill_traffic_is_every_thread_moving_its_spills_once():
    facts = BuiltFacts(registers=64, spill_stores=238, spill_loads=220)
    assert spill_traffic(facts, LaunchShape(grid=96, threads=256)) == 458 * 256 * 96
    assert spill_traffic(BuiltFacts(registers=40), LaunchShape(grid=96, threads=256)) == 0
    assert BuiltFacts.from_json(facts.to_json()) == facts


def test_a_spilling_kernel_costs_more_and_says_why():
    kernel = _memory_bound()
    facts = BuiltFacts(registers=255, spill_stores=4096, spill_loads=4096)
    spilled = with_spills(kernel, facts)
    assert spilled.global_bytes == kernel.global_bytes + 8192 * 256 * 132
    assert "priced with its spills" in spilled.provenance and "255 registers" in spilled.provenance
    model = AnalyticCostModel()
    l2 = DEVICE.level("l2").bandwidth_bytes_per_s      # local memory priced as global traffic through L2
    assert model.parts(spilled, DEVICE)["memory_s"] == pytest.approx(spilled.global_bytes / l2)
    assert model.cost(spilled, DEVICE).seconds > 5 * model.cost(kernel, DEVICE).seconds
    assert with_spills(kernel, BuiltFacts(registers=32)) is kernel


def test_a_multi_stage_kernel_spreads_its_spills_by_flops():
    stages = (StageWork(flops=3000, global_bytes=10, launch=LaunchShape(grid=4, threads=64)),
              StageWork(flops=1000, global_bytes=10, launch=LaunchShape(grid=4, threads=64)))
    kernel = _memory_bound(launch=LaunchShape(grid=4, threads=64), stages=stages)
    spilled = with_spills(kernel, BuiltFacts(registers=64, spill_stores=100, spill_loads=100))
    extra = 200 * 64 * 4
    assert [s.global_bytes for s in spilled.stages] == [10 + extra * 3 // 4, 10 + extra // 4]


@pytest.mark.skipif(not nvcc_available(), reason="nvcc / CUDA toolkit not found")
def test_a_kernel_that_spills_is_found_by_ptxas_and_priced_in_the_report():
    graph = tvm.IRModule({"spiller": spiller})
    scheduled, facts = attach_built_facts(graph, graph, H100, "tvm_ext")
    assert facts.note == "" and facts.spilled == {}        # no plan, so no key to re-price
    found = built_facts(scheduled["spiller"])
    assert found is not None and found.spills and found.registers <= 64
    priced = describe_scheduled(spiller, scheduled["spiller"])
    unpriced = describe_scheduled(spiller, spiller)
    assert priced.spill_bytes == (found.spill_stores + found.spill_loads) * 1024
    assert priced.global_bytes == unpriced.global_bytes + priced.spill_bytes
    assert "1 spill" in facts.summary()


def test_without_a_toolkit_the_build_says_so_and_prices_as_planned(monkeypatch):
    from tvm_ext.errors import KernelCompileError

    def no_toolkit(*args, **kwargs):
        raise KernelCompileError("no CUDA toolkit found")

    monkeypatch.setattr(ptxas_facts, "compiled_usage", no_toolkit)
    scheduled, facts = attach_built_facts(tvm.IRModule({"spiller": spiller}), tvm.IRModule({"spiller": spiller}),
                                          H100, "tvm_ext")
    assert facts.usage is None and "no CUDA toolkit" in facts.summary()
    assert built_facts(scheduled["spiller"]) is None


@pytest.mark.skipif(not nvcc_available(), reason="nvcc / CUDA toolkit not found")
def test_a_chosen_kernel_that_spills_is_priced_so_and_reselected_away(monkeypatch):
    """ptxas (faked: every kernel of the first round spills 4 MB a thread, in every round, more than two launches cost) makes
    the build price the spills in a second selection round, which builds the matmul otherwise."""
    real = ptxas_facts.compiled_usage
    rounds: list[list[str]] = []

    def spilling(mod, names, target, pipeline):
        usage = real(mod, names, target, pipeline)
        first = rounds[0] if rounds else list(names)
        rounds.append(list(names))
        for name in set(names) & set(first):
            usage[f"{name}_kernel"] = KernelUsage(255, 1 << 22, 1 << 22, 1 << 22, 0)
        return usage

    monkeypatch.setattr(ptxas_facts, "compiled_usage", spilling)
    staged = build(Small, H100, Preset("test_spills", "test", generators=("dlight",), selector="blp"))
    assert len(rounds) == 2                                  # priced as planned, then with its spills
    (fused,) = [n for n in rounds[0] if "matmul" in n]
    assert fused not in rounds[1]                           # the spilling matmul kernel lost
    # the softmax has no other candidate: it stays, and the report prices its spills
    (softmax,) = staged.ptxas.spilled.values()
    assert softmax.spill_stores == 1 << 22 and set(rounds[1]) - {"softmax"} and "softmax" in rounds[1]
    assert describe_scheduled(staged.graph["softmax"], staged.scheduled["softmax"]).spill_bytes > 0
    assert all(BUILT_FACTS_ATTR in f.attrs for _, f in staged.scheduled.functions_items()
               if isinstance(f, tirx.PrimFunc))
    lines = dict(summary_lines(report_from_stages(staged)))       # what `tvm-ext inspect` shows
    assert lines["registers and spills"].startswith(f"ptxas: {len(rounds[1])} kernels compiled, 1 spill (softmax_kernel: ")
