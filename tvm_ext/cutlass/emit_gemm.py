"""Emit CUDA C++ for one CUTLASS GEMM instance (+ fused epilogue) and its C entry point.

The kernel type comes from ``cutlass_library`` (``GemmOperation`` with the 2.x universal or the
3.x Sm90 emitter); only the epilogue declaration and the small launcher are written here. The
launcher is ``extern "C" int <entry>(const TvmExtGemmArgs*, char* err, int err_len)`` so the
TVM-FFI glue (``wrapper.py``) and the profiler programs call every instance the same way.
"""
from __future__ import annotations

from cutlass_library import library as cl
from cutlass_library.gemm_operation import EmitGemmUniversal3xInstance, EmitGemmUniversalInstance, GemmOperation

from .config import API_2X, KernelConfig
from .epilogue import Epilogue
from .errors import CutlassCodegenError
from .precision import math_dtype
from .workload import GemmWorkload

#: Tensor element types, and ``tfloat32``: the MMA operand type of float32 tensors (TF32 tensor cores).
DTYPES = {"float16": cl.DataType.f16, "bfloat16": cl.DataType.bf16, "float32": cl.DataType.f32,
          "tfloat32": cl.DataType.tf32}

ARGS_HEADER = r"""
#include <cstdint>
#include <cuda_runtime.h>
#ifndef TVM_EXT_CUTLASS_ARGS
#define TVM_EXT_CUTLASS_ARGS
struct TvmExtGemmArgs {
  int64_t batch, m, n, k, split_k;
  const void* a; const void* b; const void* source; const void* bias; void* d;
  int64_t lda, ldb, ldc, ldd;
  int64_t batch_stride_a, batch_stride_b, batch_stride_c, batch_stride_d;
  cudaStream_t stream;
};
struct TvmExtConv2dArgs {
  int64_t n, h, w, c, k, r, s, p, q, pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w;
  const void* x; const void* w_ptr; const void* source; const void* bias; void* y;
  int source_is_vector;
  cudaStream_t stream;
};
struct TvmExtB2bGemmArgs {
  int64_t m, n0, k0, n1;
  const void* a0; const void* b0; const void* bias0; const void* b1; const void* bias1; void* d;
  cudaStream_t stream;
};
struct TvmExtAttentionArgs {
  int64_t batch, heads, m, n, d, dv;
  int64_t q_stride_b, q_stride_h, q_stride_m, k_stride_b, k_stride_h, k_stride_m;
  int64_t v_stride_b, v_stride_h, v_stride_m, bias_stride_b, bias_stride_h, bias_stride_m, o_stride_m;
  float scale; int causal;
  const void* q; const void* k; const void* v; const void* bias; void* o;
  cudaStream_t stream;
};
struct TvmExtB2bConv2dArgs {
  int64_t n, h, w, c, k0, r, s, p, q, pad_h, pad_w, stride_h, stride_w, k1;
  const void* x; const void* w0; const void* bias0; const void* w1; const void* bias1; void* y;
  cudaStream_t stream;
};
#endif
"""

COMMON_INCLUDES = r"""
#include <cstdio>
#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"
#include "cutlass/epilogue/thread/activation.h"
"""

INCLUDES_2X = COMMON_INCLUDES + r"""
#include "cutlass/gemm/device/gemm_universal_base.h"
#include "cutlass/gemm/kernel/default_gemm_universal.h"
#include "cutlass/epilogue/thread/linear_combination_generic.h"
"""

#: Extra headers of the 2.x broadcast epilogue (bias vector + residual source).
INCLUDES_BROADCAST = r"""
#include "cutlass/epilogue/thread/linear_combination_residual_block.h"
#include "cutlass/gemm/kernel/default_gemm_with_broadcast.h"
"""

INCLUDES_3X = COMMON_INCLUDES + r"""
#include "cute/tensor.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/util/packed_stride.hpp"
"""

#: Error reporting shared by all launchers.
CHECK_MACRO = r"""
#define TVM_EXT_CUTLASS_CHECK(expr, what)                                                     \
  do {                                                                                        \
    cutlass::Status _st = (expr);                                                             \
    if (_st != cutlass::Status::kSuccess) {                                                   \
      snprintf(err, err_len, "%s: %s", what, cutlass::cutlassGetStatusString(_st));           \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)
"""


class _Declaration:
    """A user-defined epilogue functor for cutlass_library's emitters (``emit_declaration``)."""

    def __init__(self, text: str):
        self.text = text

    def emit_declaration(self) -> str:
        return self.text


