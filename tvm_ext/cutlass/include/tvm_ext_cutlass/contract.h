// Host-side contract check of a CUTLASS library call (tvm_ext.cutlass.contract).
//
// A launcher built with -DTVM_EXT_CUTLASS_CONTRACT ends in tvm_ext_contract::inspect<Op>(arguments)
// instead of running the operation (see tvm_ext/cutlass/emit_gemm.py: launch()). inspect
//   1. asks the operation's own can_implement, exactly as the launcher would;
//   2. maps the arguments as the operation hands them to its kernel (a 2.x GemmUniversalAdapter
//      transposes a row-major-C kernel's problem), and from the kernel's own layouts, strides and
//      problem computes the lowest and highest element each operand is read or written at;
//   3. emulates a sample of outputs through those layouts and strides on the host data, with the
//      kernel's own epilogue functor where it runs on the host (2.x, conv), and records the element
//      of the destination written and its value.
// Nothing is launched and no kernel is instantiated, so the program compiles without device code.
// The report is one JSON object in report(); the Python side compares it with the tensors' sizes
// and with the Relax reference of each written element.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cutlass/cutlass.h"
#include "cutlass/layout/matrix.h"
#include "cutlass/matrix_coord.h"
#include "cutlass/numeric_types.h"
#include "tvm_ext_cutlass/contract_buffers.h"

namespace tvm_ext_contract {

/// Its arguments as a vector of long long (for Report::dims and pick).
template <class... T>
std::vector<long long> longs(T... values) {
  return std::vector<long long>{static_cast<long long>(values)...};
}

/// Collects one call's findings as a JSON object.
class Report {
 public:
  explicit Report(const char* family) { os_ << "{\"family\":\"" << family << "\""; }

  void field(const char* key, long long value) { os_ << ",\"" << key << "\":" << value; }
  void flag(const char* key, bool value) { os_ << ",\"" << key << "\":" << (value ? "true" : "false"); }
  void status(const char* key, cutlass::Status st) {
    os_ << ",\"" << key << "\":\"" << cutlass::cutlassGetStatusString(st) << "\"";
  }
  void dims(const char* key, std::vector<long long> const& values) {
    os_ << ",\"" << key << "\":[";
    for (std::size_t i = 0; i < values.size(); ++i) os_ << (i ? "," : "") << values[i];
    os_ << "]";
  }

  /// An operand the kernel addresses from ``ptr``: elements ``lo``..``hi`` (in ``elem`` bytes).
  void operand(const char* role, const void* ptr, int elem, long long lo, long long hi, bool write) {
    std::uintptr_t addr = reinterpret_cast<std::uintptr_t>(ptr);
    int buf = buffer_of(addr);
    std::ostringstream one;
    one << "{\"role\":\"" << role << "\",\"buffer\":";
    if (buf < 0) {
      one << "null,\"offset\":" << static_cast<long long>(addr);
    } else {
      one << "\"" << buffers()[buf].name << "\",\"offset\":" << static_cast<long long>(addr - buffers()[buf].base);
    }
    one << ",\"elem\":" << elem << ",\"lo\":" << lo << ",\"hi\":" << hi << ",\"write\":" << (write ? "true" : "false")
        << "}";
    operands_.push_back(one.str());
  }

  /// An emulated output: ``value`` written at element ``offset`` (``elem`` bytes each) from ``ptr``.
  void sample(const void* ptr, int elem, long long offset, double value) {
    std::uintptr_t addr = reinterpret_cast<std::uintptr_t>(ptr) + static_cast<std::uintptr_t>(offset * elem);
    int buf = buffer_holding(addr, elem);
    std::ostringstream one;
    one << "[";
    if (buf < 0) {
      one << "null,null";
    } else {
      one << "\"" << buffers()[buf].name << "\"," << static_cast<long long>((addr - buffers()[buf].base) / elem);
    }
    one << "," << number(value) << "]";
    samples_.push_back(one.str());
  }

  /// A read the emulation could not make: the element lies in no tensor.
  void bad_read(const char* role, long long offset) {
    if (bad_reads_.size() < 8) bad_reads_.push_back(std::string("[\"") + role + "\"," + std::to_string(offset) + "]");
  }

