"""Reports on what a preset did to a model: kernels and who built them, fused groups, traffic,
fallbacks, the selection.

Example
-------
>>> from tvm_ext.inspect import inspect
>>> report = inspect("bert_layer.onnx", target="tvm_ext/h100", preset="baseline")
>>> print(report.to_table())        # or report.to_json(), or display it in a notebook
"""
from __future__ import annotations

from .compare import Comparison, compare
from .fallback import DLIGHT_FALLBACK_REASON, FallbackOp, find_fallbacks
from ..toolchain.cuda_source import global_kernel_names, kernel_source
from .kernels import (KernelLaunches, cuda_source, device_kernels, extern_calls, kernel_launches, library_kernels,
                      primfunc_calls)
from .pictures import graph_svg, kernel_chart_svg
from .report import GroupInfo, Report, group_instances, inspect, price_launches, report_from_stages
from .tile_graph_view import tile_graph_dot, tile_graph_html

__all__ = [
    "Comparison", "DLIGHT_FALLBACK_REASON", "FallbackOp", "GroupInfo", "compare", "graph_svg", "kernel_chart_svg",
    "price_launches", "KernelLaunches", "Report", "cuda_source",
    "device_kernels", "extern_calls", "find_fallbacks", "global_kernel_names", "group_instances", "inspect",
    "kernel_launches", "kernel_source", "library_kernels", "primfunc_calls", "report_from_stages",
    "tile_graph_dot", "tile_graph_html",
]
