"""The one build driver: a preset's passes as stages, run together or one by one.

Stages (DESIGN.md "Pipeline"):

* **graph** (target independent): TVM's library dispatch and legalization; for a preset with
  generators, also each generator's preparation passes (each pass once, however many
  generators ask for it), :class:`~tvm_ext.select.origin.RecordOrigin`,
  :class:`~tvm_ext.select.select_pass.SelectKernels` (candidates, selection, emission with plans),
  the library generators' code generation, ``FuseOps`` for the rest when the preset says so, and
  :class:`~tvm_ext.select.fuse.FuseTIRKeepPlans`. Split into ``fuse`` (up to ``FuseTIR``, where
  groups are still Relax functions) and ``fuse_tir``;
* **schedule** (GPU targets): :class:`~tvm_ext.driver.apply_plans.ApplyPlans`, then dlight for
  every unplanned PrimFunc (:class:`~tvm_ext.dlight.SafeDefaultSchedule`);
* **lower**: TVM's dataflow lowering and VM finalization (CPU targets: ``default_build``).

:func:`build` also re-selects: when a kernel a cost-based selection chose fails to schedule (its
generator refuses the plan, or TVM's lowering rejects the result), the graph stage runs again
without that candidate (at most :data:`MAX_RESELECTIONS` rounds, then one round without the
generators whose kernels still fail), so the cover is the best one of kernels that build; the
selection report lists the dropped candidates and why. (The
one-pass pipeline cannot go back: there such a kernel runs as dlight's kernels and the report
says so.)

:func:`preset_pipeline` is all stages as one pass (what ``tvm.compile`` runs for the registered
pipelines); :func:`build` runs them one by one and keeps every intermediate module (the report,
the CLI, the CPU oracle and the benchmarks use it). A CPU (``llvm``) build plans the same kernels
as the default GPU target (:func:`~tvm_ext.hardware.planning_target`) and runs the fused graph
unscheduled: the correctness oracle. Library generators need a CUDA target and are left out of
CPU builds.

Example
-------
>>> staged = build(mod, tvm.target.Target("tvm_ext/h100"), "stitch")
>>> staged.stage_seconds.keys()
dict_keys(['graph', 'schedule', 'lower', 'build'])
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Iterator

import tvm
from tvm import relax

from ..fission import Fission
from ..hardware import device_from_target, is_gpu_target, planning_target, resolve_target
from ..select.built_facts import BuiltFacts
from ..select.fuse import FuseTIRKeepPlans
from ..select.generator import get_generator
from ..select.origin import RecordOrigin
from ..select.progress import ProgressEvent, emit
from ..select.select_pass import SelectKernels
from ..select.selector import PrioritySelector
from ..subprogram import HorizontalMatmul
from .apply_plans import ApplyPlans, refused_kernels, unscheduled_fallbacks
from .graph_choice import FISSION_ATTR, HORIZONTAL_CHOICE_ATTR, CheaperOf
from .presets import Preset, get_preset
from .ptxas_facts import PtxasFacts, attach_built_facts

#: PassContext option of TVM's ``RewriteCUDAGraph`` (capture static parts of ``main`` in CUDA graphs).
logger = logging.getLogger(__name__)

CUDA_GRAPH_CONFIG = "relax.backend.use_cuda_graph"
#: Graph-stage rounds after the first, when chosen kernels fail to schedule (see the module docstring).
MAX_RESELECTIONS = 2
_SKIPPED = ("ApplyDefaultSchedule",)


@dataclass(frozen=True)
class StagePasses:
    """The passes of each stage for one preset and target."""

    fuse: list
    fuse_tir: list
    schedule: list
    lower: list

    @property
    def graph(self) -> list:
        """The whole graph stage."""
        return self.fuse + self.fuse_tir


def _tvm_graph_passes(target: tvm.target.Target) -> tuple[list, list, list]:
    """TVM 0.27's CUDA graph passes without dlight: (dispatch, legalize up to FuseOps, [FuseOps])."""
    from tvm.relax.backend.cuda import pipeline as cuda

    dispatch = list(cuda.library_dispatch_passes(target))
    legal, fuse = [], []
    for p in cuda.legalize_passes(target):
        name = p.info.name
        if name in _SKIPPED or name == "FuseTIR":
            continue
        (fuse if name == "FuseOps" else legal).append(p)
    return dispatch, legal, fuse


def _selector(preset: Preset):
    if preset.selector == "blp":
        from ..select.blp import BlpSelector

        return BlpSelector()
    return PrioritySelector()


