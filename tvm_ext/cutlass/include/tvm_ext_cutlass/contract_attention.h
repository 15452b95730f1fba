// Contract check of the fused attention kernel (CUTLASS example 41's AttentionKernel behind
// tvm_ext_cutlass::FusedAttention). Included by contract.h (see its file comment).
//
// From the kernel's own Params it computes what the kernel addresses: query, key and value rows at
// b * strideB + row * strideM + h * strideH + d, the bias at b * bias_strideB + h * bias_strideH +
// m * bias_strideM + n (rows read in whole kAlignmentQ-element vectors), and the output at (b * num_queries + m) * o_strideM + h * head_dim_value + d
// (advance_to_block in kernel_forward.h). Sampled outputs are emulated in double: scores scaled,
// the bias added (or the keys past the query masked when custom_mask_type is causal from the top
// left), softmax over the keys, probabilities times values.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace tvm_ext_contract {

template <class, class = void> struct IsAttention : std::false_type {};
template <class A> struct IsAttention<A, std::void_t<decltype(std::declval<A&>().query_ptr)>> : std::true_type {};

template <class Op>
void attention(typename Op::Arguments const& p, Report& r) {
  using AK = typename Op::Kernel;
  using T = typename AK::scalar_t;
  const long long B = p.num_batches, H = p.num_heads, M = p.num_queries, N = p.num_keys;
  const long long D = p.head_dim, Dv = p.head_dim_value;
  r.dims("problem", longs(B, H, M, N, D, Dv));
  const dim3 grid = p.getBlocksGrid();
  r.dims("grid", longs(grid.x, grid.y, grid.z));
  r.field("custom_mask_type", p.custom_mask_type);
  if (B <= 0 || H <= 0 || M <= 0 || N <= 0 || D <= 0 || Dv <= 0) return;
  const bool causal = p.custom_mask_type == AK::CausalFromTopLeft;
  const bool has_bias = AK::kSupportsBias && p.attn_bias_ptr != nullptr;
  auto q_at = [&](long long b, long long m, long long h, long long d) {
    return b * p.q_strideB + m * p.q_strideM + h * p.q_strideH + d;
  };
  auto k_at = [&](long long b, long long n, long long h, long long d) {
    return b * p.k_strideB + n * p.k_strideM + h * p.k_strideH + d;
  };
  auto v_at = [&](long long b, long long n, long long h, long long d) {
    return b * p.v_strideB + n * p.v_strideM + h * p.v_strideH + d;
  };
  auto bias_at = [&](long long b, long long h, long long m, long long n) {
    return b * p.bias_strideB + h * p.bias_strideH + m * p.bias_strideM + n;
  };
  auto o_at = [&](long long b, long long m, long long h, long long d) {
    return (b * M + m) * p.o_strideM + h * Dv + d;
  };
  r.operand("Q", p.query_ptr, sizeof(T), 0, q_at(B - 1, M - 1, H - 1, D - 1), false);
  r.operand("K", p.key_ptr, sizeof(T), 0, k_at(B - 1, N - 1, H - 1, D - 1), false);
  r.operand("V", p.value_ptr, sizeof(T), 0, v_at(B - 1, N - 1, H - 1, Dv - 1), false);
  if (has_bias) {
    // the bias loader reads rows in kAlignmentQ-element vectors: a row's last vector ends at the
    // next multiple of kAlignmentQ, past N when N is not one
    const long long row_end = (N + AK::kAlignmentQ - 1) / AK::kAlignmentQ * AK::kAlignmentQ;
    r.operand("bias", p.attn_bias_ptr, sizeof(T), 0, bias_at(B - 1, H - 1, M - 1, row_end - 1), false);
  }
  r.operand("O", p.output_ptr, sizeof(T), 0, o_at(B - 1, M - 1, H - 1, Dv - 1), true);

  std::vector<double> score(static_cast<std::size_t>(N));
  for (auto const& pt : pick<4>(longs(B, M, H, Dv), kSamples)) {
    const long long b = pt[0], m = pt[1], h = pt[2], dv = pt[3];
    double top = -std::numeric_limits<double>::infinity();
    for (long long n = 0; n < N; ++n) {
      if (causal && n > m) {
        score[n] = -std::numeric_limits<double>::infinity();
        continue;
      }
      double s = 0;
      for (long long d = 0; d < D; ++d) {
        s += load<T>(p.query_ptr, q_at(b, m, h, d), "Q", r) * load<T>(p.key_ptr, k_at(b, n, h, d), "K", r);
      }
      s *= static_cast<double>(p.scale);
      if (has_bias) s += load<T>(p.attn_bias_ptr, bias_at(b, h, m, n), "bias", r);
      score[n] = s;
      top = std::max(top, s);
    }
    double total = 0, out = 0;
    for (long long n = 0; n < N; ++n) {
      if (score[n] == -std::numeric_limits<double>::infinity()) continue;
      const double e = std::exp(score[n] - top);
      total += e;
      out += e * load<T>(p.value_ptr, v_at(b, n, h, dv), "V", r);
    }
    r.sample(p.output_ptr, sizeof(T), o_at(b, m, h, dv), out / total);
  }
}

}  // namespace tvm_ext_contract
