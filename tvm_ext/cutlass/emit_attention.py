"""Emit the fused attention instance (CUTLASS example 41's ``AttentionKernel``) and its C entry point.

cutlass_library has no emitter for the example's kernel, so the instance is one type alias here;
the device-operation adapter is the package's header ``tvm_ext_cutlass/attention_op.h``. The
launcher is ``extern "C" int <entry>(const TvmExtAttentionArgs*, char* err, int err_len)`` and
ends in :func:`~tvm_ext.cutlass.emit_gemm.launch`, like every other instance, so a contract build
hands the kernel's ``Params`` to the host-side check instead of launching it.
"""
from __future__ import annotations

import hashlib

from .attention import AttentionWorkload
from .config import KernelConfig
from .emit_gemm import ARGS_HEADER, CHECK_MACRO, COMMON_INCLUDES, launch
from .nvcc import OWN_INCLUDE

SCALAR_TYPES = {"float16": "cutlass::half_t", "bfloat16": "cutlass::bfloat16_t"}
_ADAPTER = OWN_INCLUDE / "tvm_ext_cutlass" / "attention_op.h"


def _adapter_digest() -> str:
    """Hash of the adapter header: it is part of the instance, so a changed header is a new source."""
    return hashlib.sha256(_ADAPTER.read_bytes()).hexdigest()[:16]


def emit_attention(wl: AttentionWorkload, cfg: KernelConfig, entry: str) -> str:
    """CUDA source of one ``AttentionKernel`` instance (``cfg.threadblock`` = queries and keys per
    block and the largest head dim) and its launcher; problem sizes, strides, scale and the
    causal flag are runtime arguments."""
    queries, keys, max_k = cfg.threadblock
    scalar = SCALAR_TYPES[wl.dtype]
    bias = "true" if wl.bias_shape else "false"
    kernel = f"""
// adapter tvm_ext_cutlass/attention_op.h {_adapter_digest()}
using {entry}_kernel = AttentionKernel<{scalar}, cutlass::arch::Sm80, true, {queries}, {keys}, {max_k}, false, {bias}>;
"""
    launcher = f"""
extern "C" int {entry}(const TvmExtAttentionArgs* args, char* err, int err_len) {{
  using Op = tvm_ext_cutlass::FusedAttention<{entry}_kernel>;
  using T = {scalar};
  typename Op::Arguments arguments;
  arguments.query_ptr = static_cast<T*>(const_cast<void*>(args->q));
  arguments.key_ptr = static_cast<T*>(const_cast<void*>(args->k));
  arguments.value_ptr = static_cast<T*>(const_cast<void*>(args->v));
  arguments.attn_bias_ptr = static_cast<T*>(const_cast<void*>(args->bias));
  arguments.output_ptr = static_cast<T*>(args->o);
  arguments.output_accum_ptr = nullptr;
  arguments.logsumexp_ptr = nullptr;
  arguments.scale = args->scale;
  arguments.num_batches = int32_t(args->batch);
  arguments.num_heads = int32_t(args->heads);
  arguments.num_queries = int32_t(args->m);
  arguments.num_keys = int32_t(args->n);
  arguments.head_dim = int32_t(args->d);
  arguments.head_dim_value = int32_t(args->dv);
  arguments.custom_mask_type = args->causal ? Op::Kernel::CausalFromTopLeft : Op::Kernel::NoCustomMask;
  arguments.q_strideB = args->q_stride_b; arguments.q_strideH = int32_t(args->q_stride_h);
  arguments.q_strideM = int32_t(args->q_stride_m);
  arguments.k_strideB = args->k_stride_b; arguments.k_strideH = int32_t(args->k_stride_h);
  arguments.k_strideM = int32_t(args->k_stride_m);
  arguments.v_strideB = args->v_stride_b; arguments.v_strideH = int32_t(args->v_stride_h);
  arguments.v_strideM = int32_t(args->v_stride_m);
  arguments.bias_strideB = args->bias_stride_b; arguments.bias_strideH = args->bias_stride_h;
  arguments.bias_strideM = int32_t(args->bias_stride_m);
  arguments.o_strideM = int32_t(args->o_stride_m);{launch("Op")}"""
    includes = COMMON_INCLUDES + '#include "tvm_ext_cutlass/attention_op.h"\n'
    return "\n".join([includes, ARGS_HEADER, CHECK_MACRO, "namespace {", kernel, "}  // namespace", launcher])


__all__ = ["SCALAR_TYPES", "emit_attention"]