def cost_model(preset: Preset):
    """The cost model a preset's selection and report use (measured, learned, analytic)."""
    from ..select.analytic import AnalyticCostModel
    from ..select.measured import MeasuredCostModel

    return MeasuredCostModel(AnalyticCostModel(cuda_graph=preset.cuda_graph))


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.WithCudaGraph")
class WithCudaGraph:
    """Run ``passes`` with :data:`CUDA_GRAPH_CONFIG` set (TVM's ``RewriteCUDAGraph`` reads it)."""

    def __init__(self, passes: list):
        self.passes = list(passes)

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:  # noqa: D102 - pass protocol
        with cuda_graph_context(True):
            return tvm.transform.Sequential(self.passes)(mod)


def generators_for(preset: Preset, target: tvm.target.Target) -> list[str]:
    """The preset's generators that can build for ``target`` (library ones need CUDA)."""
    cuda = target.kind.name == "cuda"
    return [g for g in preset.generators if cuda or get_generator(g).kernel_kind != "library"]


def _distinct_passes(passes) -> list:
    """``passes`` in order, each pass name once (generators may ask for the same preparation)."""
    seen: dict[str, tvm.transform.Pass] = {}
    for ps in passes:
        seen.setdefault(ps.info.name, ps)
    return list(seen.values())


def preset_passes(preset: str | Preset, target: tvm.target.Target,
                  excluded: Mapping[str, str] | None = None, library_codegen: bool = True,
                  shared: dict | None = None, built: Mapping[str, BuiltFacts] | None = None) -> StagePasses:
    """Every stage's passes for ``preset`` and ``target`` (see the module docstring); candidates
    whose kernel key is in ``excluded`` are not selected, those in ``built`` are priced with
    their kernel's spills (:class:`~tvm_ext.select.select_pass.SelectKernels`). ``library_codegen=False`` leaves the
    library generators' chosen calls as ``Codegen`` functions (what checks of those calls read).
    ``shared`` holds plans by structure across calls (:func:`build` hands each round the same)."""
    p = get_preset(preset)
    plan_target = planning_target(target)
    dispatch, legal, fuse_ops = _tvm_graph_passes(target)
    if not p.uses_spine:
        fuse, fuse_tir = dispatch + legal + fuse_ops, [relax.transform.FuseTIR()]
    else:
        device = device_from_target(plan_target)
        names = generators_for(p, target)
        gens = [get_generator(g) for g in names]
        prepare = _distinct_passes(ps for g in gens for ps in g.prepare_passes(plan_target))
        codegen = [ps for g in gens if g.kernel_kind == "library" and library_codegen
                   for ps in g.codegen_passes(plan_target)]
        select = SelectKernels(names, _selector(p), device, plan_target,
                               cost_model(p) if p.selector == "blp" else None, excluded=excluded,
                               recompute=p.recompute, budget=p.budget, shared=shared, built=built)
        rest = fuse_ops if p.rest == "fuseops" else []
        fuse = prepare + dispatch + [RecordOrigin()] + legal + [select] + codegen + rest
        if p.fission:   # Korch's fission where the cost model says it pays (whole module)
            fuse = [CheaperOf("fission", FISSION_ATTR, Fission(), fuse, keep_on_tie=True)]
        if p.horizontal:   # SOUFFLE's horizontal transform, likewise
            fuse = [CheaperOf("horizontal", HORIZONTAL_CHOICE_ATTR, HorizontalMatmul(), fuse)]
        fuse_tir = [FuseTIRKeepPlans()]
    if not is_gpu_target(target):
        return StagePasses(fuse, fuse_tir, [], [relax.get_pipeline("default_build")])
    from ..dlight import SafeDefaultSchedule
    from tvm.relax.backend.cuda import pipeline as cuda

    schedule = [ApplyPlans(device_from_target(target), target, check_kernels=p.check_kernels), SafeDefaultSchedule()]
    lower = list(cuda.dataflow_lower_passes(target)) + list(cuda.finalize_passes(target))
    return StagePasses(fuse, fuse_tir, schedule, [WithCudaGraph(lower)] if p.cuda_graph else lower)


def preset_pipeline(preset: str | Preset, target: tvm.target.Target) -> tvm.transform.Pass:
    """The whole Relax pipeline of ``preset`` for ``target`` as one ``Sequential``."""
    p = get_preset(preset)
    stages = preset_passes(p, target)
    return tvm.transform.Sequential(stages.graph + stages.schedule + stages.lower, name=f"tvm_ext.{p.name}")


