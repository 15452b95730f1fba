"""Emit CUDA C++ for one CUTLASS 2.x implicit-GEMM NHWC forward convolution (+ epilogue).

The kernel comes from ``cutlass_library``'s ``Conv2dOperation``/``EmitConv2dInstance`` (Sm80
tensor-op multistage, optimized iterators); it also serves sm_90a builds (an Sm80 kernel runs on
Hopper). The epilogue is ``LinearCombinationGeneric<act>`` through a 4-parameter alias because
the conv emitter spells the functor as ``functor<ElementC, Count, Accumulator, Compute>``. A bias
is read as a ``TensorNHWC`` reference with all strides 0 (one value per output channel). Bias +
residual (ResNet's conv+bias+add+relu) uses ``DefaultConv2dFpropWithBroadcast`` (same template
parameters) with ``LinearCombinationResidualBlock``: residual = C, bias = broadcast vector.
"""
from __future__ import annotations

from cutlass_library import library as cl
from cutlass_library.conv2d_operation import Conv2dOperation, EmitConv2dInstance

from .config import API_2X, KernelConfig
from .emit_gemm import ARGS_HEADER, CHECK_MACRO, COMMON_INCLUDES, DTYPES, launch
from .errors import CutlassCodegenError
from .precision import math_dtype
from .workload import Conv2dWorkload

INCLUDES_CONV = COMMON_INCLUDES + r"""
#include "cutlass/conv/kernel/default_conv2d_fprop.h"
#include "cutlass/conv/device/implicit_gemm_convolution.h"
#include "cutlass/epilogue/thread/linear_combination_generic.h"
"""
INCLUDES_CONV_BROADCAST = r"""
#include "cutlass/conv/kernel/default_conv2d_fprop_with_broadcast.h"
#include "cutlass/epilogue/thread/linear_combination_residual_block.h"
"""


def conv2d_operation(wl: Conv2dWorkload, cfg: KernelConfig) -> Conv2dOperation:
    """The ``cutlass_library`` description of the convolution instance."""
    if cfg.api != API_2X:
        raise CutlassCodegenError("convolutions use CUTLASS 2.x kernels (Sm80 tensor op) on every arch")
    elem, mma = DTYPES[wl.dtype], DTYPES[math_dtype(wl.dtype)]
    math = cl.MathInstruction(list(cfg.instruction), mma, mma, cl.DataType.f32, cl.OpcodeClass.TensorOp,
                              cl.MathOperation.multiply_add)
    tile = cl.TileDescription(list(cfg.threadblock), cfg.stages, list(cfg.warp_count), math, 80, 1024)
    a = cl.TensorDescription(elem, cl.LayoutType.TensorNHWC, cfg.alignment[0])
    b = cl.TensorDescription(elem, cl.LayoutType.TensorNHWC, cfg.alignment[1])
    c = cl.TensorDescription(DTYPES[wl.final_dtype], cl.LayoutType.TensorNHWC, cfg.alignment[2])
    stride = cl.StrideSupport.Unity if wl.stride == (1, 1) else cl.StrideSupport.Strided
    return Conv2dOperation(cl.ConvKind.Fprop, cl.IteratorAlgorithm.Optimized, 80, tile, a, b, c, cl.DataType.f32,
                           stride, swizzling_functor=getattr(cl.SwizzlingFunctor, f"Identity{cfg.swizzle}"))


_BOTH_SOURCES_CHECK = r"""
  if (args->source == nullptr || args->bias == nullptr) {
    snprintf(err, err_len, "the bias + residual epilogue needs both tensors");
    return 1;
  }"""


def _epilogue_functor(wl: Conv2dWorkload) -> str:
    """The epilogue as a function of the conv emitter's ``<ElementOutput, Count, Accumulator, Compute>``."""
    act = wl.epilogue.cutlass_activation
    if wl.epilogue.source == "bias_residual":
        identity = "cutlass::epilogue::thread::Identity"
        inner, outer = (act, identity) if wl.epilogue.residual_after_act else (identity, act)
        return ("cutlass::epilogue::thread::LinearCombinationResidualBlock<ElementOutput, Accumulator, Compute, "
                f"ElementOutput, Count, {inner}, cutlass::plus, {outer}>")
    return f"cutlass::epilogue::thread::LinearCombinationGeneric<{act}, ElementOutput, Count, Accumulator, Compute>"