def epilogue_declaration(ep: Epilogue, api: str, out_dtype: str, vector: int) -> str:
    """C++ type of the epilogue functor (2.x thread functor or 3.x fusion operation).

    2.x: ``LinearCombinationGeneric<act>`` reads one source C (bias with stride 0, or residual);
    bias + residual uses ``LinearCombinationResidualBlock<..., Identity, plus, act>`` of the
    broadcast epilogue, ``act(acc + bias + residual)`` (bias = broadcast vector, residual = C), or
    ``<..., act, plus, Identity>``: ``act(acc + bias) + residual``.
    3.x: the fusion operations, with C = residual (``beta = 1``) and a per-column bias vector.
    """
    elem_d = cl.DataTypeTag[DTYPES[out_dtype]]
    act = ep.cutlass_activation
    if api == API_2X:
        if ep.source == "bias_residual":
            inner, outer = (act, "cutlass::epilogue::thread::Identity") if ep.residual_after_act \
                else ("cutlass::epilogue::thread::Identity", act)
            return (f"cutlass::epilogue::thread::LinearCombinationResidualBlock<{elem_d}, float, float, {elem_d}, "
                    f"{vector}, {inner}, cutlass::plus, {outer}>")
        return (f"cutlass::epilogue::thread::LinearCombinationGeneric<{act}, {elem_d}, {vector}, float, float>")
    elem_c = elem_d if ep.has_residual else "void"
    if ep.has_bias:
        return f"cutlass::epilogue::fusion::LinCombPerColBiasEltAct<{act}, {elem_d}, float, {elem_d}, {elem_c}, float>"
    if ep.activation is None:
        return f"cutlass::epilogue::fusion::LinearCombination<{elem_d}, float, {elem_c}, float>"
    return f"cutlass::epilogue::fusion::LinCombEltAct<{act}, {elem_d}, float, {elem_c}, float>"


def gemm_operation(wl: GemmWorkload, cfg: KernelConfig, arch: int) -> GemmOperation:
    """The ``cutlass_library`` description of the instance (2.x for ``arch >= 80``, 3.x for 90)."""
    elem, mma = DTYPES[wl.dtype], DTYPES[math_dtype(wl.dtype)]
    math = cl.MathInstruction(list(cfg.instruction), mma, mma, cl.DataType.f32, cl.OpcodeClass.TensorOp,
                              cl.MathOperation.multiply_add)
    layout_b = cl.LayoutType.RowMajor if wl.layout_b == "row" else cl.LayoutType.ColumnMajor
    a = cl.TensorDescription(elem, cl.LayoutType.RowMajor, cfg.alignment[0])
    b = cl.TensorDescription(elem, layout_b, cfg.alignment[1])
    out = DTYPES[wl.out_dtype if not wl.epilogue.cast else wl.final_dtype]
    d = cl.TensorDescription(out, cl.LayoutType.RowMajor, cfg.alignment[2])
    if cfg.api == API_2X:
        # cutlass_library's 2.x universal emitter instantiates the transposed problem
        # (D^T = B^T A^T, column-major C). Describe it transposed so the emitted kernel is
        # A row-major x B (row or column) -> row-major D, which is what Relax tensors are.
        flip = {cl.LayoutType.RowMajor: cl.LayoutType.ColumnMajor, cl.LayoutType.ColumnMajor: cl.LayoutType.RowMajor}
        a_t = cl.TensorDescription(elem, flip[layout_b], cfg.alignment[1])
        b_t = cl.TensorDescription(elem, flip[cl.LayoutType.RowMajor], cfg.alignment[0])
        d_t = cl.TensorDescription(out, cl.LayoutType.ColumnMajor, cfg.alignment[2])
        tile = cl.TileDescription(list(cfg.threadblock), cfg.stages, list(cfg.warp_count), math, 80, 1024)
        return GemmOperation(cl.GemmKind.Universal, 80, tile, a_t, b_t, d_t, cl.DataType.f32,
                             swizzling_functor=getattr(cl.SwizzlingFunctor, f"Identity{cfg.swizzle}"))
    tile = cl.TileDescription(list(cfg.threadblock), cfg.stages, list(cfg.warp_count), math, 90, 90,
                              cluster_shape=list(cfg.cluster))
    c_elem = out if wl.epilogue.has_residual else cl.DataType.void
    c = cl.TensorDescription(c_elem, cl.LayoutType.RowMajor, cfg.alignment[2])
    kernel, epi = {
        "cooperative": (cl.KernelScheduleType.TmaWarpSpecializedCooperative,
                        cl.EpilogueScheduleType.TmaWarpSpecializedCooperative),
        "pingpong": (cl.KernelScheduleType.TmaWarpSpecializedPingpong, cl.EpilogueScheduleType.TmaWarpSpecialized),
    }[cfg.schedule]
    scheduler = cl.TileSchedulerType.StreamK if cfg.tile_scheduler == "stream_k" else cl.TileSchedulerType.Default
    return GemmOperation(cl.GemmKind.Universal3x, arch, tile, a, b, c, cl.DataType.f32, D=d,
                         kernel_schedule=kernel, epilogue_schedule=epi, tile_scheduler=scheduler)