def graph_passes(preset: str | Preset, target: tvm.target.Target | None = None) -> tvm.transform.Pass:
    """The preset's target-independent graph stage as one ``Sequential`` (for
    :data:`~tvm_ext.hardware.DEFAULT_TARGET` when no target is given)."""
    p = get_preset(preset)
    tgt = target if target is not None else resolve_target(None)
    return tvm.transform.Sequential(preset_passes(p, tgt).graph, name=f"tvm_ext.{p.name}.graph")


@dataclass
class StagedBuild:
    """Modules after each stage of a preset's pipeline, plus the linked executable.

    Attributes
    ----------
    source : IRModule
        The imported module (input of the pipeline).
    fused_ops : IRModule
        Graph stage stopped just before ``FuseTIR``: groups are ``Primitive`` Relax functions.
    graph : IRModule
        Output of the whole graph stage (fused PrimFuncs carrying their plans).
    scheduled : IRModule
        After the schedule stage (the graph module again for CPU builds).
    lowered : IRModule
        After the lower stage: what the VM code generator and the TIR build consume.
    executable : tvm.runtime.Executable
        ``tvm.compile(lowered, target, relax_pipeline=None)``.
    stage_seconds : dict
        Wall time of ``graph``, ``schedule``, ``lower`` and ``build`` (and ``ptxas``).
    ptxas : PtxasFacts or None
        What ptxas said of the last round's kernels (None: not asked, or a CPU build).
    """

    preset: Preset
    target: tvm.target.Target
    source: tvm.IRModule
    fused_ops: tvm.IRModule
    graph: tvm.IRModule
    scheduled: tvm.IRModule
    lowered: tvm.IRModule
    executable: tvm.runtime.Executable | None
    stage_seconds: dict[str, float] = field(default_factory=dict)
    ptxas: PtxasFacts | None = None

    @property
    def compile_seconds(self) -> float:
        """Total wall time of the pipeline and the build."""
        return sum(self.stage_seconds.values())


def snapshot(mod: tvm.IRModule) -> tvm.IRModule:
    """A new IRModule with the same functions, attributes and global infos.

    Some passes (dlight's ``ApplyDefaultSchedule``) assign into the module they are given;
    running each stage on a snapshot keeps the previous stage's module intact.
    """
    infos = dict(mod.global_infos) if mod.global_infos is not None else None
    return tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs, global_infos=infos)


def _run(passes: list, mod: tvm.IRModule, name: str) -> tvm.IRModule:
    if not passes:
        return mod
    return tvm.transform.Sequential(passes, name=name)(snapshot(mod))


@contextlib.contextmanager
def cuda_graph_context(enabled: bool) -> Iterator[None]:
    """A PassContext with :data:`CUDA_GRAPH_CONFIG` set when ``enabled`` (else the current one)."""
    if not enabled:
        yield
        return
    current = tvm.transform.PassContext.current()
    with tvm.transform.PassContext(opt_level=current.opt_level, config={CUDA_GRAPH_CONFIG: True}):
        yield


