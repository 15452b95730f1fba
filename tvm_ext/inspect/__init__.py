"""Reports on what a preset did to a model: kernels, fused groups, traffic, fallbacks.

Example
-------
>>> from tvm_ext.inspect import inspect
>>> report = inspect("bert_layer.onnx", target="tvm_ext/h100", preset="baseline")
>>> print(report.to_table())        # or report.to_json(), or display it in a notebook
"""
from __future__ import annotations

from .fallback import DLIGHT_FALLBACK_REASON, FALLBACK_ATTR, FallbackOp, dlight_rules_by_func
from .kernels import (KernelLaunches, cuda_source, device_kernels, global_kernel_names, kernel_launches,
                      kernel_source, launch_regions, primfunc_calls)
from .report import GroupInfo, Report, group_instances, inspect, report_from_stages
from .stages import StagedBuild, build_stages, resolve_target

__all__ = [
    "DLIGHT_FALLBACK_REASON", "FALLBACK_ATTR", "FallbackOp", "dlight_rules_by_func",
    "KernelLaunches", "cuda_source", "device_kernels", "global_kernel_names", "kernel_launches",
    "kernel_source", "launch_regions", "primfunc_calls",
    "GroupInfo", "Report", "group_instances", "inspect", "report_from_stages",
    "StagedBuild", "build_stages", "resolve_target",
]
