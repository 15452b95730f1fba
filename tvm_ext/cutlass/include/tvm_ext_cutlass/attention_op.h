// FusedAttention<AK>: CUTLASS example 41's AttentionKernel behind the device-operation interface
// every tvm_ext launcher uses (can_implement, get_workspace_size, initialize, run), so the launcher
// and the host-side contract check (contract_attention.h) treat it like any CUTLASS operation.
#pragma once

#include <cuda_runtime.h>

#include "cutlass/cutlass.h"
#include "kernel_forward.h"

namespace tvm_ext_cutlass {

template <class AK>
class FusedAttention {
 public:
  using Kernel = AK;
  using Arguments = typename AK::Params;

  /// The kernel's own check_supported (pointer and stride alignment), the head dims within the
  /// kernel's kMaxK, and no output-accumulator workspace needed (register-resident kernels only).
  static cutlass::Status can_implement(Arguments const& p) {
    if (!AK::check_supported(p)) return cutlass::Status::kErrorMisalignedOperand;
    if (p.head_dim <= 0 || p.head_dim_value <= 0 || p.head_dim > AK::kMaxK || p.head_dim_value > AK::kMaxK) {
      return cutlass::Status::kErrorInvalidProblem;
    }
    if (p.num_queries <= 0 || p.num_keys <= 0 || p.num_heads <= 0 || p.num_batches <= 0) {
      return cutlass::Status::kErrorInvalidProblem;
    }
    if (AK::kNeedsOutputAccumulatorBuffer) return cutlass::Status::kErrorWorkspaceNull;
    return cutlass::Status::kSuccess;
  }

  static size_t get_workspace_size(Arguments const&) { return 0; }

  static int shared_bytes() { return int(sizeof(typename AK::SharedStorage)); }

  cutlass::Status initialize(Arguments const& p, void* /*workspace*/, cudaStream_t /*stream*/) {
    params_ = p;
    if (shared_bytes() > 0xc000 &&
        cudaFuncSetAttribute(attention_kernel_batched_impl<AK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             shared_bytes()) != cudaSuccess) {
      return cutlass::Status::kErrorInternal;
    }
    return cutlass::Status::kSuccess;
  }

  cutlass::Status run(cudaStream_t stream) {
    attention_kernel_batched_impl<AK>
        <<<params_.getBlocksGrid(), params_.getThreadsGrid(), shared_bytes(), stream>>>(params_);
    return cudaGetLastError() == cudaSuccess ? cutlass::Status::kSuccess : cutlass::Status::kErrorInternal;
  }

 private:
  Arguments params_;
};

}  // namespace tvm_ext_cutlass
