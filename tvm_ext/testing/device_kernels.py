"""The device kernels TVM makes of a module: host/device split, launch parameters, no codegen read-back.

``tvm.compile`` keeps only generated code; tests that check what the TIR pipeline set on a
device kernel (its ``"tirx.kernel_launch_params"``: cooperative launch, dynamic shared memory)
compile through a pipeline that is ``"tvm_ext"``'s followed by a pass recording the module.

Example
-------
>>> kernels = device_kernels(tvm.IRModule({"fig7": func}), target)
>>> launch_params(kernels["fig7_kernel"])[-1]
'tirx.use_cooperative_launch'
"""
from __future__ import annotations

import tvm
from tvm import tirx

from ..tir import PIPELINE_NAME, is_device_kernel

_CAPTURE = "tvm_ext.testing.capture"
_CAPTURED: list = []


def _capture_factory():
    passes, finalize_host, finalize_device = tvm.tirx.get_tir_pipeline(PIPELINE_NAME)

    @tvm.transform.module_pass(opt_level=0, name="tvm_ext.testing.CaptureDeviceKernels")
    def capture(mod, _ctx):
        _CAPTURED.append(mod)
        return mod

    return tvm.transform.Sequential([passes, capture]), finalize_host, finalize_device


def device_kernels(mod: tvm.IRModule, target: tvm.target.Target) -> dict[str, tirx.PrimFunc]:
    """Compile ``mod`` for ``target`` with the ``"tvm_ext"`` TIR pipeline; its device kernels by name."""
    from tvm.tirx import compilation_pipeline

    if _CAPTURE not in compilation_pipeline.PIPELINE_MAP:
        compilation_pipeline.register_tir_pipeline(_CAPTURE, _capture_factory)
    _CAPTURED.clear()
    tvm.compile(mod, target, tir_pipeline=_CAPTURE)
    return {gv.name_hint: f for gv, f in _CAPTURED[-1].functions_items() if is_device_kernel(f)}


__all__ = ["device_kernels"]
