"""Compile a model into a deployable library: ``tvm-ext compile`` (build side, needs TVM's compiler).

:func:`build_library` imports the model, keeps its weights outside when asked
(:mod:`.weights`), attaches the input signature ``tvm-ext run`` reads (:mod:`.signature`),
compiles it with a preset (GPU targets through the report, which counts kernels) and exports it
with compiled device code (:func:`tvm_ext.toolchain.export_library`).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

#: Progress steps of :func:`build_library` (the last one runs nvcc for GPU targets).
STEPS = ("import", "compile", "export")


@dataclass
class BuiltLibrary:
    """What :func:`build_library` wrote and how."""

    exported: Any  # tvm_ext.toolchain.export.ExportedLibrary
    preset: str
    target: str
    gpu: bool
    compile_seconds: float
    kernels: tuple[int, int] | None = None  # launches, distinct kernels (GPU targets)
    params_file: Path | None = None
    weights: list[np.ndarray] = field(default_factory=list)

    def summary(self) -> list[str]:
        """The lines ``tvm-ext compile`` prints: size, device code and archs, where the weights are."""
        ex = self.exported
        kernels = (f", {self.kernels[0]} kernel launches ({self.kernels[1]} distinct kernels)"
                   if self.kernels is not None else "")
        lines = [f"wrote {ex.path} ({_size(ex.size_bytes)}): preset {self.preset}, target {self.target}{kernels}, "
                 f"compiled in {self.compile_seconds:.2f} s"]
        nvcc = f", nvcc {ex.nvcc_seconds:.1f} s" if ex.nvcc_seconds else ""
        cutlass = "; CUTLASS objects linked with libcudart" if ex.cutlass_objects else ""
        lines.append(f"device code: {ex.describe_device_code() if self.gpu else 'none (CPU library)'}{nvcc}{cutlass}")
        if self.weights:
            total = sum(int(w.nbytes) for w in self.weights)
            lines.append(f"weights: outside the library, {len(self.weights)} tensors ({_size(total)}) in "
                         f"{self.params_file} (tvm-ext run loads it from beside the library)")
        else:
            lines.append("weights: inside the library")
        lines.append(f"run it with the TVM runtime alone: tvm-ext run {ex.path}")
        return lines


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"


def build_library(model: Any, output: str | Path, target: str, preset: str, *,
                  shapes: Mapping[str, Sequence[int]] | None = None, fp16: bool = False,
                  bind: Mapping[str, Any] | None = None, weights_outside: bool = False, embed_source: bool = False,
                  check_kernels: bool = False, progress: Callable[[str], None] | None = None) -> BuiltLibrary:
    """Compile ``model`` with ``preset`` for ``target`` and export it to ``output`` (see the module docstring).

    With ``weights_outside`` the weights go to ``<output stem>.params.npz`` beside the library; with
    ``check_kernels`` every generator kernel is emulated before it is used and one with findings is
    replaced (:class:`~tvm_ext.driver.Preset`'s ``check_kernels``).

    Raises
    ------
    TvmExtError
        Bad model, shapes, target or preset; no toolkit to compile the device code.
    """
    from ..driver import build, get_preset, load_module  # noqa: PLC0415
    from ..hardware import is_gpu_target, resolve_target  # noqa: PLC0415
    from ..inspect import inspect  # noqa: PLC0415
    from ..toolchain import export_library  # noqa: PLC0415
    from .signature import attach_signature, signature_of  # noqa: PLC0415
    from .weights import externalize_weights, save_params  # noqa: PLC0415

    step = progress or (lambda _name: None)
    out = Path(output)
    tgt = resolve_target(target)
    gpu = is_gpu_target(tgt)
    params_file = out.with_name(out.stem + ".params.npz") if weights_outside else None
    step("import")
    mod = load_module(model, shapes=shapes, fp16=fp16, bind=bind)
    weights: list[np.ndarray] = []
    if params_file is not None:
        mod, weights = externalize_weights(mod)
    mod = attach_signature(mod, signature_of(mod, tgt.kind.name, params_file.name if weights else None))
    step("compile")
    start = time.perf_counter()
    chosen = dataclasses.replace(get_preset(preset), check_kernels=True) if check_kernels else preset
    report = inspect(mod, tgt, chosen) if gpu else None
    ex = report.executable if report is not None else build(mod, tgt, chosen).executable
    seconds = report.compile_seconds if report is not None else time.perf_counter() - start
    step("export")
    exported = export_library(ex, out, target=tgt, embed_source=embed_source)
    if weights:
        save_params(weights, params_file)
    kernels = (int(report.kernels), int(report.distinct_kernels)) if report is not None else None
    return BuiltLibrary(exported, preset, str(target), gpu, seconds, kernels, params_file if weights else None,
                        weights)


__all__ = ["STEPS", "BuiltLibrary", "build_library"]
