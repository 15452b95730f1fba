"""Bolt-style library offload: CUTLASS GEMM / convolution kernels through a BYOC codegen.

The ``cutlass`` preset proposes offloads through :class:`CutlassGenerator` (registered as
``"cutlass"``) and builds the chosen ones with the codegen ``relax.ext.tvm_ext_cutlass``;
:func:`offload_passes` is the same technique as a pass list usable alone::

    mod = tvm.transform.Sequential(tvm_ext.cutlass.offload_passes(target))(mod)

Pieces: :mod:`.generator` (candidates and plans), :mod:`.patterns` (partition + checks),
:mod:`.padding` (channel padding to 8), :mod:`.codegen` (one shape-generic instance per template
configuration), :mod:`.emit_gemm` / :mod:`.emit_conv` (cutlass_library emission), :mod:`.b2b` /
:mod:`.b2b_conv` / :mod:`.emit_b2b` (back-to-back GEMMs and convolutions), :mod:`.candidates`
(search space + heuristic), :mod:`.records` (measurements in the shared database),
:mod:`.profiler` (standalone programs), :mod:`.suite` (compile every distinct instance of a model
suite: the CI check), :mod:`.precision` (what the tensor cores compute in; float32 models are
offloaded as TF32 only inside :func:`allow_tf32`, off by default as in PyTorch)::

    with tvm_ext.cutlass.allow_tf32():
        ex = tvm_ext.compile("model.onnx", preset="cutlass")
"""
from __future__ import annotations

from .b2b import B2bGemmWorkload
from .b2b_conv import B2bConv2dWorkload
from .candidates import candidates
from .codegen import choose_config, codegen
from .instance import instance_key
from .config import KernelConfig
from .epilogue import ACTIVATIONS, Epilogue
from .errors import CutlassCodegenError, CutlassSetupError
from .generator import CutlassGenerator, CutlassPlan
from .gemm_padding import PadGemmExtents, pad_gemm_extents
from .padding import PadConvChannels, pad_conv_channels
from .passes import PartitionForCutlass, convert_conv_to_nhwc, offload_passes
from .patterns import CODEGEN_NAME, cutlass_patterns, partition_for_cutlass
from .precision import allow_tf32, tf32_allowed
from .pricing import cheapest_config, describe
from .records import best_config, cutlass_record, dtype_key
from .workload import Conv2dWorkload, GemmWorkload, Workload, workload_from_function

__all__ = [
    "ACTIVATIONS", "allow_tf32", "tf32_allowed", "B2bConv2dWorkload", "cheapest_config", "describe", "B2bGemmWorkload", "CODEGEN_NAME", "Conv2dWorkload", "CutlassCodegenError",
    "CutlassGenerator", "CutlassPlan", "CutlassSetupError", "Epilogue", "GemmWorkload", "KernelConfig",
    "PadConvChannels", "PadGemmExtents", "PartitionForCutlass", "Workload", "best_config", "candidates", "choose_config", "codegen",
    "convert_conv_to_nhwc", "cutlass_patterns", "cutlass_record", "dtype_key", "instance_key",
    "offload_passes", "pad_conv_channels", "pad_gemm_extents", "partition_for_cutlass", "workload_from_function",
]
