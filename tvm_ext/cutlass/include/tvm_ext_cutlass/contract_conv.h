// Contract checks of implicit-GEMM convolutions: CUTLASS 2.x fprop (plain and broadcast epilogue)
// and the back-to-back convolution of CUTLASS example 13. Included by contract.h.
#pragma once

#include "cutlass/conv/conv2d_problem_size.h"
#include "cutlass/tensor_coord.h"

namespace tvm_ext_contract {

/// Element (n, h, w, c) of a tensor reference with a 4-D layout.
template <class Ref>
long long at4(Ref const& ref, long long n, long long h, long long w, long long c) {
  return static_cast<long long>(ref.layout()(cutlass::Tensor4DCoord(int(n), int(h), int(w), int(c))));
}

/// Accumulator of output (n, p, q, k) of a forward convolution of x (ref_x) by w (ref_w).
template <class EX, class EW, class RefX, class RefW>
double conv_acc(cutlass::conv::Conv2dProblemSize const& s, RefX const& x, RefW const& w, long long n, long long p,
                long long q, long long k, const char* x_role, const char* w_role, Report& r) {
  const bool flip = s.mode == cutlass::conv::Mode::kConvolution;
  double acc = 0;
  for (long long fr = 0; fr < s.R; ++fr) {
    const long long h = p * s.stride_h - s.pad_h + (flip ? s.R - 1 - fr : fr) * s.dilation_h;
    if (h < 0 || h >= s.H) continue;
    for (long long fs = 0; fs < s.S; ++fs) {
      const long long col = q * s.stride_w - s.pad_w + (flip ? s.S - 1 - fs : fs) * s.dilation_w;
      if (col < 0 || col >= s.W) continue;
      for (long long c = 0; c < s.C; ++c) {
        acc += load<EX>(x.data(), at4(x, n, h, col, c), x_role, r) * load<EW>(w.data(), at4(w, k, fr, fs, c), w_role, r);
      }
    }
  }
  return acc;
}

/// A 2.x ``ImplicitGemmConvolution`` fprop (with or without the broadcast epilogue).
template <class Op>
void conv_2x(typename Op::Arguments const& a, Report& r) {
  using Args = typename Op::Arguments;
  using K = typename Op::UnderlyingKernel;
  using EA = ElementOf<decltype(a.ref_A)>;
  using EB = ElementOf<decltype(a.ref_B)>;
  using EC = ElementOf<decltype(a.ref_C)>;
  using ED = ElementOf<decltype(a.ref_D)>;
  using Shape = typename K::Mma::Shape;
  constexpr bool kBroadcast = HasVector<Args>::value;
  auto const& s = a.problem_size;
  r.dims("problem", longs(s.N, s.H, s.W, s.C, s.K, s.R, s.S, s.P, s.Q, s.pad_h, s.pad_w, s.stride_h, s.stride_w,
                          s.dilation_h, s.dilation_w));
  r.field("split_k_slices", s.split_k_slices);
  if (s.N <= 0 || s.P <= 0 || s.Q <= 0 || s.K <= 0 || s.C <= 0) return;
  typename K::EpilogueOutputOp op(a.output_op);
  const bool has_source = kBroadcast || op.is_source_needed();
  r.operand("A", a.ref_A.data(), sizeof(EA), 0, at4(a.ref_A, s.N - 1, s.H - 1, s.W - 1, s.C - 1), false);
  r.operand("B", a.ref_B.data(), sizeof(EB), 0, at4(a.ref_B, s.K - 1, s.R - 1, s.S - 1, s.C - 1), false);
  if (has_source) r.operand("C", a.ref_C.data(), sizeof(EC), 0, at4(a.ref_C, s.N - 1, s.P - 1, s.Q - 1, s.K - 1), false);
  long long ldr = 0;
  if constexpr (kBroadcast) {
    using EV = typename K::Epilogue::ElementVector;
    ldr = a.ldr;
    const long long rows = static_cast<long long>(s.N) * s.P * s.Q;
    r.operand("vector", a.ptr_Vector, sizeof(EV), 0, (s.K - 1) + ((rows - 1) / Shape::kM) * ldr, false);
  }
  r.operand("D", a.ref_D.data(), sizeof(ED), 0, at4(a.ref_D, s.N - 1, s.P - 1, s.Q - 1, s.K - 1), true);

  for (auto const& pt : pick<4>(longs(s.N, s.P, s.Q, s.K), kSamples)) {
    const long long n = pt[0], p = pt[1], q = pt[2], k = pt[3];
    const double acc = conv_acc<EA, EB>(s, a.ref_A, a.ref_B, n, p, q, k, "A", "B", r);
    const double c = has_source ? load<EC>(a.ref_C.data(), at4(a.ref_C, n, p, q, k), "C", r) : 0.0;
    double value;
    if constexpr (kBroadcast) {
      using EV = typename K::Epilogue::ElementVector;
      const long long row = (n * s.P + p) * s.Q + q;
      value = apply_residual_block(op, acc, c, load<EV>(a.ptr_Vector, k + (row / Shape::kM) * ldr, "vector", r));
    } else {
      value = apply_linear(op, acc, c, has_source);
    }
    r.sample(a.ref_D.data(), sizeof(ED), at4(a.ref_D, n, p, q, k), value);
  }
}

/// CUTLASS example 13's ``B2bImplicitGemmConvolution``: a convolution, bias + ReLU, then a 1x1
/// convolution whose epilogue reads C1 (the second bias, stride 0).
template <class Op>
void b2b_conv(typename Op::Arguments const& a, Report& r) {
  using K = typename Op::B2bImplicitGemmKernel;
  using Op0 = typename K::EpilogueOutputOp0;
  using Op1 = typename K::EpilogueOutputOp1;
  using EA = ElementOf<decltype(a.ref_A0)>;
  using EB0 = ElementOf<decltype(a.ref_B0)>;
  using EBias = ElementOf<decltype(a.ref_Bias0)>;
  using EB1 = ElementOf<decltype(a.ref_B1)>;
  using EC = ElementOf<decltype(a.ref_C1)>;
  auto const& s0 = a.problem_size_0;
  auto const& s1 = a.problem_size_1;
  r.dims("problem", longs(s0.N, s0.H, s0.W, s0.C, s0.K, s0.R, s0.S, s0.P, s0.Q, s0.pad_h, s0.pad_w, s0.stride_h,
                          s0.stride_w, s1.K));
  r.dims("problem_1", longs(s1.N, s1.H, s1.W, s1.C, s1.K, s1.R, s1.S, s1.P, s1.Q));
  if (s0.N <= 0 || s0.P <= 0 || s0.Q <= 0 || s0.K <= 0 || s1.K <= 0) return;
  auto bias_at = [](auto const& ref, long long j) {
    return static_cast<long long>(ref.layout()(cutlass::MatrixCoord(0, int(j))));
  };
  r.operand("A0", a.ref_A0.data(), sizeof(EA), 0, at4(a.ref_A0, s0.N - 1, s0.H - 1, s0.W - 1, s0.C - 1), false);
  r.operand("B0", a.ref_B0.data(), sizeof(EB0), 0, at4(a.ref_B0, s0.K - 1, s0.R - 1, s0.S - 1, s0.C - 1), false);
  r.operand("bias0", a.ref_Bias0.data(), sizeof(EBias), 0, bias_at(a.ref_Bias0, s0.K - 1), false);
  r.operand("B1", a.ref_B1.data(), sizeof(EB1), 0, at4(a.ref_B1, s1.K - 1, s1.R - 1, s1.S - 1, s1.C - 1), false);
  Op1 op1(a.output_op_1);
  const bool has_source = op1.is_source_needed();
  if (has_source) {
    r.operand("C1", a.ref_C1.data(), sizeof(EC), 0, at4(a.ref_C1, s1.N - 1, s1.P - 1, s1.Q - 1, s1.K - 1), false);
  }
  r.operand("D1", a.ref_D1.data(), sizeof(EC), 0, at4(a.ref_D1, s1.N - 1, s1.P - 1, s1.Q - 1, s1.K - 1), true);

  Op0 op0(a.output_op_0);
  std::vector<double> z0(s0.K);
  for (auto const& pt : pick<4>(longs(s1.N, s1.P, s1.Q, s1.K), kSamples)) {
    const long long n = pt[0], p = pt[1], q = pt[2], k = pt[3];
    for (long long j = 0; j < s0.K; ++j) {
      const double acc0 = conv_acc<EA, EB0>(s0, a.ref_A0, a.ref_B0, n, p, q, j, "A0", "B0", r);
      const double bias0 = load<EBias>(a.ref_Bias0.data(), bias_at(a.ref_Bias0, j), "bias0", r);
      z0[j] = apply_scale_bias(op0, acc0, bias0);
    }
    double acc1 = 0;
    for (long long j = 0; j < s1.C && j < s0.K; ++j) acc1 += z0[j] * load<EB1>(a.ref_B1.data(), at4(a.ref_B1, k, 0, 0, j), "B1", r);
    const double c = has_source ? load<EC>(a.ref_C1.data(), at4(a.ref_C1, n, p, q, k), "C1", r) : 0.0;
    r.sample(a.ref_D1.data(), sizeof(EC), at4(a.ref_D1, n, p, q, k), apply_linear(op1, acc1, c, has_source));
  }
}

}  // namespace tvm_ext_contract
