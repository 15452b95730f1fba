"""Bolt-style library offload: CUTLASS GEMM / convolution kernels through a BYOC codegen.

Pipeline use (the ``cutlass`` preset)::

    passes = tvm_ext.cutlass.offload_passes(target) + baseline_graph_passes(target)
    ex = tvm.compile(mod, target, relax_pipeline=...)
    tvm_ext.cutlass.export_library(ex, "model.so")   # adds -lcudart for the CUTLASS objects

Pieces: :mod:`.patterns` (partition + checks), :mod:`.codegen` (``relax.ext.tvm_ext_cutlass``),
:mod:`.emit_gemm` / :mod:`.emit_conv` (cutlass_library emission), :mod:`.candidates` (search
space + heuristic), :mod:`.database` (JSON lines), :mod:`.profiler` (standalone programs).
"""
from __future__ import annotations

from .candidates import candidates, heuristic_config
from .codegen import codegen
from .config import KernelConfig
from .database import Database, TuningRecord, dtype_key
from .epilogue import ACTIVATIONS, Epilogue
from .errors import CutlassCodegenError, CutlassDatabaseError, CutlassSetupError
from .export import export_library, link_options
from .passes import PartitionForCutlass, convert_conv_to_nhwc, offload_passes
from .patterns import CODEGEN_NAME, cutlass_patterns, partition_for_cutlass
from .workload import Conv2dWorkload, GemmWorkload, workload_from_function

__all__ = [
    "ACTIVATIONS", "CODEGEN_NAME", "Conv2dWorkload", "CutlassCodegenError", "CutlassDatabaseError",
    "CutlassSetupError", "Database", "Epilogue", "GemmWorkload", "KernelConfig", "PartitionForCutlass",
    "TuningRecord", "candidates", "codegen", "convert_conv_to_nhwc", "cutlass_patterns", "dtype_key",
    "export_library", "heuristic_config", "link_options", "offload_passes", "partition_for_cutlass",
    "workload_from_function",
]
