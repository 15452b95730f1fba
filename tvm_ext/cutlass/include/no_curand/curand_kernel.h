// Stands in for cuRAND's curand_kernel.h, which CUDA toolkits without cuRAND (the minimal one this
// package is built with) lack. CUTLASS example 41's kernel_forward.h includes it unconditionally
// but uses cuRAND only for dropout, under #ifdef HAS_PYTORCH; tvm_ext's attention instances never
// define HAS_PYTORCH and are built with kSupportsDropout = false, so nothing here is needed.
#pragma once
