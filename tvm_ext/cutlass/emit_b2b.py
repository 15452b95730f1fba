"""Emit back-to-back GEMMs and convolutions (CUTLASS example 13) and their candidate configurations.

cutlass_library has no emitter for the example's ``B2bGemm`` / ``B2bImplicitGemmConvolution``, so
the instances are written here.
RF residency keeps GEMM0's accumulators in registers (warp N = threadblock N = N0, 4 warps
along M); smem residency stages them in shared memory (2x2 warps for GEMM0; 1x4 for GEMM1, or
2x2 when N1 is 64: GEMM1's warps stay at least 32 wide).
Accumulation is fp32; GEMM0's epilogue computes in fp16 (its bias vector's type).
"""
from __future__ import annotations

from .config import API_2X, KernelConfig
from .emit_gemm import ARGS_HEADER, CHECK_MACRO, COMMON_INCLUDES, launch
from .b2b import B2bGemmWorkload
from .b2b_conv import B2bConv2dWorkload
from .epilogue import CUTLASS_ACTIVATION

INCLUDES_B2B = COMMON_INCLUDES + r"""
#include "cutlass/epilogue/thread/linear_combination_relu.h"
#include "cutlass/epilogue/thread/linear_combination_generic.h"
#include "device/b2b_gemm.h"
"""
INCLUDES_B2B_CONV = COMMON_INCLUDES + r"""
#include "cutlass/epilogue/thread/linear_combination_relu.h"
#include "cutlass/epilogue/thread/linear_combination_generic.h"
#include "kernel/default_b2b_conv2d_fprop.h"
#include "kernel/default_b2b_conv2d_fprop_sm80.h"
#include "kernel/default_b2b_conv2d_fprop_smem_accumulator_sm80.h"
#include "device/b2b_implicit_gemm_convolution.h"
"""


def b2b_candidates(wl: B2bGemmWorkload | B2bConv2dWorkload) -> list[KernelConfig]:
    """RF- and smem-resident variants (both threadblocks own whole rows of N0 / N1).

    For convolutions N0 / N1 are the output channels K0 / K1 of the two convolutions.
    """
    out = []
    if wl.n0 <= 128 and wl.n1 <= 128:
        for stages in (3, 4):
            out.append(KernelConfig(API_2X, (64, wl.n0, 32), (4, 1, 1), (16, 8, 16), stages, swizzle=1,
                                    alignment=wl.max_alignment, threadblock1=(64, wl.n1, 32),
                                    warp_count1=(4, 1, 1), residency="rf"))
    if wl.n0 % 16 == 0 and wl.n1 % 64 == 0:
        # GEMM1's warps must stay >= 32 wide for the epilogue's thread map (64 x 16 warps do not compile)
        warps1 = (1, 4, 1) if wl.n1 % 128 == 0 else (2, 2, 1)
        for stages in (3, 4):
            out.append(KernelConfig(API_2X, (64, wl.n0, 32), (2, 2, 1), (16, 8, 16), stages, swizzle=1,
                                    alignment=wl.max_alignment, threadblock1=(64, wl.n1, 32),
                                    warp_count1=warps1, residency="smem"))
    return out


def _shape(values) -> str:
    return f"cutlass::gemm::GemmShape<{values[0]}, {values[1]}, {values[2]}>"


