"""Presets and their registration as named Relax pipelines of ``tvm.compile``.

A preset turns techniques on and off. Its pipeline has three stages:

* **graph** — target-independent Relax passes up to and including ``FuseTIR``: the result
  is a fused module that builds for ``llvm`` too (the CPU correctness oracle uses it);
* **schedule** — GPU scheduling of the fused PrimFuncs (only for GPU targets);
* **lower** — TVM's dataflow lowering and finalization for the VM.

Registered pipeline names: ``"tvm_ext"`` (preset from :func:`use_preset`, default
``"baseline"``) and ``"tvm_ext.<preset>"`` for every preset. Example::

    ex = tvm.compile(mod, target="tvm_ext/h100", relax_pipeline="tvm_ext")
    with tvm_ext.use_preset("baseline"):
        ex = tvm.compile(mod, target="tvm_ext/h100", relax_pipeline="tvm_ext")
    ex = tvm_ext.compile("model.onnx", target="tvm_ext/h100", preset="baseline")

A preset whose kernels use an in-kernel grid barrier (``stitch``) also needs its TIR pipeline,
which marks those kernels for cooperative launch: ``tvm.compile(mod, target,
relax_pipeline="tvm_ext.stitch", tir_pipeline="tvm_ext")`` (``tvm_ext.compile`` does this).
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import tvm
from tvm import relax

from .errors import PresetError

DEFAULT_PRESET = "baseline"
_ACTIVE_PRESET: contextvars.ContextVar[str | None] = contextvars.ContextVar("tvm_ext_preset", default=None)

PassList = list  # list[tvm.transform.Pass]


def _baseline_graph(target: tvm.target.Target) -> PassList:
    """TVM 0.27's default CUDA library dispatch + legalize + fuse, without the dlight step."""
    from tvm.relax.backend.cuda import pipeline as cuda

    passes = cuda.library_dispatch_passes(target) + cuda.legalize_passes(target)
    return [p for p in passes if p.info.name != "ApplyDefaultSchedule"]


def _baseline_schedule(target: tvm.target.Target) -> PassList:
    """The dlight step of TVM 0.27's default CUDA pipeline: the same rules in the same order.

    Applied per function by :class:`~tvm_ext.default_schedule.SafeDefaultSchedule`, so the
    kernels are TVM's own whenever TVM succeeds; where one of its rules raises (dlight's Matmul
    rule does on EfficientNet-B0), that function takes the next rule and the report lists it,
    instead of the whole build aborting.
    """
    from .default_schedule import SafeDefaultSchedule

    return [SafeDefaultSchedule()]


def _default_lower(target: tvm.target.Target) -> PassList:
    from tvm.relax.backend.cuda import pipeline as cuda

    return cuda.dataflow_lower_passes(target) + cuda.finalize_passes(target)


def _stitch_graph(target: tvm.target.Target) -> PassList:
    """AStitch: memory-intensive groups stitched instead of TVM's FuseOps."""
    from .stitch import stitch_graph_passes

    return stitch_graph_passes(target)


def _stitch_schedule(target: tvm.target.Target) -> PassList:
    """Our schedules for stitched kernels, dlight's default rules for the rest."""
    from .stitch import stitch_schedule_passes

    return stitch_schedule_passes(target)


def _cutlass_graph(target: tvm.target.Target) -> PassList:
    """Bolt: offload GEMM/conv (+epilogues) to CUTLASS, then the baseline graph stage."""
    from .cutlass import offload_passes

    return offload_passes(target) + _baseline_graph(target)


