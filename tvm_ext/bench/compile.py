"""Compile one prepared model with one preset and export it: one :class:`BuildEntry`.

Both kinds of target go through the one driver (:func:`tvm_ext.driver.build`). GPU targets
then get the report (:func:`tvm_ext.inspect.report_from_stages`: kernel launches of every
generator, modelled traffic and roofline); CPU (``llvm``) targets, used to test bundles without
a GPU, count the PrimFunc calls of one inference as their ``kernels``. With ``cuda_graph`` the
build sets ``relax.backend.use_cuda_graph`` (TVM's ``RewriteCUDAGraph`` then captures the static
parts of ``main`` into CUDA graphs).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import tvm

from ..errors import TVM_ERRORS, TvmExtError
from ..toolchain.device_code import check_device_code
from ..toolchain.export import export_library
from .manifest import BuildEntry
from .prepare import PreparedModel

log = logging.getLogger(__name__)



@dataclass
class ModelCost:
    """Target-independent numbers of a model from its operator graph."""

    flops: int
    min_traffic_bytes: int
    compute_dtype: str


def system_name(preset: str, cuda_graph: bool) -> str:
    """``baseline`` or ``baseline+cudagraph``."""
    return f"{preset}+cudagraph" if cuda_graph else preset


def library_name(model: str, system: str) -> str:
    """``lib/<model>__<system>.so`` (``+`` spelled ``_``)."""
    return f"lib/{model}__{system.replace('+', '_')}.so"


def build_system(prepared: PreparedModel, preset: str, target: tvm.target.Target, bundle: Path, *,
                 cuda_graph: bool = False) -> tuple[BuildEntry, ModelCost | None]:
    """Compile ``prepared`` with ``preset`` for ``target``, export it into ``bundle``.

    Returns the build entry and, when the build computed them, the model's flops and
    least traffic. Build errors are returned in the entry (``status="failed"``), not raised.
    """
    system = system_name(preset, cuda_graph)
    entry = BuildEntry(system=system, preset=preset, cuda_graph=cuda_graph, library=library_name(
        prepared.source.name, system))
    path = bundle / str(entry.library)
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        from ..driver import build  # noqa: PLC0415
        from ..hardware import is_gpu_target  # noqa: PLC0415

        stages = build(prepared.mod, target, preset, cuda_graph=cuda_graph)
        if is_gpu_target(target):
            cost = _export_gpu(stages, prepared, entry, path)
        else:
            cost = _export_cpu(stages, prepared, entry, path)
    except TVM_ERRORS + (AssertionError, TvmExtError) as err:
        # what TVM's passes raise (AssertionError: dlight's rules assert), and ours (bad preset, source
        # embedded): one failing build must not stop the others
        entry.status, entry.error = "failed", f"{type(err).__name__}: {' '.join(str(err).split())[:1000]}"
        entry.library = None
        log.warning("%s/%s failed: %s", prepared.source.name, system, entry.error)
        return entry, None
    entry.compile_s = round(time.perf_counter() - start, 3)
    entry.library_bytes = path.stat().st_size
    return entry, cost


def _export_gpu(stages, prepared: PreparedModel, entry: BuildEntry, path: Path) -> ModelCost:
    from ..inspect import report_from_stages  # noqa: PLC0415

    report = report_from_stages(stages, model_name=prepared.source.name)
    # compiles the device code, links -lcudart for CUTLASS; no host debug info (a bundle must travel)
    exported = export_library(report.executable, path, strip_debug=True)
    entry.device_code = check_device_code(path)
    entry.kernels = int(report.kernels)
    entry.distinct_kernels = int(report.distinct_kernels)
    entry.modelled_traffic_bytes = int(report.traffic_bytes)
    entry.modelled_time_s = float(report.modelled_time_s)
    entry.stage_s = {k: round(float(v), 3) for k, v in report.stage_seconds.items()}
    entry.kernel_list = [{"func": k.func, "kernel_names": list(k.kernel_names), "calls": k.calls,
                          "generator": k.generator, "rule": k.rule, "modelled_s": k.modelled_s,
                          "cost_source": k.cost_source, "measurement": k.measurement}
                         for k in report.launches if k.launches]
    if exported.nvcc_seconds:
        entry.stage_s["nvcc"] = round(exported.nvcc_seconds, 3)
    return ModelCost(int(report.flops), int(report.min_traffic_bytes), str(report.dtype))


def _export_cpu(stages, prepared: PreparedModel, entry: BuildEntry, path: Path) -> ModelCost:
    from ..analysis import group_traffic_default  # noqa: PLC0415
    from ..graph import OpGraph  # noqa: PLC0415
    from ..inspect import primfunc_calls  # noqa: PLC0415

    stages.executable.export_library(str(path))
    entry.device_code = "host"
    calls = primfunc_calls(stages.lowered, "main")
    entry.kernels = int(sum(calls.values()))
    entry.distinct_kernels = len(calls)
    entry.stage_s = {k: round(v, 3) for k, v in stages.stage_seconds.items()}
    opgraph = OpGraph.from_module(stages.fused_ops)
    every = list(range(len(opgraph.nodes)))
    least = int(group_traffic_default(opgraph, every)) if every else 0
    return ModelCost(int(sum(n.flops for n in opgraph.nodes)), least, prepared.dtype)


__all__ = ["ModelCost", "system_name", "library_name", "build_system"]
