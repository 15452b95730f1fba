"""Run a preset's Relax pipeline stage by stage and keep every intermediate module.

``tvm.compile(mod, target, relax_pipeline=preset_pipeline(preset, target))`` runs the
graph, schedule and lower stages in one go inside ``with target:``. :func:`build_stages`
runs exactly the same passes in the same order and scope, but keeps the module after
each stage (and the graph stage split just before ``FuseTIR``, where the fused groups are
still Relax functions), then links the lowered module with ``relax_pipeline=None``.

Example
-------
>>> stages = build_stages(mod, tvm.target.Target("tvm_ext/h100"), "baseline")
>>> stages.fused_ops["main"]      # calls of fused Relax functions (groups)
>>> stages.executable.export_library("model.so")
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import tvm

from ..errors import TVM_ERRORS, PresetError, TvmExtError
from ..pipeline import Preset, get_preset, is_gpu_target

#: Name of the pass that turns fused Relax functions into fused PrimFuncs.
FUSE_TIR = "FuseTIR"


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
        Output of the whole graph stage (fused PrimFuncs, target-independent).
    scheduled : IRModule
        After the schedule stage (GPU-scheduled PrimFuncs).
    lowered : IRModule
        After the lower stage: what the VM code generator and the TIR build consume.
    executable : tvm.runtime.Executable
        ``tvm.compile(lowered, target, relax_pipeline=None)``.
    stage_seconds : dict
        Wall time of ``graph``, ``schedule``, ``lower`` and ``build`` (TIR + codegen).
    """

    preset: Preset
    target: tvm.target.Target
    source: tvm.IRModule
    fused_ops: tvm.IRModule
    graph: tvm.IRModule
    scheduled: tvm.IRModule
    lowered: tvm.IRModule
    executable: tvm.runtime.Executable
    stage_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def compile_seconds(self) -> float:
        """Total wall time of the pipeline and the build."""
        return sum(self.stage_seconds.values())


def resolve_target(target: str | Mapping | tvm.target.Target) -> tvm.target.Target:
    """A ``Target`` from a tag, JSON dict or ``Target``; registers the ``tvm_ext/*`` tags first.

    Raises
    ------
    TvmExtError
        If TVM rejects the description (unknown tag, bad attribute).
    """
    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, str) and target.startswith("tvm_ext/"):
        from ..hardware import register_target_tags

        register_target_tags()
    try:
        return tvm.target.Target(target)
    except TVM_ERRORS as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise TvmExtError(f"invalid target {target!r}: {first}") from None


def _split_before(passes: list, name: str) -> tuple[list, list]:
    names = [p.info.name for p in passes]
    if name not in names:
        return list(passes), []
    cut = names.index(name)
    return list(passes[:cut]), list(passes[cut:])


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


def build_stages(mod: tvm.IRModule, target: tvm.target.Target, preset: str | Preset = "baseline") -> StagedBuild:
    """Compile ``mod`` for a GPU ``target`` with ``preset``, keeping each stage's module.

    Raises
    ------
    PresetError
        Unknown or unimplemented preset.
    TvmExtError
        ``target`` is not a GPU target.
    """
    p = get_preset(preset) if isinstance(preset, str) else preset
    if not p.implemented:
        raise PresetError(f"preset '{p.name}' is not implemented yet")
    if not is_gpu_target(target):
        raise TvmExtError(f"target {target} is not a GPU target (its keys need 'gpu'); "
                          "the report counts GPU kernels")
    seconds: dict[str, float] = {}
    with target:
        start = time.perf_counter()
        before, after = _split_before(p.graph(target), FUSE_TIR)
        fused_ops = _run(before, mod, f"tvm_ext.{p.name}.graph.fuse_ops")
        graph = _run(after, fused_ops, f"tvm_ext.{p.name}.graph.fuse_tir")
        seconds["graph"] = time.perf_counter() - start

        start = time.perf_counter()
        scheduled = _run(p.schedule(target), graph, f"tvm_ext.{p.name}.schedule")
        seconds["schedule"] = time.perf_counter() - start

        start = time.perf_counter()
        lowered = _run(p.lower(target), scheduled, f"tvm_ext.{p.name}.lower")
        seconds["lower"] = time.perf_counter() - start

    start = time.perf_counter()
    with target:  # nvcc-based module creation reads Target.current() for the arch
        executable = tvm.compile(snapshot(lowered), target, relax_pipeline=None, tir_pipeline=p.tir_pipeline)
    seconds["build"] = time.perf_counter() - start
    return StagedBuild(preset=p, target=target, source=mod, fused_ops=fused_ops, graph=graph,
                       scheduled=scheduled, lowered=lowered, executable=executable, stage_seconds=seconds)