  std::string finish() {
    os_ << ",\"operands\":[" << join(operands_) << "],\"samples\":[" << join(samples_) << "],\"bad_reads\":["
        << join(bad_reads_) << "]}";
    return os_.str();
  }

 private:
  static std::string number(double v) {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
    char text[40];
    std::snprintf(text, sizeof(text), "%.9g", v);
    return text;
  }
  static std::string join(std::vector<std::string> const& parts) {
    std::string out;
    for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? "," : "") + parts[i];
    return out;
  }

  std::ostringstream os_;
  std::vector<std::string> operands_, samples_, bad_reads_;
};

/// Element ``offset`` (in ``T``) from ``base`` as a double; NaN and a finding if it lies in no tensor.
template <class T>
double load(const void* base, long long offset, const char* role, Report& report) {
  std::uintptr_t addr = reinterpret_cast<std::uintptr_t>(base) + static_cast<std::uintptr_t>(offset * long(sizeof(T)));
  if (buffer_holding(addr, sizeof(T)) < 0) {
    report.bad_read(role, offset);
    return std::nan("");
  }
  T value;
  std::memcpy(&value, reinterpret_cast<const void*>(addr), sizeof(T));
  return static_cast<double>(static_cast<float>(value));
}

/// Output coordinates to emulate: every corner of ``extent`` and ``count`` pseudo-random points.
template <int Rank>
std::vector<std::vector<long long>> pick(std::vector<long long> const& extent, int count) {
  std::vector<std::vector<long long>> out;
  for (long long e : extent) {
    if (e <= 0) return out;
  }
  for (int corner = 0; corner < (1 << Rank); ++corner) {
    std::vector<long long> point(Rank);
    for (int d = 0; d < Rank; ++d) point[d] = (corner >> d & 1) ? extent[d] - 1 : 0;
    out.push_back(point);
  }
  std::uint64_t state = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < count; ++i) {
    std::vector<long long> point(Rank);
    for (int d = 0; d < Rank; ++d) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      point[d] = static_cast<long long>((state >> 33) % static_cast<std::uint64_t>(extent[d]));
    }
    out.push_back(point);
  }
  return out;
}

constexpr int kSamples = 40;

/// ``op(acc, source)`` (or ``op(acc)`` without a source) of a 2.x linear-combination functor.
template <class OutputOp>
double apply_linear(OutputOp const& op, double acc, double source, bool has_source) {
  typename OutputOp::FragmentAccumulator frag_acc;
  frag_acc.fill(typename OutputOp::ElementAccumulator(0));
  frag_acc[0] = typename OutputOp::ElementAccumulator(acc);
  typename OutputOp::FragmentOutput out;
  if (has_source) {
    typename OutputOp::FragmentOutput frag_src;
    frag_src.fill(typename OutputOp::ElementOutput(0));
    frag_src[0] = typename OutputOp::ElementOutput(static_cast<float>(source));
    out = op(frag_acc, frag_src);
  } else {
    out = op(frag_acc);
  }
  return static_cast<double>(static_cast<float>(out[0]));
}

/// ``op(Z, T, acc, residual, bias)`` of a residual-block functor (the 2.x broadcast epilogue).
template <class OutputOp>
double apply_residual_block(OutputOp const& op, double acc, double residual, double bias) {
  typename OutputOp::FragmentAccumulator frag_acc;
  frag_acc.fill(typename OutputOp::ElementAccumulator(0));
  frag_acc[0] = typename OutputOp::ElementAccumulator(acc);
  typename OutputOp::FragmentC frag_c;
  frag_c.fill(typename OutputOp::ElementC(0));
  frag_c[0] = typename OutputOp::ElementC(static_cast<float>(residual));
  typename OutputOp::FragmentCompute frag_bias;
  frag_bias.fill(typename OutputOp::ElementCompute(0));
  frag_bias[0] = typename OutputOp::ElementCompute(bias);
  typename OutputOp::FragmentOutput z, t;
  op(z, t, frag_acc, frag_c, frag_bias);
  return static_cast<double>(static_cast<float>(z[0]));
}