@dataclass(frozen=True)
class Preset:
    """A named combination of techniques.

    Parameters
    ----------
    name : str
        Registry key, e.g. ``"baseline"``.
    description : str
        One line for ``tvm-ext presets`` and the README table.
    techniques : tuple of str
        Technique packages it enables (empty for ``baseline``).
    graph : callable or None
        ``target -> [Pass]``: target-independent passes through ``FuseTIR``.
        ``None`` means the preset is planned but not implemented yet.
    schedule : callable
        ``target -> [Pass]``: GPU scheduling of the fused PrimFuncs.
    lower : callable
        ``target -> [Pass]``: Relax dataflow lowering and VM finalization.
    tir_pipeline : str
        The TIR pipeline ``tvm.compile`` must use for this preset's kernels.
    """

    name: str
    description: str
    techniques: tuple[str, ...] = ()
    graph: Callable[[tvm.target.Target], PassList] | None = None
    schedule: Callable[[tvm.target.Target], PassList] = _baseline_schedule
    lower: Callable[[tvm.target.Target], PassList] = _default_lower
    #: TIR pipeline name for ``tvm.compile(..., tir_pipeline=...)``; presets whose kernels need
    #: launch attributes added after host/device split (grid sync) name ``"tvm_ext"``.
    tir_pipeline: str = "default"

    @property
    def implemented(self) -> bool:
        """Whether the preset can be used."""
        return self.graph is not None


_PRESETS: dict[str, Preset] = {}


def register_preset(preset: Preset, override: bool = False) -> Preset:
    """Add a preset to the registry (and a ``tvm_ext.<name>`` Relax pipeline)."""
    if preset.name in _PRESETS and not override:
        raise PresetError(f"preset '{preset.name}' is already registered")
    _PRESETS[preset.name] = preset
    _register_relax_pipeline(f"tvm_ext.{preset.name}", lambda: preset.name)
    return preset


def list_presets() -> list[Preset]:
    """All registered presets, implemented or not."""
    return list(_PRESETS.values())


def get_preset(name: str) -> Preset:
    """Look up an implemented preset; a clear error names what exists."""
    available = sorted(p.name for p in _PRESETS.values() if p.implemented)
    if name not in _PRESETS:
        raise PresetError(f"unknown preset '{name}'; available presets: {', '.join(available)}")
    preset = _PRESETS[name]
    if not preset.implemented:
        raise PresetError(f"preset '{name}' ({preset.description}) is not implemented yet; "
                          f"available presets: {', '.join(available)}")
    return preset


@contextlib.contextmanager
def use_preset(name: str) -> Iterator[Preset]:
    """Make ``name`` the preset of the ``"tvm_ext"`` pipeline inside the ``with`` block."""
    preset = get_preset(name)
    token = _ACTIVE_PRESET.set(name)
    try:
        yield preset
    finally:
        _ACTIVE_PRESET.reset(token)


def active_preset() -> Preset:
    """The preset the ``"tvm_ext"`` pipeline uses now (``TVM_EXT_PRESET`` env var, else baseline)."""
    return get_preset(_ACTIVE_PRESET.get() or os.environ.get("TVM_EXT_PRESET") or DEFAULT_PRESET)


def is_gpu_target(target: tvm.target.Target | None) -> bool:
    """True for targets that take the GPU (schedule) path."""
    return target is not None and "gpu" in list(target.keys)


def graph_passes(preset: str | Preset, target: tvm.target.Target | None = None) -> tvm.transform.Pass:
    """The preset's target-independent stage as one ``Sequential``."""
    p = get_preset(preset) if isinstance(preset, str) else preset
    tgt = target or tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    return tvm.transform.Sequential(p.graph(tgt), name=f"tvm_ext.{p.name}.graph")


def preset_pipeline(preset: str | Preset, target: tvm.target.Target) -> tvm.transform.Pass:
    """The whole Relax pipeline of a preset for ``target``.

    GPU targets get graph + schedule + lower. Other targets (``llvm``) get the graph stage
    followed by TVM's generic ``default_build`` lowering, so fused groups run on the CPU.
    """
    p = get_preset(preset) if isinstance(preset, str) else preset
    if is_gpu_target(target):
        stages = p.graph(target) + p.schedule(target) + p.lower(target)
    else:
        stages = p.graph(target) + [relax.get_pipeline("default_build")]
    return tvm.transform.Sequential(stages, name=f"tvm_ext.{p.name}")