def emit_b2b_gemm(wl: B2bGemmWorkload, cfg: KernelConfig, entry: str) -> str:
    """CUDA source with the B2bGemm instance and ``extern "C" int <entry>(const TvmExtB2bGemmArgs*, ...)``."""
    warp0 = tuple(t // w for t, w in zip(cfg.threadblock, cfg.warp_count))
    warp1 = tuple(t // w for t, w in zip(cfg.threadblock1, cfg.warp_count1))
    smem = "true" if cfg.residency == "smem" else "false"
    act1 = CUTLASS_ACTIVATION[wl.activation1]
    align = cfg.alignment
    kernel = f"""
using {entry}_ep0 = cutlass::epilogue::thread::LinearCombinationRelu<
    cutlass::half_t, 4, float, cutlass::half_t, cutlass::epilogue::thread::ScaleType::OnlyAlphaScaling>;
using {entry}_ep1 = cutlass::epilogue::thread::LinearCombinationGeneric<
    {act1}, cutlass::half_t, {align[2]}, float, float, cutlass::epilogue::thread::ScaleType::NoBetaScaling>;
using {entry}_op = cutlass::gemm::device::B2bGemm<
    cutlass::half_t, cutlass::layout::RowMajor, cutlass::half_t, cutlass::layout::ColumnMajor,
    cutlass::half_t, cutlass::layout::RowMajor, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    {_shape(cfg.threadblock)}, {_shape(cfg.threadblock1)}, {_shape(warp0)}, {_shape(warp1)},
    {_shape(cfg.instruction)}, {entry}_ep0, {entry}_ep1,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<{cfg.swizzle}>, {cfg.stages}, {smem},
    {align[0]}, {align[1]}>;
"""
    launcher = f"""
extern "C" int {entry}(const TvmExtB2bGemmArgs* args, char* err, int err_len) {{
  using Op = {entry}_op;
  using T = cutlass::half_t;
  int m = int(args->m), n0 = int(args->n0), k0 = int(args->k0), n1 = int(args->n1);
  typename Op::Arguments arguments{{
      cutlass::gemm::GemmUniversalMode::kGemm, {{m, n0, k0}}, {{m, n1, n0}},
      {{static_cast<T*>(const_cast<void*>(args->a0)), k0}}, {{static_cast<T*>(const_cast<void*>(args->b0)), k0}},
      {{nullptr, 0}}, {{nullptr, 0}}, {{static_cast<T*>(const_cast<void*>(args->bias0)), 0}},
      {{static_cast<T*>(const_cast<void*>(args->b1)), n0}}, {{static_cast<T*>(const_cast<void*>(args->bias1)), 0}},
      {{static_cast<T*>(args->d), n1}},
      0, 0, 0, 0, 0, 0, 0,
      {{T(1), T(0)}}, {{1.0f, 1.0f}}, 1}};{launch("Op")}"""
    return "\n".join([INCLUDES_B2B, ARGS_HEADER, CHECK_MACRO, "namespace {", kernel, "}  // namespace", launcher])


def _epilogues(entry: str, act1: str, vector1: int) -> str:
    """GEMM0: bias + ReLU in fp16 (scale/bias fragment epilogue); GEMM1: bias (as C) + act1."""
    return f"""
using {entry}_ep0 = cutlass::epilogue::thread::LinearCombinationRelu<
    cutlass::half_t, 4, float, cutlass::half_t, cutlass::epilogue::thread::ScaleType::OnlyAlphaScaling>;
using {entry}_ep1 = cutlass::epilogue::thread::LinearCombinationGeneric<
    {act1}, cutlass::half_t, {vector1}, float, float, cutlass::epilogue::thread::ScaleType::NoBetaScaling>;
"""


def emit_b2b_conv2d(wl: B2bConv2dWorkload, cfg: KernelConfig, entry: str) -> str:
    """CUDA source with the B2bImplicitGemmConvolution instance and its C entry point.

    ``extern "C" int <entry>(const TvmExtB2bConv2dArgs*, ...)``; problem sizes are runtime
    arguments (the second convolution is 1x1, stride 1, no padding by construction).
    """
    warp0 = tuple(t // w for t, w in zip(cfg.threadblock, cfg.warp_count))
    warp1 = tuple(t // w for t, w in zip(cfg.threadblock1, cfg.warp_count1))
    smem = "true" if cfg.residency == "smem" else "false"
    kernel = _epilogues(entry, CUTLASS_ACTIVATION[wl.activation1], 8) + f"""
using {entry}_kernel = typename cutlass::conv::kernel::DefaultB2bConv2dFprop<
    cutlass::half_t, cutlass::layout::TensorNHWC, cutlass::half_t, cutlass::layout::TensorNHWC,
    cutlass::half_t, cutlass::layout::TensorNHWC, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    {_shape(cfg.threadblock)}, {_shape(cfg.threadblock1)}, {_shape(warp0)}, {_shape(warp1)},
    {_shape(cfg.instruction)}, {entry}_ep0, {entry}_ep1,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<{cfg.swizzle}>, {cfg.stages},
    cutlass::arch::OpMultiplyAdd, cutlass::conv::IteratorAlgorithm::kOptimized, {smem}>::Kernel;
"""
    launcher = f"""
extern "C" int {entry}(const TvmExtB2bConv2dArgs* args, char* err, int err_len) {{
  using Op = cutlass::conv::device::B2bImplicitGemmConvolution<{entry}_kernel>;
  using T = cutlass::half_t;
  using Layout = cutlass::layout::TensorNHWC;
  int n = int(args->n), h = int(args->h), w = int(args->w), c = int(args->c), k0 = int(args->k0);
  int r = int(args->r), s = int(args->s), p = int(args->p), q = int(args->q), k1 = int(args->k1);
  cutlass::conv::Conv2dProblemSize problem0(
      {{n, h, w, c}}, {{k0, r, s, c}}, {{int(args->pad_h), int(args->pad_h), int(args->pad_w), int(args->pad_w)}},
      {{int(args->stride_h), int(args->stride_w)}}, {{1, 1}}, {{n, p, q, k0}},
      cutlass::conv::Mode::kCrossCorrelation, 1);
  cutlass::conv::Conv2dProblemSize problem1(
      {{n, p, q, k0}}, {{k1, 1, 1, k0}}, {{0, 0, 0, 0}}, {{1, 1}}, {{1, 1}}, {{n, p, q, k1}},
      cutlass::conv::Mode::kCrossCorrelation, 1);
  typename Op::Arguments arguments(
      problem0, problem1,
      {{static_cast<T*>(const_cast<void*>(args->x)), Layout::packed({{n, h, w, c}})}},
      {{static_cast<T*>(const_cast<void*>(args->w0)), Layout::packed({{k0, r, s, c}})}},
      {{nullptr, Layout()}}, {{nullptr, 0}}, {{static_cast<T*>(const_cast<void*>(args->bias0)), 0}},
      {{static_cast<T*>(const_cast<void*>(args->w1)), Layout::packed({{k1, 1, 1, k0}})}},
      {{static_cast<T*>(const_cast<void*>(args->bias1)), Layout(Layout::Stride(0))}},
      {{static_cast<T*>(args->y), Layout::packed({{n, p, q, k1}})}},
      {{T(1), T(0)}}, {{1.0f, 1.0f}}, cutlass::conv::SplitKMode::kSerial);{launch("Op")}"""
    return "\n".join([INCLUDES_B2B_CONV, ARGS_HEADER, CHECK_MACRO, "namespace {", kernel, "}  // namespace", launcher])