/// ``op(acc, scale, bias)`` of a scale-bias functor (GEMM0's epilogue of a back-to-back kernel).
template <class OutputOp>
double apply_scale_bias(OutputOp const& op, double acc, double bias) {
  typename OutputOp::FragmentAccumulator frag_acc;
  frag_acc.fill(typename OutputOp::ElementAccumulator(0));
  frag_acc[0] = typename OutputOp::ElementAccumulator(acc);
  typename OutputOp::FragmentScaleBias frag_scale, frag_bias;
  frag_scale.fill(typename OutputOp::ElementCompute(1));
  frag_bias.fill(typename OutputOp::ElementCompute(0));
  frag_bias[0] = typename OutputOp::ElementCompute(static_cast<float>(bias));
  return static_cast<double>(static_cast<float>(op(frag_acc, frag_scale, frag_bias)[0]));
}

// ---- what kind of operation a launcher runs (detected from its arguments) ------------------------

template <class, class = void> struct HasVector : std::false_type {};
template <class A> struct HasVector<A, std::void_t<decltype(std::declval<A&>().ptr_Vector)>> : std::true_type {};
template <class, class = void> struct HasMainloop : std::false_type {};
template <class A> struct HasMainloop<A, std::void_t<decltype(std::declval<A&>().mainloop)>> : std::true_type {};
template <class, class = void> struct IsConv : std::false_type {};
template <class A> struct IsConv<A, std::void_t<decltype(std::declval<A&>().problem_size.N)>> : std::true_type {};
template <class, class = void> struct IsB2bConv : std::false_type {};
template <class A> struct IsB2bConv<A, std::void_t<decltype(std::declval<A&>().problem_size_0.N)>> : std::true_type {};
template <class, class = void> struct IsB2bGemm : std::false_type {};
template <class A> struct IsB2bGemm<A, std::void_t<decltype(std::declval<A&>().problem_size_0.m())>> : std::true_type {};
template <class, class = void> struct IsTransposingAdapter : std::false_type {};
template <class Op> struct IsTransposingAdapter<Op, std::void_t<decltype(Op::kInternalTranspose)>> : std::true_type {};

}  // namespace tvm_ext_contract

#include "tvm_ext_cutlass/contract_gemm.h"
#include "tvm_ext_cutlass/contract_conv.h"
#include "tvm_ext_cutlass/contract_attention.h"

namespace tvm_ext_contract {

/// The contract hook of every launcher (see the file comment). Returns 0: the verdict is the
/// report's, so the glue never raises for a refusal here.
template <class Op>
int inspect(typename Op::Arguments const& arguments, char* err, int err_len) {
  using Args = typename Op::Arguments;
  (void)err;
  (void)err_len;
  if constexpr (IsAttention<Args>::value) {
    Report r("attention");
    attention<Op>(arguments, r);
    r.status("can_implement", Op::can_implement(arguments));
    report() = r.finish();
  } else if constexpr (IsB2bConv<Args>::value) {
    Report r("b2b_conv2d");
    b2b_conv<Op>(arguments, r);
    r.status("can_implement", Op::can_implement(arguments));
    report() = r.finish();
  } else if constexpr (IsB2bGemm<Args>::value) {
    Report r("b2b_gemm");
    b2b_gemm<Op>(arguments, r);
    r.status("can_implement", Op::can_implement(arguments));
    report() = r.finish();
  } else if constexpr (IsConv<Args>::value) {
    Report r("conv2d_2x");
    conv_2x<Op>(arguments, r);
    r.status("can_implement", Op::can_implement(arguments));
    report() = r.finish();
  } else if constexpr (HasMainloop<Args>::value) {
    Report r("gemm_3x");
    gemm_3x<Op>(arguments, r);
    r.status("can_implement", Op::can_implement(arguments));
    report() = r.finish();
  } else {
    Report r("gemm_2x");
    if constexpr (IsTransposingAdapter<Op>::value) {
      r.flag("adapter_transposes", Op::kInternalTranspose);
      gemm_2x<typename Op::GemmKernel>(Op::to_underlying_arguments(arguments), r);
    } else {
      r.flag("adapter_transposes", false);
      gemm_2x<typename Op::GemmKernel>(arguments, r);
    }
    r.status("can_implement", Op::can_implement(arguments));
    report() = r.finish();
  }
  return 0;
}

}  // namespace tvm_ext_contract
