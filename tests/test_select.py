"""The selection spine: a new technique is a generator, its schedule builder and one registration.

``Singletons`` below is such a technique, written only against the public protocol: it proposes
every node alone and schedules it with a plan of its own (one thread per output element). A
preset naming it builds, the plan travels to the schedule stage, the report names the generator
of every launch, and the CPU oracle agrees with the baseline.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.script import relax as R

from tvm_ext.driver import Preset, build, get_preset, preset_passes
from tvm_ext.errors import PresetError
from tvm_ext.graph import OpGraph
from tvm_ext.hardware import load_device
from tvm_ext.inspect import inspect
from tvm_ext.graph import sblocks
from tvm_ext.select import (Candidate, GeneratorError, LaunchShape, PlanError, PrioritySelector, ScheduledKernel,
                            SelectionContext, emit_groups, get_generator, plan_from_text, plan_of, planned_by,
                            register_generator, subgraph_module, unregister_generator, with_plan)
from tvm_ext.select.attrs import FALLBACK_ATTR, SELECTION_ATTR
from tvm_ext.select.database import Database, DatabaseError, Record
from tvm_ext.select.generator import ScheduleRefused
from tvm_ext.testing.oracle import run_cpu

H100 = tvm.target.Target("tvm_ext/h100")


@tvm.script.ir_module
class Small:
    @R.function
    def main(x: R.Tensor((8, 64), "float32"), w: R.Tensor((64, 64), "float32"), b: R.Tensor((64,), "float32")):
        with R.dataflow():
            y = R.matmul(x, w)
            z = R.add(y, b)
            s = R.nn.softmax(R.nn.relu(z), axis=-1)
            R.output(s)
        return s


@dataclass(frozen=True)
class ThreadPerElement:
    """The test generator's plan: threads per block of its flat schedule."""

    generator: ClassVar[str] = "test_singletons"
    threads: int

    def to_json(self) -> dict[str, Any]:
        return {"threads": self.threads}

    def summary(self) -> str:
        return f"one thread per element, {self.threads} per block"


