// Contract checks of GEMM kernels: CUTLASS 2.x universal (plain and broadcast epilogue), 3.x, and
// the back-to-back GEMM of CUTLASS example 13. Included by contract.h (see its file comment).
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/gemm/gemm.h"

namespace tvm_ext_contract {

template <class Ref>
using ElementOf = std::remove_const_t<typename Ref::Element>;

template <class, class = void> struct HasStrideA : std::false_type {};
template <class A> struct HasStrideA<A, std::void_t<decltype(std::declval<A&>().stride_a)>> : std::true_type {};

/// The layout a 2.x kernel's Params build from ``ld`` (``stride`` when ``ld`` is 0).
template <class Layout, class Stride>
Layout layout_from(long long ld, Stride const& stride) {
  return ld ? Layout(typename Layout::LongIndex(ld)) : Layout(stride);
}

/// A 2.x ``GemmUniversal`` or ``GemmWithFusedEpilogue`` kernel given ``a`` (its own arguments).
template <class K>
void gemm_2x(typename K::Arguments const& a, Report& r) {
  using Args = typename K::Arguments;
  using LA = typename K::LayoutA;
  using LB = typename K::LayoutB;
  using LC = typename K::LayoutC;
  using EA = typename K::ElementA;
  using EB = typename K::ElementB;
  using EC = typename K::ElementC;
  using Shape = typename K::Mma::Shape;
  constexpr bool kBroadcast = HasVector<Args>::value;

  const long long M = a.problem_size.m(), N = a.problem_size.n(), Kd = a.problem_size.k();
  const bool batched = a.mode == cutlass::gemm::GemmUniversalMode::kBatched;
  const long long L = batched ? a.batch_count : 1;
  r.dims("problem", longs(M, N, Kd));
  r.field("batch_count", a.batch_count);
  r.flag("batched", batched);
  typename K::ThreadblockSwizzle swizzle;
  cutlass::gemm::GemmCoord tiled =
      swizzle.get_tiled_shape(a.problem_size, {Shape::kM, Shape::kN, Shape::kK}, a.batch_count);
  dim3 grid = swizzle.get_grid_shape(tiled);
  r.dims("grid", longs(grid.x, grid.y, grid.z));

  LA la;
  LB lb;
  if constexpr (HasStrideA<Args>::value) {
    la = layout_from<LA>(a.lda, a.stride_a);
    lb = layout_from<LB>(a.ldb, a.stride_b);
  } else {
    la = LA(a.lda);
    lb = LB(a.ldb);
  }
  const LC lc(a.ldc), ld(a.ldd);
  const long long sa = batched ? a.batch_stride_A : 0, sb = batched ? a.batch_stride_B : 0;
  const long long sc = batched ? a.batch_stride_C : 0, sd = batched ? a.batch_stride_D : 0;
  if (M <= 0 || N <= 0 || Kd <= 0) return;

  typename K::EpilogueOutputOp op(a.epilogue);
  const bool has_source = kBroadcast || op.is_source_needed();
  auto at = [](auto const& layout, long long row, long long col) {
    return static_cast<long long>(layout(cutlass::MatrixCoord(int(row), int(col))));
  };
  r.operand("A", a.ptr_A, sizeof(EA), 0, (L - 1) * sa + at(la, M - 1, Kd - 1), false);
  r.operand("B", a.ptr_B, sizeof(EB), 0, (L - 1) * sb + at(lb, Kd - 1, N - 1), false);
  if (has_source) r.operand("C", a.ptr_C, sizeof(EC), 0, (L - 1) * sc + at(lc, M - 1, N - 1), false);
  long long sv = 0, ldr = 0;
  if constexpr (kBroadcast) {
    using EV = typename K::Epilogue::ElementVector;
    sv = batched ? a.batch_stride_Vector : 0;
    ldr = a.ldr;
    r.operand("vector", a.ptr_Vector, sizeof(EV), 0, (L - 1) * sv + (N - 1) + ((M - 1) / Shape::kM) * ldr, false);
  }
  r.operand("D", a.ptr_D, sizeof(EC), 0, (L - 1) * sd + at(ld, M - 1, N - 1), true);

  for (auto const& p : pick<3>(longs(L, M, N), kSamples)) {
    const long long l = p[0], m = p[1], n = p[2];
    double acc = 0;
    for (long long k = 0; k < Kd; ++k) {
      acc += load<EA>(a.ptr_A, l * sa + at(la, m, k), "A", r) * load<EB>(a.ptr_B, l * sb + at(lb, k, n), "B", r);
    }
    const double c = has_source ? load<EC>(a.ptr_C, l * sc + at(lc, m, n), "C", r) : 0.0;
    double value;
    if constexpr (kBroadcast) {
      using EV = typename K::Epilogue::ElementVector;
      const double bias = load<EV>(a.ptr_Vector, l * sv + n + (m / Shape::kM) * ldr, "vector", r);
      value = apply_residual_block(op, acc, c, bias);
    } else {
      value = apply_linear(op, acc, c, has_source);
    }
    r.sample(a.ptr_D, sizeof(EC), l * sd + at(ld, m, n), value);
  }
}

/// Element (i, j, l) of a rank-3 cute stride.
template <class Stride>
long long at3(Stride const& s, long long i, long long j, long long l) {
  return i * static_cast<long long>(cute::get<0>(s)) + j * static_cast<long long>(cute::get<1>(s)) +
         l * static_cast<long long>(cute::get<2>(s));
}

/// A 3.x (sm_90a) ``GemmUniversalAdapter`` call: A (M, K, L), B (N, K, L), C / D (M, N, L).
template <class Op>
void gemm_3x(typename Op::Arguments const& a, Report& r) {
  using K = typename Op::GemmKernel;
  using Epi = typename K::CollectiveEpilogue;
  using Fusion = typename Epi::ThreadEpilogueOp;
  using EA = typename K::ElementA;
  using EB = typename K::ElementB;
  using EC = typename Epi::ElementC;
  using ED = typename Epi::ElementD;
  const long long M = cute::get<0>(a.problem_shape), N = cute::get<1>(a.problem_shape);
  const long long Kd = cute::get<2>(a.problem_shape), L = cute::get<3>(a.problem_shape);
  r.dims("problem", longs(M, N, Kd));
  r.field("batch_count", L);
  if (M <= 0 || N <= 0 || Kd <= 0 || L <= 0) return;
  auto const& ml = a.mainloop;
  auto const& ep = a.epilogue;
  r.operand("A", ml.ptr_A, sizeof(EA), 0, at3(ml.dA, M - 1, Kd - 1, L - 1), false);
  r.operand("B", ml.ptr_B, sizeof(EB), 0, at3(ml.dB, N - 1, Kd - 1, L - 1), false);
  const double alpha = ep.thread.alpha;
  double beta = 0;
  bool has_source = false;
  if constexpr (!std::is_void_v<EC>) {
    beta = ep.thread.beta;
    has_source = ep.ptr_C != nullptr && beta != 0;
    if (has_source) r.operand("C", ep.ptr_C, sizeof(EC), 0, at3(ep.dC, M - 1, N - 1, L - 1), false);
  }
  if constexpr (Fusion::IsPerColBiasSupported) {
    r.operand("bias", ep.thread.bias_ptr, sizeof(typename Fusion::ElementBias), 0, N - 1, false);
  }
  r.operand("D", ep.ptr_D, sizeof(ED), 0, at3(ep.dD, M - 1, N - 1, L - 1), true);

  for (auto const& p : pick<3>(longs(L, M, N), kSamples)) {
    const long long l = p[0], m = p[1], n = p[2];
    double acc = 0;
    for (long long k = 0; k < Kd; ++k) {
      acc += load<EA>(ml.ptr_A, at3(ml.dA, m, k, l), "A", r) * load<EB>(ml.ptr_B, at3(ml.dB, n, k, l), "B", r);
    }
    double z = alpha * acc;
    if constexpr (!std::is_void_v<EC>) {
      if (has_source) z += beta * load<EC>(ep.ptr_C, at3(ep.dC, m, n, l), "C", r);
    }
    if constexpr (Fusion::IsPerColBiasSupported) {
      z += load<typename Fusion::ElementBias>(ep.thread.bias_ptr, n, "bias", r);
    }
    float value = static_cast<float>(z);
    if constexpr (Fusion::IsEltActSupported) {
      typename Fusion::ActivationFn act;
      value = act(value);
    }
    r.sample(ep.ptr_D, sizeof(ED), at3(ep.dD, m, n, l), static_cast<double>(static_cast<float>(ED(value))));
  }
}

/// CUTLASS example 13's ``B2bGemm``: D1 = op1(relu(op0(A0 B0, bias0)) B1, C1).
template <class Op>
void b2b_gemm(typename Op::Arguments const& a, Report& r) {
  using EA = ElementOf<decltype(a.ref_A0)>;
  using EB0 = ElementOf<decltype(a.ref_B0)>;
  using EBias = ElementOf<decltype(a.ref_Bias0)>;
  using EB1 = ElementOf<decltype(a.ref_B1)>;
  using EC = ElementOf<decltype(a.ref_C1)>;
  using Op0 = typename Op::EpilogueOutputOp0;
  using Op1 = typename Op::EpilogueOutputOp1;
  const long long M = a.problem_size_0.m(), N0 = a.problem_size_0.n(), K0 = a.problem_size_0.k();
  const long long N1 = a.problem_size_1.n();
  r.dims("problem", longs(M, N0, K0, N1));
  r.dims("problem_1", longs(a.problem_size_1.m(), a.problem_size_1.n(), a.problem_size_1.k()));
  if (M <= 0 || N0 <= 0 || K0 <= 0 || N1 <= 0) return;
  auto at = [](auto const& ref, long long row, long long col) {
    return static_cast<long long>(ref.layout()(cutlass::MatrixCoord(int(row), int(col))));
  };
  r.operand("A0", a.ref_A0.data(), sizeof(EA), 0, at(a.ref_A0, M - 1, K0 - 1), false);
  r.operand("B0", a.ref_B0.data(), sizeof(EB0), 0, at(a.ref_B0, K0 - 1, N0 - 1), false);
  r.operand("bias0", a.ref_Bias0.data(), sizeof(EBias), 0, at(a.ref_Bias0, M - 1, N0 - 1), false);
  r.operand("B1", a.ref_B1.data(), sizeof(EB1), 0, at(a.ref_B1, N0 - 1, N1 - 1), false);
  Op1 op1(a.epilogue1);
  const bool has_source = op1.is_source_needed();
  if (has_source) r.operand("C1", a.ref_C1.data(), sizeof(EC), 0, at(a.ref_C1, M - 1, N1 - 1), false);
  r.operand("D1", a.ref_D1.data(), sizeof(EC), 0, at(a.ref_D1, M - 1, N1 - 1), true);

  Op0 op0(a.epilogue0);
  std::vector<double> z0(N0);
  for (auto const& p : pick<2>(longs(M, N1), kSamples)) {
    const long long m = p[0], n = p[1];
    for (long long j = 0; j < N0; ++j) {
      double acc = 0;
      for (long long k = 0; k < K0; ++k) {
        acc += load<EA>(a.ref_A0.data(), at(a.ref_A0, m, k), "A0", r) *
               load<EB0>(a.ref_B0.data(), at(a.ref_B0, k, j), "B0", r);
      }
      const double bias0 = load<EBias>(a.ref_Bias0.data(), at(a.ref_Bias0, m, j), "bias0", r);
      z0[j] = apply_scale_bias(op0, acc, bias0);
    }
    double acc1 = 0;
    for (long long j = 0; j < N0; ++j) acc1 += z0[j] * load<EB1>(a.ref_B1.data(), at(a.ref_B1, j, n), "B1", r);
    const double c = has_source ? load<EC>(a.ref_C1.data(), at(a.ref_C1, m, n), "C1", r) : 0.0;
    r.sample(a.ref_D1.data(), sizeof(EC), at(a.ref_D1, m, n), apply_linear(op1, acc1, c, has_source));
  }
}

}  // namespace tvm_ext_contract
