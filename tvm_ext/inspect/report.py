"""What a preset did to a model: kernels, fused groups, traffic, fallbacks, modelled speed.

:func:`inspect` compiles a model for a GPU target with a preset (stage by stage, see
:mod:`tvm_ext.driver.stages`) and reads everything from the compiled artefacts:

* ``kernels`` — GPU kernel launches per inference: for each PrimFunc, its calls in the
  lowered ``main`` times the device kernels one call launches (TIR after host/device split),
  plus every library kernel call (CUTLASS); each launch entry names its generator, schedule
  rule and plan (see :mod:`tvm_ext.inspect.kernels`). ``distinct_kernels`` — ``__global__``
  functions in the generated CUDA source plus distinct library kernels.
* ``selection`` — per Relax function, the candidates each generator proposed, what was chosen
  and what was dropped (and why).
* ``groups`` — the fused groups (one per call of a fused Relax function, or a lone
  ``call_tir``) with member ops, op classes, flops and modelled global traffic
  (:func:`tvm_ext.analysis.group_traffic_default`); ``traffic_bytes`` is their sum.
* ``fallback_ops`` — see :mod:`tvm_ext.inspect.fallback`.
* ``modelled_time_s`` — the *modelled* time of one inference: every launch priced by the cost
  model (:func:`tvm_ext.driver.cost_model`: measured where the database has the kernel, else the
  learned or analytic model; each launch says which) times its calls;
* ``roofline_bound_s`` — a preset-independent *modelled* lower bound:
  ``max(flops / peak_flops(dtype), min_traffic / DRAM bandwidth)`` on the target's device,
  where ``min_traffic`` is the traffic of the whole model as one kernel (inputs and weights
  read once, outputs written once); ``unfused_traffic_bytes`` is the traffic if every op ran
  as its own kernel (:func:`tvm_ext.analysis.min_traffic`).

Example
-------
>>> report = inspect("bert_layer.onnx", target="tvm_ext/h100", preset="baseline")
>>> report.kernels, report.traffic_bytes
>>> print(report.to_table())
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tvm
from tvm import tirx

import json

from ..driver import DEFAULT_PRESET, Preset, StagedBuild, build, cost_model, load_module
from ..graph import OpGraph
from ..errors import TvmExtError
from ..hardware import DEFAULT_TARGET, DeviceSpec, device_from_target, is_gpu_target, load_device, resolve_target
from ..select.attrs import SELECTION_ATTR
from ..select.candidate import dominant_dtype
from ..select.describe import describe_library, describe_scheduled
from ..select.measured import record_fields
from .fallback import FallbackOp, find_fallbacks
from ..toolchain.cuda_source import global_kernel_names
from .kernels import KernelLaunches, cuda_source, kernel_launches, library_kernels
from .render import report_html, report_table


#: Label attached to every modelled (not measured) number.
MODELLED = "modelled"


@dataclass(frozen=True)
class GroupInfo:
    """One fused group (becomes one PrimFunc).

    Attributes
    ----------
    name : str
        The fused Relax function's name (``fused_matmul_add_gelu``) or, for an op left alone,
        its PrimFunc name.
    func : str or None
        The PrimFunc that computes the group after ``FuseTIR`` (None if it has none).
    ops, op_classes : tuple of str
        Member PrimFunc names and their :class:`tvm_ext.graph.OpClass` values, in order.
    flops : int
        Floating-point operations of the group.
    traffic_bytes : int
        Modelled global-memory traffic (each external input read once, each escaping output
        written once).
    kernels : int
        Kernel launches of one call of ``func`` (0 when lowering turned it into a view,
        e.g. a reshape, or for external calls).
    """

    name: str
    func: str | None
    ops: tuple[str, ...]
    op_classes: tuple[str, ...]
    flops: int
    traffic_bytes: int
    kernels: int

    def to_json(self) -> dict:
        """JSON-serialisable form."""
        return {"name": self.name, "func": self.func, "ops": list(self.ops), "op_classes": list(self.op_classes),
                "flops": self.flops, "traffic_bytes": self.traffic_bytes, "kernels": self.kernels}


@dataclass
class Report:
    """Result of :func:`inspect`; ``to_json``, ``to_table`` and ``_repr_html_`` render it.

    Attributes
    ----------
    kernels : int
        GPU kernel launches per inference (sum of :attr:`KernelLaunches.launches`).
    distinct_kernels : int
        ``__global__`` functions in the generated CUDA source.
    launches : list of KernelLaunches
        Per PrimFunc: calls per inference, kernels per call, kernel names.
    groups : list of GroupInfo
        Fused groups, in graph order (one entry per call site).
    traffic_bytes : int
        Modelled global traffic, sum over groups.
    min_traffic_bytes, unfused_traffic_bytes : int
        The whole model as one kernel / every op as its own kernel.
    flops : int
        Floating-point work of one inference; ``dtype`` is the type doing most of it.
    fallback_ops : list of FallbackOp
        What was left to default lowering and why.
    schedule_rules : dict
        Kernel -> what scheduled it (a generator's verdict, dlight's rule, ``"library"``).
    selection : dict
        Per Relax function: candidates proposed and chosen per generator, dropped candidates.
    modelled_time_s : float
        Modelled time of one inference: the sum over launches of calls x modelled seconds.
    roofline_bound_s : float
        Modelled roofline lower bound (``max(roofline_compute_s, roofline_memory_s)``), not a measurement.
    compile_seconds, stage_seconds
        Wall time of the pipeline and build, in total and per stage.
    cuda_source : str or None
        Generated CUDA source when ``keep_source`` was asked for.
    build : StagedBuild
        The modules of every stage and the executable (not serialised).
    """

    model: str
    device: str
    preset: str
    target: str
    kernels: int
    distinct_kernels: int
    launches: list[KernelLaunches]
    groups: list[GroupInfo]
    traffic_bytes: int
    min_traffic_bytes: int
    unfused_traffic_bytes: int
    flops: int
    dtype: str
    fallback_ops: list[FallbackOp]
    schedule_rules: dict[str, str]
    selection: dict[str, Any]
    modelled_time_s: float
    roofline_bound_s: float
    roofline_compute_s: float
    roofline_memory_s: float
    compile_seconds: float
    stage_seconds: dict[str, float]
    cuda_source: str | None = None
    build: StagedBuild | None = field(default=None, repr=False, compare=False)

    @property
    def executable(self) -> tvm.runtime.Executable | None:
        """The compiled VM executable (``export_library`` it to ship the model)."""
        return None if self.build is None else self.build.executable

    def to_json(self) -> dict[str, Any]:
        """JSON-serialisable dict (``cuda_source`` only when it was kept)."""
        out: dict[str, Any] = {
            "model": self.model,
            "device": self.device,
            "preset": self.preset,
            "target": self.target,
            "kernels": int(self.kernels),
            "distinct_kernels": int(self.distinct_kernels),
            "launches": [{"func": k.func, "calls": k.calls, "kernels_per_call": k.kernels_per_call,
                          "launches": k.launches, "kernel_names": list(k.kernel_names),
                          "generator": k.generator, "schedule_rule": k.rule, "plan": k.plan,
                          "modelled_s": k.modelled_s, "cost_source": k.cost_source}
                         for k in self.launches],
            "selection": self.selection,
            "groups": [list(g.ops) for g in self.groups],
            "group_details": [g.to_json() for g in self.groups],
            "traffic_bytes": int(self.traffic_bytes),
            "min_traffic_bytes": int(self.min_traffic_bytes),
            "unfused_traffic_bytes": int(self.unfused_traffic_bytes),
            "flops": int(self.flops),
            "dtype": self.dtype,
            "fallback_ops": [f.to_json() for f in self.fallback_ops],
            "modelled_time_s": float(self.modelled_time_s),
            "modelled_time_label": f"{MODELLED}: sum over launches of calls x the cost model's seconds per call",
            "roofline_bound_s": float(self.roofline_bound_s),
            "roofline_bound_label": f"{MODELLED} roofline lower bound: max(flops / peak {self.dtype} FLOP/s, "
                                    "min traffic / DRAM bandwidth)",
            "compile_seconds": round(float(self.compile_seconds), 4),
            "stage_seconds": {k: round(float(v), 4) for k, v in self.stage_seconds.items()},
        }
        if self.cuda_source is not None:
            out["cuda_source"] = self.cuda_source
        return out

    def to_table(self) -> str:
        """Readable plain-text report."""
        return report_table(self)

    def _repr_html_(self) -> str:
        return report_html(self)


def _model_name(model: Any) -> str:
    if isinstance(model, tvm.IRModule):
        return "IRModule"
    if isinstance(model, (str, Path)):
        return Path(model).name
    graph = getattr(model, "graph", None)
    return getattr(graph, "name", None) or type(model).__name__


def _base_name(group: str) -> str:
    """``"fused_matmul_add#2"`` (OpGraph's name of a later call site) -> ``"fused_matmul_add"``."""
    base, sep, count = group.rpartition("#")
    return base if sep and count.isdigit() else group


def group_instances(graph: OpGraph) -> list[tuple[str, list[int]]]:
    """(fused function name, member node indices) per call site of a fused function, and
    (PrimFunc name, [index]) for each op left alone, in graph order."""
    out: list[tuple[str, list[int]]] = []
    position: dict[str, int] = {}
    for node in graph.nodes:
        if node.group is None:
            out.append((node.func_name, [node.index]))
            continue
        if node.group not in position:
            position[node.group] = len(out)
            out.append((_base_name(node.group), []))
        out[position[node.group]][1].append(node.index)
    return out


def _groups(graph: OpGraph, stages: StagedBuild, launches: list[KernelLaunches],
            library: dict[str, dict]) -> list[GroupInfo]:
    """One entry per fused group (call site), with its PrimFunc's kernels per call; a library
    kernel's flops come from its record (the graph sees an opaque call)."""
    from ..analysis import group_traffic_default

    prim_names = {gv.name_hint for gv, f in stages.graph.functions_items() if isinstance(f, tirx.PrimFunc)}
    per_call = {k.func: k.kernels_per_call for k in launches}
    groups = []
    for name, members in group_instances(graph):
        nodes = [graph.nodes[j] for j in members]
        func = name if name in prim_names or name in library else None
        flops = int(library[name].get("flops", 0)) if name in library else int(sum(n.flops for n in nodes))
        groups.append(GroupInfo(
            name=name, func=func,
            ops=tuple(n.func_name for n in nodes),
            op_classes=tuple(n.op_class.value for n in nodes),
            flops=flops,
            traffic_bytes=int(group_traffic_default(graph, members)),
            kernels=per_call.get(func, 0) if func is not None else 0,
        ))
    return groups


def price_launches(launches: list[KernelLaunches], stages: StagedBuild, library: dict[str, dict],
                   device: DeviceSpec) -> list[KernelLaunches]:
    """``launches`` with the modelled seconds of one call and the cost source of each."""
    model = cost_model(stages.preset)
    built = {gv.name_hint for gv in stages.graph.get_global_vars()} & {gv.name_hint for gv in
                                                                      stages.scheduled.get_global_vars()}
    priced = []
    for k in launches:
        kernel = None
        if k.rule == "library":
            kernel = describe_library(library.get(k.func, {}))
        elif k.func in built:
            kernel = describe_scheduled(stages.graph[k.func], stages.scheduled[k.func])
        if kernel is None:
            priced.append(k)
            continue
        est = model.cost(kernel, device)
        priced.append(dataclasses.replace(k, modelled_s=est.seconds, cost_source=est.source,
                                          measurement=record_fields(kernel)))
    return priced


def report_from_stages(stages: StagedBuild, *, model_name: str = "IRModule", device: DeviceSpec | None = None,
                       keep_source: bool = False, target_label: str | None = None) -> Report:
    """Build the :class:`Report` of an already compiled :class:`StagedBuild`."""
    from ..analysis import group_traffic_default, min_traffic

    spec = device if device is not None else device_from_target(stages.target)
    graph = OpGraph.from_module(stages.fused_ops)
    launches = kernel_launches(stages.lowered, stages.target)
    source = cuda_source(stages.executable)
    library = library_kernels(stages.lowered)
    launches = price_launches(launches, stages, library, spec)
    groups = _groups(graph, stages, launches, library)
    group_ops = {g.func: g.ops for g in groups if g.func is not None}
    fallbacks = find_fallbacks(graph, group_ops, stages.scheduled, set(library))
    selection = {}
    if stages.graph.attrs is not None and SELECTION_ATTR in stages.graph.attrs:
        selection = json.loads(str(stages.graph.attrs[SELECTION_ATTR]))
    flops = int(sum(g.flops for g in groups))
    dtype = dominant_dtype(graph, range(len(graph.nodes)))
    everything = list(range(len(graph.nodes)))
    # lower bound: the whole model as one kernel (inputs and weights read once, outputs written once)
    least = int(group_traffic_default(graph, everything)) if everything else 0
    unfused = int(min_traffic(graph, everything)) if everything else 0
    compute_s = flops / spec.peak_flops_for(dtype)
    memory_s = least / spec.dram_bandwidth_bytes_per_s
    return Report(
        model=model_name, device=spec.name, preset=stages.preset.name,
        target=target_label or str(stages.target),
        kernels=sum(k.launches for k in launches),
        distinct_kernels=len(global_kernel_names(source)) + len({k.plan for k in launches if k.rule == "library"}),
        launches=launches, groups=groups, traffic_bytes=sum(g.traffic_bytes for g in groups),
        min_traffic_bytes=least, unfused_traffic_bytes=unfused, flops=flops, dtype=dtype,
        fallback_ops=fallbacks, schedule_rules={k.func: k.rule for k in launches}, selection=selection,
        modelled_time_s=sum(k.calls * (k.modelled_s or 0.0) for k in launches),
        roofline_bound_s=max(compute_s, memory_s), roofline_compute_s=compute_s, roofline_memory_s=memory_s,
        compile_seconds=stages.compile_seconds, stage_seconds=dict(stages.stage_seconds),
        cuda_source=source if keep_source else None, build=stages,
    )


def inspect(model_or_mod: Any, target: str | Mapping | tvm.target.Target = DEFAULT_TARGET,
            preset: str | Preset = DEFAULT_PRESET, *, shapes: Mapping[str, Sequence[int]] | None = None, fp16: bool = False,
            bind: Mapping[str, Any] | None = None, device: str | DeviceSpec | None = None, keep_source: bool = False) -> Report:
    """Compile a model for a GPU target with a preset and report what happened.

    Parameters
    ----------
    model_or_mod : IRModule, str, Path or onnx.ModelProto
        The model (ONNX is imported with :func:`tvm_ext.frontend.from_onnx`).
    target : str, dict or Target
        A GPU target, e.g. ``"tvm_ext/h100"``.
    preset : str or Preset
        Preset name (``tvm-ext presets``) or a :class:`tvm_ext.driver.Preset` object
        (which need not be registered).
    shapes : mapping, optional
        Bindings of free input dimensions, e.g. ``{"input_ids": (1, 128)}``.
    fp16 : bool
        Convert the model to float16 first (ONNX: at import; IRModule: with
        :class:`tvm_ext.frontend.ConvertToFloat16`).
    bind : mapping, optional
        Values of ONNX graph inputs that become constants, e.g. ``{"shape": [1, -1, 64]}``
        (see :func:`tvm_ext.frontend.from_onnx`).
    device : str or DeviceSpec, optional
        Device for the modelled numbers; default: the target's device.
    keep_source : bool
        Keep the generated CUDA source in :attr:`Report.cuda_source`.

    Raises
    ------
    TvmExtError
        Bad model, shapes, target or preset.
    """
    tgt = resolve_target(target)
    if not is_gpu_target(tgt):
        raise TvmExtError(f"target {tgt} is not a GPU target (its keys need 'gpu'); the report counts GPU kernels")
    spec = load_device(device) if device is not None else device_from_target(tgt)
    start = time.perf_counter()
    mod = load_module(model_or_mod, shapes=shapes, fp16=fp16, bind=bind)
    import_s = time.perf_counter() - start
    stages = build(mod, tgt, preset)
    stages.stage_seconds = {"import": import_s, **stages.stage_seconds}
    label = target if isinstance(target, str) else str(tgt)
    return report_from_stages(stages, model_name=_model_name(model_or_mod), device=spec, keep_source=keep_source,
                              target_label=label)
