// Host buffers of a CUTLASS contract run and the report it collects (tvm_ext.cutlass.contract).
//
// Plain C++ (no CUDA): the contract program's main (g++) registers each tensor it passes to the
// TVM-FFI glue here, and the contract hook (contract.h, compiled by nvcc into the instances)
// finds which tensor a kernel pointer lies in and appends its findings to report(). Both
// translation units see one registry: the functions are inline, so the linker keeps one copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tvm_ext_contract {

/// One tensor handed to the glue: its name (the glue parameter), first byte and size.
struct Buffer {
  std::string name;
  std::uintptr_t base;
  std::size_t bytes;
};

inline std::vector<Buffer>& buffers() {
  static std::vector<Buffer> all;
  return all;
}

/// JSON object text of the last inspected call ("" before any).
inline std::string& report() {
  static std::string text;
  return text;
}

/// The buffer holding the bytes [addr, addr + size), or -1.
inline int buffer_holding(std::uintptr_t addr, std::size_t size) {
  const std::vector<Buffer>& all = buffers();
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (addr >= all[i].base && addr + size <= all[i].base + all[i].bytes) return static_cast<int>(i);
  }
  return -1;
}

/// The buffer a pointer starts in (its one-past-the-end address included), or -1.
inline int buffer_of(std::uintptr_t addr) {
  const std::vector<Buffer>& all = buffers();
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (addr >= all[i].base && addr <= all[i].base + all[i].bytes) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace tvm_ext_contract