def build(mod: tvm.IRModule, target: tvm.target.Target, preset: str | Preset = "baseline", *,
          cuda_graph: bool = False, link: bool = True) -> StagedBuild:
    """Compile ``mod`` for ``target`` with ``preset``, keeping each stage's module.

    Parameters
    ----------
    mod : IRModule
        The imported model.
    target : Target
        A GPU target (all stages) or a CPU target (graph stage, then TVM's generic lowering).
    preset : str or Preset
        The preset.
    cuda_graph : bool
        Capture the static parts of ``main`` in CUDA graphs (TVM's ``RewriteCUDAGraph``; CUDA
        targets only) and price launches so, as a preset with ``cuda_graph`` (every built-in one
        but ``baseline``) does anyway.
    link : bool
        False: stop after the schedule stage (``lowered`` is the scheduled module, ``executable``
        None): what checks of the built kernels need.

    Raises
    ------
    PresetError
        Unknown or unimplemented preset.
    """
    p = get_preset(preset)
    if cuda_graph and not p.cuda_graph:     # captured launches are priced as captured (selection, report)
        p = dataclasses.replace(p, cuda_graph=True)
    seconds: dict[str, float] = {"graph": 0.0, "schedule": 0.0}
    excluded: dict[str, str] = {}
    built: dict[str, BuiltFacts] = {}    # kernels found spilling, priced so in later rounds
    ptxas: PtxasFacts | None = None
    shared: dict = {}     # plans by structure: a round plans only what earlier rounds did not
    # CUDA graphs exist only on CUDA: a CPU build of a capturing preset (the oracle) captures nothing
    with cuda_graph_context(p.cuda_graph and target.kind.name == "cuda"), target:
        for round_ in range(MAX_RESELECTIONS + 2):
            stages = preset_passes(p, target, excluded, shared=shared, built=built)
            round_name = f" (round {round_ + 1})" if round_ else ""
            emit(ProgressEvent("graph" + round_name))
            start = time.perf_counter()
            fused_ops = _run(stages.fuse, mod, f"tvm_ext.{p.name}.graph.fuse")
            graph = _run(stages.fuse_tir, fused_ops, f"tvm_ext.{p.name}.graph.fuse_tir")
            seconds["graph"] += time.perf_counter() - start
            emit(ProgressEvent("schedule" + round_name))
            start = time.perf_counter()
            scheduled = _run(stages.schedule, graph, f"tvm_ext.{p.name}.schedule")
            seconds["schedule"] += time.perf_counter() - start
            refused = refused_kernels(graph, scheduled) if p.selector == "blp" and stages.schedule else {}
            spilled: dict[str, BuiltFacts] = {}
            if p.ptxas and stages.schedule:
                start = time.perf_counter()
                scheduled, ptxas = attach_built_facts(graph, scheduled, target, p.tir_pipeline)
                seconds["ptxas"] = seconds.get("ptxas", 0.0) + time.perf_counter() - start
                logger.info("%s", ptxas.summary())
                if p.selector == "blp":
                    spilled = {k: f for k, f in ptxas.spilled.items() if k not in built}
            if (not refused and not spilled) or round_ == MAX_RESELECTIONS + 1:
                break
            if spilled:
                logger.info("re-selecting with the spills of %d kernel(s) priced", len(spilled))
                built.update(spilled)
            if not refused:
                continue
            # excluding a refused kernel by its key can fail to keep it out: the selection's key is
            # taken on the candidate's own fusion, and the module's FuseTIR can make another function
            # of the same nodes (ConvNeXt's transpose -> layer norm, read also through an alias, was
            # ill-formed only there until emission returned an alias's value once)
            stuck = set(refused) <= set(excluded)
            if stuck and not unscheduled_fallbacks(scheduled):
                break   # dlight built what was refused again
            if stuck or round_ == MAX_RESELECTIONS:
                # the fallback of a refused kernel may not build either (a dlight-built set whose
                # dlight schedule is what failed): a round without the generators still failing
                failing = sorted({gen for gen, _ in refused.values()})
                logger.warning("re-selecting without the candidates of %s: their kernels kept failing to "
                               "schedule", ", ".join(failing))
                p = dataclasses.replace(p, generators=tuple(g for g in p.generators if g not in failing))
            else:
                logger.warning("re-selecting without %d kernel(s) that failed to schedule: %s", len(refused),
                               "; ".join(reason for _, reason in refused.values()))
            excluded.update({key: reason for key, (_, reason) in refused.items()})
        if not link:
            return StagedBuild(preset=p, target=target, source=mod, fused_ops=fused_ops, graph=graph,
                               scheduled=scheduled, lowered=scheduled, executable=None, stage_seconds=seconds,
                               ptxas=ptxas)
        emit(ProgressEvent("lower"))
        start = time.perf_counter()
        lowered = _run(stages.lower, scheduled, f"tvm_ext.{p.name}.lower")
        seconds["lower"] = time.perf_counter() - start
        emit(ProgressEvent("build"))
        start = time.perf_counter()
        tir_pipeline = p.tir_pipeline if is_gpu_target(target) else "default"
        executable = tvm.compile(snapshot(lowered), target, relax_pipeline=None, tir_pipeline=tir_pipeline)
        seconds["build"] = time.perf_counter() - start
    logger.info("built with preset %s for %s: %s", p.name, target.kind.name,
                ", ".join(f"{stage} {sec:.1f} s" for stage, sec in seconds.items()))
    return StagedBuild(preset=p, target=target, source=mod, fused_ops=fused_ops, graph=graph,
                       scheduled=scheduled, lowered=lowered, executable=executable, stage_seconds=seconds,
                       ptxas=ptxas)


__all__ = ["CUDA_GRAPH_CONFIG", "StagePasses", "StagedBuild", "WithCudaGraph", "build", "cost_model",
           "cuda_graph_context", "generators_for",
           "graph_passes", "preset_passes", "preset_pipeline", "snapshot"]
