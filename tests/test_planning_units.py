"""Planning-budget units of orchestrate and subprogram (issue 38): each charges what its planning
costs, and every default budget stops a generator on its work before its seconds, so where a build
stops does not depend on the machine's load.

A node count was the unit of both before: orchestrate's dlight sets cost the same whatever their
size, and one subprogram piece of DETR-R50 took 13 s for its 195 nodes where a 7-node piece took
0.2 s; the seconds (30 s) bound first on 8 seed models, so their plans moved with the load.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_ext.driver import get_preset
from tvm_ext.graph import OpGraph
from tvm_ext.hardware import load_device
from tvm_ext.orchestrate.generator import DLIGHT_SET_UNITS, planning_units, set_units
from tvm_ext.select.budget import UNLIMITED
from tvm_ext.select.context import SelectionContext
from tvm_ext.subprogram import SubprogramGenerator, design
from tvm_ext.subprogram.generator import TENSOR_CORE_STAGE_UNITS, piece_units
from tvm_ext.subprogram.stages import statements

H100 = tvm.target.Target("tvm_ext/h100")
DEVICE = load_device("h100")
RECORDS = Path(__file__).resolve().parents[1] / "bench" / "planning_units.jsonl"


@I.ir_module
class HalfProjSoftmaxProj:
    """Two float16 GEMMs (dlight's tensor-core rule) around a softmax."""

    @R.function
    def main(x: R.Tensor((128, 256), "float16"), w1: R.Tensor((256, 256), "float16"),
             w2: R.Tensor((256, 256), "float16")):
        with R.dataflow():
            s = R.nn.softmax(R.matmul(x, w1))
            o = R.add(R.matmul(s, w2), x)
            R.output(o)
        return o


def _context(mod: tvm.IRModule) -> SelectionContext:
    legal = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(mod))
    return SelectionContext(legal, "main", OpGraph.from_module(legal), DEVICE, H100, budget=UNLIMITED)


def test_subprogram_charges_statements_and_tensor_core_stages():
    ctx = _context(HalfProjSoftmaxProj)
    (cand,) = SubprogramGenerator().candidates(ctx)
    fused = ctx.fused_function(cand.nodes)
    made = design(fused, DEVICE, H100)
    tensor_core = sum(1 for stage in made.stages if stage.tensor_cores)
    assert tensor_core == 2
    assert ctx.meter("subprogram").work == len(statements(fused)) + TENSOR_CORE_STAGE_UNITS * tensor_core


def test_orchestrate_charges_a_stitched_set_its_nodes_and_a_dlight_set_a_constant():
    ctx = _context(HalfProjSoftmaxProj)
    graph = ctx.graph
    gemm, softmax = (graph.node(name).index for name in ("lv", "s"))     # the first matmul, the softmax
    assert planning_units(graph, (softmax,)) == 1.0
    assert planning_units(graph, (gemm, softmax)) == float(DLIGHT_SET_UNITS)


def _seconds_per_unit() -> dict[str, float]:
    """The slowest model's seconds per unit of each generator in the recorded planning times."""
    per_model: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for line in RECORDS.read_text().splitlines():
        r = json.loads(line)
        if r["generator"] == "orchestrate":
            units = set_units(r["nodes"], r["stitched"])
        else:
            units = piece_units(r["statements"], r["tensor_core_stages"])
        per_model[(r["generator"], r["model"])][0] += units
        per_model[(r["generator"], r["model"])][1] += r["seconds"]
    slowest: dict[str, float] = {}
    for (generator, _), (units, seconds) in per_model.items():
        slowest[generator] = max(slowest.get(generator, 0.0), seconds / units)
    return slowest


@pytest.mark.parametrize("generator, measured", [("orchestrate", "orchestrate"),
                                                 ("orchestrate_small", "orchestrate"),
                                                 ("subprogram", "subprogram")])
@pytest.mark.parametrize("preset", ["full", "orchestrate", "subprogram"])
def test_default_budgets_stop_on_work_before_seconds(generator, measured, preset):
    """On the machine the units were measured on, one build at a time, every recorded seed model
    spends a default budget's work before its seconds, at any graph size: the stop is deterministic."""
    budget = get_preset(preset).budget.for_generator(generator)
    per_unit = _seconds_per_unit()[measured]
    for nodes in (20, 300, 1200, 10**5):
        assert budget.work_limit(nodes) * per_unit < budget.seconds_limit(nodes), (nodes, per_unit)


def test_one_generators_budget_replaced_keeps_the_others():
    from tvm_ext.driver.presets import (
        DEFAULT_BUDGET,
        SUBPROGRAM_BUDGET,
        TILE_GRAPH_BUDGET,
    )
    from tvm_ext.select.budget import PlanningBudget

    quick = DEFAULT_BUDGET.with_generator("subprogram", PlanningBudget(max_work=500.0))
    assert quick.for_generator("subprogram").max_work == 500.0
    assert quick.for_generator("tilegraph") is TILE_GRAPH_BUDGET
    assert DEFAULT_BUDGET.for_generator("subprogram") is SUBPROGRAM_BUDGET      # the default unchanged
    stitch, default_stitch = quick.meter("stitch", nodes=300), DEFAULT_BUDGET.meter("stitch", nodes=300)
    assert (stitch.work_limit, stitch.seconds_limit) == (default_stitch.work_limit, default_stitch.seconds_limit)