def emit_gemm(wl: GemmWorkload, cfg: KernelConfig, arch: int, entry: str) -> str:
    """CUDA source defining the instance and ``extern "C" int <entry>(const TvmExtGemmArgs*, ...)``."""
    op = gemm_operation(wl, cfg, arch)
    out_dtype = wl.final_dtype
    if cfg.api == API_2X:
        emitter = EmitGemmUniversalInstance(operation_suffix="_" + entry)
        vector = min(cfg.alignment[2] * cl.DataTypeSize[DTYPES[out_dtype]], 128) // cl.DataTypeSize[DTYPES[out_dtype]]
        # cutlass_library reads a user-defined functor from the emitter object itself.
        emitter.epilogue_functor = _Declaration(epilogue_declaration(wl.epilogue, API_2X, out_dtype, vector))
        op.epilogue_functor = emitter.epilogue_functor
        body = emitter.emit(op)
        kernel = op.procedural_name() + "_" + entry
        includes = INCLUDES_2X
        if wl.epilogue.source == "bias_residual":
            # same template parameters, broadcast epilogue (DefaultGemmWithBroadcast)
            base = "cutlass::gemm::kernel::DefaultGemmUniversal<"
            if base not in body:
                raise CutlassCodegenError("unexpected cutlass_library GEMM template (DefaultGemmUniversal not found)")
            body = body.replace(base, "cutlass::gemm::kernel::DefaultGemmWithBroadcast<")
            launcher, includes = _launcher_2x_broadcast(kernel, entry), INCLUDES_2X + INCLUDES_BROADCAST
        else:
            launcher = _launcher_2x(kernel, entry)
    else:
        emitter = EmitGemmUniversal3xInstance(operation_suffix="_" + entry)
        decl = _Declaration(epilogue_declaration(wl.epilogue, cfg.api, out_dtype, 0))
        emitter.epilogue_functor = decl
        op.epilogue_functor = decl
        body = emitter.emit(op).replace(f"struct {op.procedural_name()} :", f"struct {op.procedural_name()}_{entry} :")
        launcher = _launcher_3x(op.procedural_name() + "_" + entry, entry, wl)
        includes = INCLUDES_3X
    return "\n".join([includes, ARGS_HEADER, CHECK_MACRO, "namespace {", body, "}  // namespace", launcher])


#: Runtime GEMM mode: batched when there is a batch, else serial split-K over ``split_k`` slices.
_MODE_2X = r"""
  const bool batched = args->batch > 1;
  const auto mode = batched ? cutlass::gemm::GemmUniversalMode::kBatched : cutlass::gemm::GemmUniversalMode::kGemm;
  const int batch_count = int(batched ? args->batch : (args->split_k > 1 ? args->split_k : 1));
"""

def launch(op_type: str) -> str:
    """The end of every launcher: run ``op_type`` on ``arguments`` (built before it).

    Production: ``can_implement``, workspace, ``initialize`` and ``run`` on the caller's stream.
    A contract build (``-DTVM_EXT_CUTLASS_CONTRACT``, :mod:`tvm_ext.cutlass.contract`) hands the
    same ``arguments`` to the host-side check instead, so the check sees exactly what this
    launcher would give the operation, and no kernel is instantiated or launched.
    """
    return f"""
  using Launched = {op_type};
#ifdef TVM_EXT_CUTLASS_CONTRACT
  return tvm_ext_contract::inspect<Launched>(arguments, err, err_len);
#else
  TVM_EXT_CUTLASS_CHECK(Launched::can_implement(arguments), "can_implement");
  size_t workspace_bytes = Launched::get_workspace_size(arguments);
  void* workspace = nullptr;
  if (workspace_bytes && cudaMallocAsync(&workspace, workspace_bytes, args->stream) != cudaSuccess) {{
    snprintf(err, err_len, "cannot allocate %zu bytes of CUTLASS workspace", workspace_bytes);
    return 1;
  }}
  Launched op;
  cutlass::Status st = op.initialize(arguments, workspace, args->stream);
  if (st == cutlass::Status::kSuccess) st = op.run(args->stream);
  if (workspace) cudaFreeAsync(workspace, args->stream);
  TVM_EXT_CUTLASS_CHECK(st, "run");
  return 0;
#endif
}}
"""