class Singletons:
    """Every spatial single-block node alone, one thread per output element (reductions are left to
    the next generator, dlight)."""

    name = "test_singletons"
    kernel_kind = "tir"
    verify_lowering = True

    def prepare_passes(self, target):
        return []

    def plan_from_json(self, data):
        return ThreadPerElement(int(data["threads"]))

    def candidates(self, ctx: SelectionContext):
        out = []
        for n in ctx.call_nodes():
            blocks = sblocks(ctx.fused_function((n,)))
            if len(blocks) == 1 and all(iv.iter_type == tirx.IterVar.DataPar for iv in blocks[0][0].iter_vars):
                launch = LaunchShape(grid=-(-ctx.graph.nodes[n].bytes_written // 4 // 128), threads=128)
                out.append(Candidate.of(ctx.graph, (n,), ThreadPerElement(128), launch=launch))
        return out

    def schedule(self, func, plan, device) -> ScheduledKernel:
        sch = tvm.s_tir.Schedule(func)
        (block,) = sch.get_child_blocks(sch.get_sblock("root"))
        bx, tx = sch.split(sch.fuse(*sch.get_loops(block)), [None, plan.threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        return ScheduledKernel(sch.mod["main"].with_attr("tirx.is_scheduled", True), rule="thread-per-element")


@pytest.fixture
def singletons():
    register_generator(Singletons())
    yield Preset("test_singletons", "test: every node alone", generators=("test_singletons", "dlight"))
    unregister_generator("test_singletons")


def test_a_new_generator_builds_and_is_reported(singletons):
    report = inspect(Small, H100, singletons)
    generators = {k.func: k.generator for k in report.launches}
    assert "test_singletons" in generators.values()
    ours = [k for k in report.launches if k.generator == "test_singletons"]
    assert all(k.rule == "thread-per-element" and k.plan == "one thread per element, 128 per block" for k in ours)
    assert report.kernels == sum(k.launches for k in report.launches)
    assert json.loads(json.dumps(report.to_json()))["launches"][0]["generator"] in generators.values()
    stages = build(Small, tvm.target.Target({"kind": "llvm"}), singletons)   # the CPU oracle runs it too
    rng = np.random.default_rng(0)
    inputs = {p.name: rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in Small["main"].params}
    ours_out = run_cpu(relax.VirtualMachine(stages.executable, tvm.cpu()), inputs)
    np.testing.assert_allclose(ours_out[0], run_cpu(Small, inputs)[0], rtol=1e-5, atol=1e-6)


@dataclass(frozen=True)
class Unbuildable:
    generator: ClassVar[str] = "test_refusing"

    def to_json(self) -> dict[str, Any]:
        return {}

    def summary(self) -> str:
        return "a kernel that cannot be scheduled"


class Refusing:
    """Proposes the whole function as one kernel priced below anything else (one thread, one byte),
    then refuses to schedule it: the driver must re-select without it, not fall back inside the
    chosen cover."""

    name = "test_refusing"
    kernel_kind = "tir"
    verify_lowering = False

    def prepare_passes(self, target):
        return []

    def plan_from_json(self, data):
        return Unbuildable()

    def candidates(self, ctx: SelectionContext):
        nodes = tuple(ctx.call_nodes())
        plan = Unbuildable()
        return [Candidate.of(ctx.graph, nodes, plan, launch=LaunchShape(grid=1, threads=1), global_bytes=1,
                             key=ctx.kernel_key(nodes, plan))]

    def schedule(self, func, plan, device) -> ScheduledKernel:
        raise ScheduleRefused("test: this plan never builds")


def test_a_chosen_kernel_that_fails_to_schedule_is_reselected_away():
    register_generator(Refusing())
    try:
        preset = Preset("test_refusing", "test", generators=("test_refusing", "dlight"), selector="blp")
        staged = build(Small, H100, preset)
    finally:
        unregister_generator("test_refusing")
    assert not planned_by(staged.scheduled, "test_refusing")            # nothing of it survived
    assert not any(f.attrs is not None and FALLBACK_ATTR in f.attrs
                   for _, f in staged.scheduled.functions_items() if isinstance(f, tirx.PrimFunc))
    selection = json.loads(str(staged.graph.attrs[SELECTION_ATTR]))["main"]
    (dropped,) = [d for d in selection["dropped"] if d["generator"] == "test_refusing"]
    assert "failed to schedule in an earlier round" in dropped["reason"] and "never builds" in dropped["reason"]
    assert selection["chosen"] == {"dlight": selection["chosen"]["dlight"]}


class Returning(Refusing):
    """:class:`Refusing`, whose selection key differs from the key of the function the module's
    ``FuseTIR`` makes of the same nodes (ConvNeXt-T's add -> transpose -> layer norm did that):
    excluding the refused kernel by its key does not keep it out of the next selection."""

    def __init__(self):
        self.rounds = 0

    def candidates(self, ctx: SelectionContext):
        self.rounds += 1
        return [dataclasses.replace(c, key=f"{c.key}-selection-{self.rounds}") for c in super().candidates(ctx)]


@pytest.mark.parametrize("dlight_builds", [True, False], ids=["dlight_builds_it", "dlight_fails_too"])
def test_a_refused_kernel_that_comes_back_is_built_by_dlight_or_its_generator_dropped(monkeypatch, dlight_builds):
    import tvm_ext.driver.stages as stages

    if not dlight_builds:          # as if dlight could not schedule the fallback either
        monkeypatch.setattr(stages, "unscheduled_fallbacks", lambda scheduled: sorted(
            gv.name_hint for gv, f in scheduled.functions_items()
            if isinstance(f, tirx.PrimFunc) and f.attrs is not None and FALLBACK_ATTR in f.attrs))
    gen = Returning()
    register_generator(gen)
    try:
        preset = Preset("test_returning", "test", generators=("test_refusing", "dlight"), selector="blp")
        staged = build(Small, H100, preset)
    finally:
        unregister_generator("test_refusing")
    fallbacks = [f for _, f in staged.scheduled.functions_items()
                 if isinstance(f, tirx.PrimFunc) and f.attrs is not None and FALLBACK_ATTR in f.attrs]
    selection = json.loads(str(staged.graph.attrs[SELECTION_ATTR]))["main"]
    if dlight_builds:      # round 2 chose it again, dlight scheduled it: built as a reported fallback
        assert gen.rounds == 2 and len(fallbacks) == 1 and planned_by(staged.scheduled, "test_refusing")
        assert "never builds" in str(fallbacks[0].attrs[FALLBACK_ATTR])
    else:                  # round 3 selected without the generator
        assert gen.rounds == 2 and not fallbacks and not planned_by(staged.scheduled, "test_refusing")
        assert selection["chosen"] == {"dlight": selection["chosen"]["dlight"]}


def test_registry_rejects_duplicates_and_unknown_names():
    with pytest.raises(GeneratorError, match="already registered"):
        register_generator(get_generator("stitch"))
    with pytest.raises(GeneratorError, match="no generator named 'nope'"):
        get_generator("nope")
    with pytest.raises(PlanError, match="malformed plan"):
        plan_from_text("{not json")
    with pytest.raises(PresetError, match="selector must be one of"):
        Preset("x", "bad", generators=("dlight",), selector="greedy")


def test_plan_round_trips_through_the_attribute():
    plan = get_generator("dlight").plan_from_json({"rule": "Matmul", "group": "compute"})
    func = with_plan(Small["main"], plan)
    assert plan_of(func) == plan and plan_from_text(str(func.attrs["tvm_ext.plan"])) == plan


def _context(mod: tvm.IRModule) -> SelectionContext:
    legal = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(mod))
    return SelectionContext(legal, "main", OpGraph.from_module(legal), load_device("h100"), H100)


def test_fused_function_equals_the_final_fusion():
    """A candidate's function, fused alone, is the function the whole module's fusion makes."""
    ctx = _context(Small)
    nodes = (2, 3)                                                  # relu, softmax
    alone = ctx.fused_function(nodes)

    whole, names = emit_groups(ctx.mod, [list(nodes)], names=["fused_candidate"])
    final = relax.transform.FuseTIR()(whole)[names[0]]
    tvm.ir.assert_structural_equal(alone, final)
    assert ctx.fused_function(nodes) is alone                       # cached by signature
    sub = subgraph_module(ctx.mod, "main", nodes)
    assert [p.name for p in sub["main"].params] == ["z"]
    assert len(sub["main"].ret_ty.fields) == 1                      # only the softmax leaves the set


def _aliased() -> tvm.IRModule:
    """``b = tanh(exp(x))``, read both as ``b`` and through an alias ``c = b`` (ConvNeXt's layer
    norm after the HF export's identity-like bindings)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.exp(x))
            b = bb.emit(relax.op.tanh(a))
            c = bb.emit(b)
            d = bb.emit(relax.op.add(b, relax.const(1.0, "float32")))
            e = bb.emit(relax.op.multiply(c, relax.const(2.0, "float32")))
            out = bb.emit_output(relax.op.add(d, e))
        bb.emit_func_output(out)
    return bb.get()


def test_a_group_read_through_an_alias_returns_its_value_once():
    """An alias binding stays out of the group: the group returns ``b`` once, FuseTIR gives each
    parameter its own buffer (with the alias in the group, it returned ``b`` twice and FuseTIR bound
    one buffer to two parameters: an ill-formed kernel that crashed ConvNeXt's ``full`` build), the
    candidate's own fusion is the final one, and the module computes what it did."""
    ctx = _context(_aliased())
    nodes = (0, 1)                                                  # exp, tanh
    whole, names = emit_groups(ctx.mod, [list(nodes)], names=["fused_candidate"])
    final = relax.transform.FuseTIR()(whole)[names[0]]
    params = list(final.params)
    assert len(params) == 2 and not params[0].same_as(params[1])   # x and the one output
    tvm.ir.assert_structural_equal(ctx.fused_function(nodes), final)
    assert len(subgraph_module(ctx.mod, "main", nodes)["main"].ret_ty.fields) == 1
    x = np.random.default_rng(0).standard_normal((4, 8)).astype("float32")
    expected = np.tanh(np.exp(x)) * 3 + 1
    vm = relax.VirtualMachine(tvm.compile(relax.transform.FuseTIR()(whole), target="llvm"), tvm.cpu())
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), expected, rtol=1e-5)


def test_priority_selector_takes_candidates_in_order():
    ctx = _context(Small)
    gen = get_generator("dlight")
    cands = gen.candidates(ctx)
    selection = PrioritySelector().select(ctx, cands)
    covered = [n for c in selection.chosen for n in c.nodes]
    assert sorted(covered) == ctx.call_nodes() == sorted(set(covered))
    assert selection.chosen[0].plan.group == "compute"             # matmul + add (+ relu) first
    assert selection.uncovered == []


def test_database_keys_and_best_record(tmp_path):
    db = Database(tmp_path / "m.jsonl")
    db.add(Record("k", "h100", "float16", "stitch", 2e-6, {"group": "stitch"}))
    db.add(Record("k", "h100", "float16", "stitch", 1e-6, {"group": "stitch"}))
    db.add(Record("k", "h200", "float16", "stitch", 5e-7))
    again = Database(tmp_path / "m.jsonl")
    assert len(again) == 2 and again.best("k", "h100", "float16").latency_s == 1e-6
    assert again.best("k", "a100", "float16") is None
    (tmp_path / "bad.jsonl").write_text("not json\n")
    with pytest.raises(DatabaseError, match="bad.jsonl:1"):
        Database(tmp_path / "bad.jsonl")


def test_stitch_preset_plans_and_builds_the_stitched_kernels():
    p = get_preset("stitch")
    stages = preset_passes(p, H100)
    assert [type(x).__name__ for x in stages.schedule] == ["ApplyPlans", "SafeDefaultSchedule"]
    scheduled = build(Small, H100, p).scheduled
    assert set(planned_by(scheduled, "stitch").values()) == {"stitched"}


def test_emitting_a_selection_leaves_the_callers_module_alone():
    """Plans go onto the emitted module's functions, never onto the module the context holds."""
    from tvm_ext.select.attrs import PLAN_ATTR
    from tvm_ext.select.emission import emit_selection

    ctx = _context(Small)
    singles = [c for c in get_generator("dlight").candidates(ctx) if len(c.nodes) == 1]
    out = emit_selection(ctx, singles)

    def planned(mod):
        return sorted(gv.name_hint for gv, f in mod.functions_items()
                      if isinstance(f, tirx.PrimFunc) and f.attrs is not None and PLAN_ATTR in f.attrs)

    assert planned(out) == sorted(ctx.graph.nodes[c.nodes[0]].func_name for c in singles)
    assert planned(ctx.mod) == []


def test_library_functions_named_alike_get_distinct_exported_symbols():
    """Two CUTLASS candidates of one function can come from separate partitions with the same
    name; the exported symbols must differ (ViT's glue defined one symbol twice)."""
    from tvm_ext.select.emission import add_library_function

    def library_function(n: int) -> relax.Function:
        x = relax.Var("x", relax.TensorType((n,), "float32"))
        return relax.Function([x], x).with_attr("global_symbol", "fused_relax_matmul_tvm_ext_cutlass") \
            .with_attr("Codegen", "tvm_ext_cutlass")

    bb = relax.BlockBuilder()
    first, second = add_library_function(bb, library_function(4)), add_library_function(bb, library_function(8))
    mod = bb.get()
    symbols = [str(mod[g].attrs["global_symbol"]) for g in (first, second)]
    assert symbols == [first.name_hint, second.name_hint] and len(set(symbols)) == 2
    assert add_library_function(bb, library_function(4)).same_as(first)    # the same function once
