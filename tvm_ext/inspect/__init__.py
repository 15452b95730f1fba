"""Reports on what a preset did to a model: kernels and who built them, fused groups, traffic,
fallbacks, the selection.

Example
-------
>>> from tvm_ext.inspect import inspect
>>> report = inspect("bert_layer.onnx", target="tvm_ext/h100", preset="baseline")
>>> print(report.to_table())        # or report.to_json(), or display it in a notebook
"""
from __future__ import annotations

from .fallback import DLIGHT_FALLBACK_REASON, FallbackOp, find_fallbacks
from .kernels import (KernelLaunches, cuda_source, device_kernels, extern_calls, global_kernel_names,
                      kernel_launches, kernel_source, library_kernels, primfunc_calls)
from .report import GroupInfo, Report, group_instances, inspect, report_from_stages

__all__ = [
    "DLIGHT_FALLBACK_REASON", "FallbackOp", "GroupInfo", "KernelLaunches", "Report", "cuda_source",
    "device_kernels", "extern_calls", "find_fallbacks", "global_kernel_names", "group_instances", "inspect",
    "kernel_launches", "kernel_source", "library_kernels", "primfunc_calls", "report_from_stages",
]