def _register_relax_pipeline(name: str, choose: Callable[[], str]) -> None:
    if name in relax.pipeline.PIPELINE_MAP:
        return

    def factory(**_: object) -> tvm.transform.Pass:
        # Resolve the preset here, in Python, so a bad name raises PresetError to the caller
        # of tvm.compile instead of a RuntimeError from inside the FFI pass machinery.
        preset = get_preset(choose())

        @tvm.transform.module_pass(opt_level=0, name=name)
        def _run(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
            target = tvm.target.Target.current(allow_none=True)
            if target is None:
                raise PresetError(f"pipeline '{name}' needs a target: call tvm.compile(mod, target=...)")
            return preset_pipeline(preset, target)(mod)

        return _run

    relax.pipeline.register_pipeline(name)(factory)


def register_pipelines() -> None:
    """Register the ``"tvm_ext"`` pipeline (idempotent)."""
    _register_relax_pipeline("tvm_ext", lambda: active_preset().name)


def compile(  # noqa: A001 - mirrors tvm.compile
    model: tvm.IRModule | str | Path,
    target: str | Mapping | tvm.target.Target = "tvm_ext/h100",
    preset: str = DEFAULT_PRESET,
    *,
    shapes: Mapping[str, Sequence[int]] | None = None,
    fp16: bool = False,
) -> tvm.runtime.Executable:
    """Compile an IRModule or ONNX file with a preset (short form of ``tvm.compile``).

    Example
    -------
    >>> ex = tvm_ext.compile("bert_layer.onnx", "tvm_ext/h100", preset="baseline")
    >>> tvm_ext.export_library(ex, "bert_layer.so")  # adds -lcudart if CUTLASS code is inside
    """
    mod = load_module(model, shapes=shapes, fp16=fp16)
    tgt = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    p = get_preset(preset)
    return tvm.compile(mod, tgt, relax_pipeline=preset_pipeline(p, tgt), tir_pipeline=p.tir_pipeline)


def load_module(model: tvm.IRModule | str | Path, *, shapes: Mapping[str, Sequence[int]] | None = None,
                fp16: bool = False) -> tvm.IRModule:
    """An IRModule (converted to fp16 when asked), or an ONNX path/proto through
    :func:`tvm_ext.frontend.from_onnx`."""
    if isinstance(model, tvm.IRModule):
        if not fp16:
            return model
        from .frontend import ConvertToFloat16

        return ConvertToFloat16()(model)
    from .frontend import from_onnx

    return from_onnx(model, shapes=shapes, fp16=fp16)


def _planned(name: str, description: str, techniques: tuple[str, ...]) -> Preset:
    return Preset(name=name, description=description, techniques=techniques, graph=None)


register_preset(Preset("baseline", "TVM 0.27's default CUDA pipeline, unchanged (dlight schedules)",
                       graph=_baseline_graph))
register_preset(Preset("stitch", "AStitch: memory-intensive subgraphs stitched into one kernel, then baseline",
                       techniques=("stitch",), graph=_stitch_graph, schedule=_stitch_schedule,
                       tir_pipeline="tvm_ext"))
register_preset(Preset("cutlass", "Bolt: GEMM/conv offload to CUTLASS with epilogue fusion, then baseline",
                       techniques=("cutlass",), graph=_cutlass_graph))
for _name, _desc, _tech in [
    ("tilegraph", "Welder: tile-graph fusion across memory levels", ("tilegraph",)),
    ("orchestrate", "Korch: operator fission + optimal kernel selection (BLP)", ("fission", "orchestrate")),
    ("subprogram", "SOUFFLE: global analysis, grid-synced multi-stage kernels", ("subprogram",)),
    ("full", "every technique, one selector over all candidates",
     ("cutlass", "fission", "stitch", "tilegraph", "subprogram", "orchestrate")),
]:
    register_preset(_planned(_name, _desc, _tech))
