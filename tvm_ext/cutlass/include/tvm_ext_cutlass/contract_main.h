// Driver of a CUTLASS contract program (tvm_ext.cutlass.contract): plain C++ (g++), no CUDA.
//
// For each call of a table the generated main provides, it allocates host tensors, fills them
// with small integers (tvm_ext.cutlass.contract_data mirrors the fill), calls the TVM-FFI glue
// function exactly as the Relax VM would (DLTensor arguments, the output last), and prints one
// JSON line: the contract hook's report, or the error the glue raised.
#pragma once

#include <dlpack/dlpack.h>
#include <tvm/ffi/function.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tvm_ext_cutlass/contract_buffers.h"

namespace tvm_ext_contract {

/// One tensor argument: glue parameter name, shape, DLPack dtype, fill seed (0: poisoned with NaN,
/// for outputs) and a byte offset of its data from a 256-byte boundary (a caller's misaligned view).
struct Param {
  const char* name;
  int ndim;
  std::int64_t shape[8];
  std::uint8_t code;
  std::uint8_t bits;
  std::uint32_t seed;
  int misalign;
};

struct Call {
  const char* symbol;
  TVMFFISafeCallType function;
  const Param* params;
  int num_params;
};

/// Small integer in [-2, 2] at element ``i`` of a tensor filled with ``seed``.
inline int small_int(std::uint64_t i, std::uint32_t seed) {
  std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u + seed * 97531u;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  return static_cast<int>(h % 5u) - 2;
}

/// Bits of the small integer ``v`` (or NaN when ``poison``) as a ``code``/``bits`` DLPack element.
inline std::uint32_t element_bits(int v, bool poison, std::uint8_t code, std::uint8_t bits) {
  static const std::uint16_t f16[5] = {0xC000, 0xBC00, 0x0000, 0x3C00, 0x4000};
  static const std::uint16_t b16[5] = {0xC000, 0xBF80, 0x0000, 0x3F80, 0x4000};
  if (bits == 32) {
    float f = poison ? std::nanf("") : static_cast<float>(v);
    std::uint32_t out;
    std::memcpy(&out, &f, 4);
    return out;
  }
  if (code == kDLBfloat) return poison ? 0x7FC0 : b16[v + 2];
  return poison ? 0x7E00 : f16[v + 2];
}

inline std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\u%04x", ch);
      out += esc;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

/// Run one call; its JSON line on stdout.
inline void run_call(int index, const Call& call) {
  buffers().clear();
  report().clear();
  std::vector<DLTensor> tensors(call.num_params);
  std::vector<void*> blocks;
  for (int i = 0; i < call.num_params; ++i) {
    const Param& p = call.params[i];
    std::int64_t numel = 1;
    for (int d = 0; d < p.ndim; ++d) numel *= p.shape[d];
    const std::size_t bytes = static_cast<std::size_t>(numel) * p.bits / 8;
    void* block = std::aligned_alloc(256, (bytes + 512) / 256 * 256);
    blocks.push_back(block);
    char* data = static_cast<char*>(block) + p.misalign;
    for (std::int64_t e = 0; e < numel; ++e) {
      std::uint32_t value = element_bits(small_int(e, p.seed), p.seed == 0, p.code, p.bits);
      std::memcpy(data + e * (p.bits / 8), &value, p.bits / 8);
    }
    DLTensor& t = tensors[i];
    t.data = data;
    t.device = DLDevice{kDLCUDA, 0};
    t.ndim = p.ndim;
    t.dtype = DLDataType{p.code, p.bits, 1};
    t.shape = const_cast<std::int64_t*>(p.shape);
    t.strides = nullptr;
    t.byte_offset = 0;
    buffers().push_back(Buffer{p.name, reinterpret_cast<std::uintptr_t>(data), bytes});
  }
  std::vector<TVMFFIAny> args(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    std::memset(&args[i], 0, sizeof(TVMFFIAny));
    args[i].type_index = kTVMFFIDLTensorPtr;
    args[i].v_ptr = &tensors[i];
  }
  std::string line = "{\"call\":" + std::to_string(index) + ",\"symbol\":" + json_string(call.symbol);
  try {
    tvm::ffi::Any result;
    TVM_FFI_CHECK_SAFE_CALL(call.function(nullptr, args.data(), static_cast<int>(args.size()),
                                          reinterpret_cast<TVMFFIAny*>(&result)));
    line += report().empty() ? ",\"error\":\"the launcher returned without a report\"" : ",\"report\":" + report();
  } catch (const tvm::ffi::Error& err) {
    line += ",\"error\":" + json_string(err.kind() + ": " + err.message());
  }
  std::printf("%s}\n", line.c_str());
  std::fflush(stdout);
  for (void* block : blocks) std::free(block);
}

inline int run_all(const Call* calls, int count) {
  for (int i = 0; i < count; ++i) run_call(i, calls[i]);
  return 0;
}

}  // namespace tvm_ext_contract