def _launcher_2x(kernel: str, entry: str) -> str:
    """``act(acc + source)``, the problem as Relax has it: A ``[M, K]`` row-major, B as stored, D
    ``[M, N]`` row-major, C the residual (``ldc = N``) or the bias (``ldc = 0``).

    The emitted kernel *is* that row-major problem, so it runs through ``GemmUniversalBase``.
    ``GemmUniversalAdapter`` would take a row-major-C kernel for the transposed form of a
    column-major problem and swap M/N, A/B and lda/ldb (NVIDIA/cutlass#801).
    """
    return f"""
extern "C" int {entry}(const TvmExtGemmArgs* args, char* err, int err_len) {{
  using Base = cutlass::gemm::device::GemmUniversalBase<{kernel}>;
  using Compute = typename Base::GemmKernel::EpilogueOutputOp::ElementCompute;
  const bool has_source = args->source != nullptr;{_MODE_2X}
  typename Base::Arguments arguments(
      mode, {{int(args->m), int(args->n), int(args->k)}}, batch_count,
      {{Compute(1), Compute(has_source ? 1 : 0)}},
      args->a, args->b, has_source ? args->source : args->d, args->d,
      args->batch_stride_a, args->batch_stride_b, args->batch_stride_c, args->batch_stride_d,
      args->lda, args->ldb, args->ldc, args->ldd);{launch("Base")}"""


def _launcher_2x_broadcast(kernel: str, entry: str) -> str:
    """``act(acc + bias + residual)``: residual = C (``source``), bias = broadcast vector."""
    return f"""
extern "C" int {entry}(const TvmExtGemmArgs* args, char* err, int err_len) {{
  using Base = cutlass::gemm::device::GemmUniversalBase<{kernel}>;
  using Compute = typename Base::GemmKernel::Epilogue::OutputOp::ElementCompute;
  if (args->source == nullptr || args->bias == nullptr) {{
    snprintf(err, err_len, "the bias + residual epilogue needs both tensors");
    return 1;
  }}{_MODE_2X}
  typename Base::Arguments arguments(
      mode, {{int(args->m), int(args->n), int(args->k)}}, batch_count,
      {{Compute(1), Compute(1)}},
      args->a, args->b, args->source, args->d, const_cast<void*>(args->bias), nullptr,
      args->batch_stride_a, args->batch_stride_b, args->batch_stride_c, args->batch_stride_d, 0, 0,
      args->lda, args->ldb, args->ldc, args->ldd, 0, 0);{launch("Base")}"""


def _launcher_3x(kernel: str, entry: str, wl: GemmWorkload) -> str:
    ep = wl.epilogue
    fusion = ["arguments.epilogue.thread.alpha = 1.0f;"]
    if ep.has_residual:
        fusion.append("arguments.epilogue.thread.beta = 1.0f;")
    if ep.has_bias:  # a bias alone travels as `source`; with a residual it is `bias`
        vec = "args->bias" if ep.has_residual else "args->source"
        fusion.append(f"arguments.epilogue.thread.bias_ptr = static_cast<const ElementD*>({vec});")
    c_ptr = "static_cast<const ElementC*>(args->source)" if ep.has_residual else "nullptr"
    return f"""
extern "C" int {entry}(const TvmExtGemmArgs* args, char* err, int err_len) {{
  using Op = cutlass::gemm::device::GemmUniversalAdapter<{kernel}>;
  using Kernel = typename Op::GemmKernel;
  using ElementA = typename Op::ElementA;
  using ElementB = typename Op::ElementB;
  using ElementC = typename Kernel::CollectiveEpilogue::ElementC;
  using ElementD = typename Kernel::CollectiveEpilogue::ElementD;
  int M = int(args->m), N = int(args->n), K = int(args->k), L = int(args->batch);
  auto stride_a = cutlass::make_cute_packed_stride(typename Kernel::StrideA{{}}, cute::make_shape(M, K, L));
  auto stride_b = cutlass::make_cute_packed_stride(typename Kernel::StrideB{{}}, cute::make_shape(N, K, L));
  auto stride_c = cutlass::make_cute_packed_stride(typename Kernel::StrideC{{}}, cute::make_shape(M, N, L));
  auto stride_d = cutlass::make_cute_packed_stride(typename Kernel::StrideD{{}}, cute::make_shape(M, N, L));
  // the batch mode is the glue's (a B shared by every batch has stride 0), not the packed one
  cute::get<2>(stride_a) = args->batch_stride_a;
  cute::get<2>(stride_b) = args->batch_stride_b;
  cute::get<2>(stride_c) = args->batch_stride_c;
  cute::get<2>(stride_d) = args->batch_stride_d;
  typename Op::Arguments arguments{{
      cutlass::gemm::GemmUniversalMode::kGemm, {{M, N, K, L}},
      {{static_cast<const ElementA*>(args->a), stride_a, static_cast<const ElementB*>(args->b), stride_b}},
      {{{{}}, {c_ptr}, stride_c, static_cast<ElementD*>(args->d), stride_d}}}};
  {" ".join(fusion)}{launch("Op")}"""
