"""Bolt-style library offload: CUTLASS GEMM / convolution kernels through a BYOC codegen.

Pipeline use (the ``cutlass`` preset)::

    passes = tvm_ext.cutlass.offload_passes(target) + baseline_graph_passes(target)
    ex = tvm.compile(mod, target, relax_pipeline=...)
    tvm_ext.toolchain.export_library(ex, "model.so")   # adds -lcudart for the CUTLASS objects

Pieces: :mod:`.patterns` (partition + checks), :mod:`.padding` (channel padding to 8),
:mod:`.codegen` (``relax.ext.tvm_ext_cutlass``; one shape-generic instance per template
configuration), :mod:`.emit_gemm` / :mod:`.emit_conv` (cutlass_library emission), :mod:`.b2b` /
:mod:`.b2b_conv` / :mod:`.emit_b2b` (back-to-back GEMMs and convolutions), :mod:`.candidates`
(search space + heuristic), :mod:`.database` (JSON lines), :mod:`.profiler` (standalone
programs), :mod:`.suite` (compile every distinct instance of a model suite: the CI check).
"""
from __future__ import annotations

from .b2b_conv import B2bConv2dWorkload
from .candidates import candidates, heuristic_config
from .codegen import codegen, instance_key
from .config import KernelConfig
from .database import Database, TuningRecord, dtype_key
from .epilogue import ACTIVATIONS, Epilogue
from .errors import CutlassCodegenError, CutlassDatabaseError, CutlassSetupError
from .padding import PadConvChannels, pad_conv_channels
from .passes import PartitionForCutlass, convert_conv_to_nhwc, offload_passes
from .patterns import CODEGEN_NAME, cutlass_patterns, partition_for_cutlass
from .workload import Conv2dWorkload, GemmWorkload, workload_from_function

__all__ = [
    "ACTIVATIONS", "B2bConv2dWorkload", "CODEGEN_NAME", "Conv2dWorkload", "CutlassCodegenError",
    "CutlassDatabaseError", "CutlassSetupError", "Database", "Epilogue", "GemmWorkload", "KernelConfig", "PartitionForCutlass",
    "TuningRecord", "candidates", "codegen", "convert_conv_to_nhwc", "cutlass_patterns", "dtype_key",
    "heuristic_config", "instance_key", "offload_passes",
    "PadConvChannels", "pad_conv_channels", "partition_for_cutlass", "workload_from_function",
]