def emit_conv2d(wl: Conv2dWorkload, cfg: KernelConfig, entry: str) -> str:
    """CUDA source with the instance and ``extern "C" int <entry>(const TvmExtConv2dArgs*, ...)``."""
    op = conv2d_operation(wl, cfg)
    alias = f"TvmExtConvEpilogue_{entry}"
    body = EmitConv2dInstance().emit(op)
    default_tag = cl.EpilogueFunctorTag[cl.EpilogueFunctor.LinearCombination]
    if default_tag + "<" not in body:
        raise CutlassCodegenError("unexpected cutlass_library conv template (epilogue functor not found)")
    body = body.replace(default_tag + "<", alias + "<")
    kernel = op.procedural_name()
    body = body.replace(f"{kernel}_base", f"{kernel}_{entry}")
    broadcast = wl.epilogue.source == "bias_residual"
    includes, check, extra = INCLUDES_CONV, "", ""
    if broadcast:  # same template parameters, broadcast epilogue
        base = "cutlass::conv::kernel::DefaultConv2dFprop<"
        if base not in body:
            raise CutlassCodegenError("unexpected cutlass_library conv template (DefaultConv2dFprop not found)")
        body = body.replace(base, "cutlass::conv::kernel::DefaultConv2dFpropWithBroadcast<")
        includes += INCLUDES_CONV_BROADCAST
        check = _BOTH_SOURCES_CHECK
        extra = ", cutlass::conv::SplitKMode::kSerial, const_cast<void*>(args->bias), nullptr, 0, 0"
    alias_decl = (f"template <typename ElementOutput, int Count, typename Accumulator, typename Compute>\n"
                  f"using {alias} = {_epilogue_functor(wl)};\n")
    launcher = f"""
extern "C" int {entry}(const TvmExtConv2dArgs* args, char* err, int err_len) {{
  using Conv = cutlass::conv::device::ImplicitGemmConvolution<{kernel}_{entry}>;
  using Layout = cutlass::layout::TensorNHWC;
  using Compute = typename Conv::EpilogueOutputOp::ElementCompute;{check}
  cutlass::conv::Conv2dProblemSize problem(
      {{int(args->n), int(args->h), int(args->w), int(args->c)}},
      {{int(args->k), int(args->r), int(args->s), int(args->c)}},
      {{int(args->pad_h), int(args->pad_h), int(args->pad_w), int(args->pad_w)}},
      {{int(args->stride_h), int(args->stride_w)}}, {{int(args->dilation_h), int(args->dilation_w)}},
      {{int(args->n), int(args->p), int(args->q), int(args->k)}},
      cutlass::conv::Mode::kCrossCorrelation, 1);
  const bool has_source = args->source != nullptr;
  Layout out_layout = Layout::packed({{int(args->n), int(args->p), int(args->q), int(args->k)}});
  Layout src_layout = args->source_is_vector ? Layout(Layout::Stride(0)) : out_layout;
  typename Conv::Arguments arguments{{
      problem,
      {{static_cast<typename Conv::ElementA*>(const_cast<void*>(args->x)),
        Layout::packed({{int(args->n), int(args->h), int(args->w), int(args->c)}})}},
      {{static_cast<typename Conv::ElementB*>(const_cast<void*>(args->w_ptr)),
        Layout::packed({{int(args->k), int(args->r), int(args->s), int(args->c)}})}},
      {{static_cast<typename Conv::ElementC*>(const_cast<void*>(has_source ? args->source : args->y)), src_layout}},
      {{static_cast<typename Conv::ElementC*>(args->y), out_layout}},
      {{Compute(1), Compute(has_source ? 1 : 0)}}{extra}}};{launch("Conv")}"""
    return "\n".join([includes, ARGS_HEADER, CHECK_MACRO, "namespace {", alias_decl, body,
                      "}  // namespace", launcher])
