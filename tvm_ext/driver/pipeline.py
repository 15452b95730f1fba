"""The presets as named Relax pipelines of ``tvm.compile``, and ``tvm_ext.compile``.

Registered names: ``"tvm_ext"`` (the preset from :func:`~tvm_ext.driver.presets.use_preset`, the
``TVM_EXT_PRESET`` environment variable, else the default) and ``"tvm_ext.<preset>"`` for every
preset. Example::

    ex = tvm.compile(mod, target="tvm_ext/h100", relax_pipeline="tvm_ext")
    with tvm_ext.use_preset("stitch"):
        ex = tvm.compile(mod, target="tvm_ext/h100", relax_pipeline="tvm_ext", tir_pipeline="tvm_ext")
    ex = tvm_ext.compile("model.onnx", target="tvm_ext/h100", preset="baseline")

A preset whose kernels use an in-kernel grid barrier (``stitch``) also needs its TIR pipeline,
which marks those kernels for cooperative launch: ``tvm.compile(mod, target,
relax_pipeline="tvm_ext.stitch", tir_pipeline="tvm_ext")`` (``tvm_ext.compile`` does this).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import tvm
from tvm import relax

from ..errors import PresetError, TvmExtError
from ..hardware import DEFAULT_TARGET, resolve_target
from .presets import DEFAULT_PRESET, active_preset, get_preset


def _register_relax_pipeline(name: str, choose: Callable[[], str]) -> None:
    if name in relax.pipeline.PIPELINE_MAP:
        return

    def factory(**_: object) -> tvm.transform.Pass:
        # Resolve the preset here, in Python, so a bad name raises PresetError to the caller
        # of tvm.compile instead of a RuntimeError from inside the FFI pass machinery.
        preset = get_preset(choose())

        @tvm.transform.module_pass(opt_level=0, name=name)
        def _run(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
            from .stages import preset_pipeline

            target = tvm.target.Target.current(allow_none=True)
            if target is None:
                raise PresetError(f"pipeline '{name}' needs a target: call tvm.compile(mod, target=...)")
            return preset_pipeline(preset, target)(mod)

        return _run

    relax.pipeline.register_pipeline(name)(factory)


def register_preset_pipeline(preset: str) -> None:
    """Register ``"tvm_ext.<preset>"`` (idempotent)."""
    _register_relax_pipeline(f"tvm_ext.{preset}", lambda: preset)


def register_pipelines() -> None:
    """Register the ``"tvm_ext"`` pipeline (idempotent)."""
    _register_relax_pipeline("tvm_ext", lambda: active_preset().name)


def load_module(model: tvm.IRModule | str | Path, *, shapes: Mapping[str, Sequence[int]] | None = None,
                fp16: bool = False, bind: Mapping[str, Any] | None = None) -> tvm.IRModule:
    """An IRModule (converted to fp16 when asked), or an ONNX path/proto through
    :func:`tvm_ext.frontend.from_onnx` (``shapes``, ``bind`` and ``fp16`` as there).

    Raises
    ------
    TvmExtError
        ``shapes`` or ``bind`` given with an IRModule (they apply to ONNX graph inputs).
    """
    if isinstance(model, tvm.IRModule):
        if shapes or bind:
            raise TvmExtError("shapes= and bind= apply to ONNX models; an IRModule is already imported")
        if not fp16:
            return model
        from ..frontend import ConvertToFloat16

        return ConvertToFloat16()(model)
    from ..frontend import from_onnx

    return from_onnx(model, shapes=shapes, fp16=fp16, bind=bind)


def compile(  # noqa: A001 - mirrors tvm.compile
    model: tvm.IRModule | str | Path,
    target: str | Mapping | tvm.target.Target = DEFAULT_TARGET,
    preset: str = DEFAULT_PRESET,
    *,
    shapes: Mapping[str, Sequence[int]] | None = None,
    fp16: bool = False,
    bind: Mapping[str, Any] | None = None,
    cuda_graph: bool = False,
) -> tvm.runtime.Executable:
    """Compile an IRModule or ONNX file with a preset (short form of ``tvm.compile``).

    Example
    -------
    >>> ex = tvm_ext.compile("bert_layer.onnx", "tvm_ext/h100", preset="baseline")
    >>> tvm_ext.export_library(ex, "bert_layer.so")  # compiled sm_90 SASS + PTX; -lcudart for CUTLASS code

    The executable carries the input signature ``tvm-ext run`` reads (:mod:`tvm_ext.deploy.signature`).
    """
    from ..deploy.signature import attach_signature, signature_of
    from .stages import build

    tgt = resolve_target(target)
    mod = load_module(model, shapes=shapes, fp16=fp16, bind=bind)
    mod = attach_signature(mod, signature_of(mod, tgt.kind.name))  # the inputs `tvm-ext run` feeds it
    return build(mod, tgt, preset, cuda_graph=cuda_graph).executable


__all__ = ["compile", "load_module", "register_pipelines", "register_preset_pipeline"]
