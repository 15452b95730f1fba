"""TVM-FFI glue: one exported function per offloaded Relax function.

Each exported function takes the Relax call's tensors in order plus the output (destination
passing style), checks shapes and dtypes, fills a ``TvmExtGemmArgs``/``TvmExtConv2dArgs`` and
calls the instance's C entry point on the stream TVM is using (``TVMFFIEnvGetStream``).
The glue is plain C++ (host only) and compiles with g++ in a second or two.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

import tvm

from ..errors import KernelCompileError
from ..toolchain.cuda import cuda_root
from .config import KernelConfig
from .emit_gemm import ARGS_HEADER
from .errors import CutlassSetupError
from .nvcc import cache_dir, source_key, tvm_ffi_include
from .workload import (ROLE_A, ROLE_B, ROLE_BIAS, ROLE_K, ROLE_Q, ROLE_RESIDUAL, ROLE_V, Conv2dWorkload,
                       GemmWorkload, Offload)

_DL_CODES = {"float16": (2, 16), "bfloat16": (4, 16), "float32": (2, 32)}

GLUE_PRELUDE = r"""
#include <tvm/ffi/function.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <cstdint>
""" + ARGS_HEADER + r"""
namespace {
inline void* tvm_ext_ptr(const tvm::ffi::TensorView& t) {
  return static_cast<char*>(t.data_ptr()) + t.byte_offset();
}
inline void tvm_ext_check(const tvm::ffi::TensorView& t, int64_t numel, uint8_t code, uint8_t bits,
                          const char* fn, const char* what) {
  TVM_FFI_CHECK(t.numel() == numel, ValueError) << fn << ": " << what << " has " << t.numel()
      << " elements, expected " << numel;
  TVM_FFI_CHECK(t.dtype().code == code && t.dtype().bits == bits, TypeError) << fn << ": " << what
      << " has the wrong dtype";
  TVM_FFI_CHECK(t.IsContiguous(), ValueError) << fn << ": " << what << " must be contiguous";
}
inline void tvm_ext_check_aligned(const tvm::ffi::TensorView& t, int bytes, const char* fn, const char* what) {
  const auto addr = reinterpret_cast<std::uintptr_t>(tvm_ext_ptr(t));
  TVM_FFI_CHECK(addr % bytes == 0, ValueError) << fn << ": " << what << " starts at address " << addr
      << ", which is not a multiple of " << bytes << " bytes; the CUTLASS kernel reads and writes it in "
      << bytes << "-byte vectors (pass a tensor whose data starts on such a boundary, e.g. a fresh copy)";
}
}  // namespace
"""


def _numel(shape: Sequence[int]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def _source_pointers(ptr: dict[str, str]) -> tuple[str, str, bool]:
    """``(source, bias, source_is_vector)``: C is the residual if there is one, else the bias."""
    if ROLE_RESIDUAL in ptr:
        return ptr[ROLE_RESIDUAL], ptr.get(ROLE_BIAS, "nullptr"), False
    if ROLE_BIAS in ptr:
        return ptr[ROLE_BIAS], "nullptr", True
    return "nullptr", "nullptr", False


def _gemm_fill(wl: GemmWorkload, ptr: dict[str, str], split_k: int) -> list[str]:
    m, n, k = wl.m, wl.n, wl.k
    source, bias, is_vector = _source_pointers(ptr)
    return [
        f"args.batch = {wl.batch}; args.m = {m}; args.n = {n}; args.k = {k}; args.split_k = {split_k};",
        f"args.a = {ptr[ROLE_A]}; args.b = {ptr[ROLE_B]}; args.source = {source}; args.bias = {bias};",
        f"args.d = {ptr['out']};",
        f"args.lda = {k}; args.ldb = {n if wl.layout_b == 'row' else k}; args.ldc = {0 if is_vector else n};",
        f"args.ldd = {n};",
        f"args.batch_stride_a = {m * k}; args.batch_stride_b = {k * n if wl.b_batched else 0};",
        f"args.batch_stride_c = {0 if is_vector else m * n}; args.batch_stride_d = {m * n};",
    ]


def _conv_fill(wl: Conv2dWorkload, ptr: dict[str, str]) -> list[str]:
    source, bias, is_vector = _source_pointers(ptr)
    return [
        f"args.n = {wl.n}; args.h = {wl.h}; args.w = {wl.w}; args.c = {wl.c}; args.k = {wl.k};",
        f"args.r = {wl.r}; args.s = {wl.s}; args.p = {wl.p}; args.q = {wl.q};",
        f"args.pad_h = {wl.pad[0]}; args.pad_w = {wl.pad[1]}; args.stride_h = {wl.stride[0]};",
        f"args.stride_w = {wl.stride[1]}; args.dilation_h = {wl.dilation[0]}; args.dilation_w = {wl.dilation[1]};",
        f"args.x = {ptr[ROLE_A]}; args.w_ptr = {ptr[ROLE_B]}; args.source = {source}; args.bias = {bias};",
        f"args.y = {ptr['out']}; args.source_is_vector = {int(is_vector)};",
    ]


def _b2b_fill(wl, ptr: dict[str, str]) -> list[str]:
    return [f"args.m = {wl.m}; args.n0 = {wl.n0}; args.k0 = {wl.k0}; args.n1 = {wl.n1};",
            f"args.a0 = {ptr[ROLE_A]}; args.b0 = {ptr[ROLE_B]}; args.bias0 = {ptr[ROLE_BIAS]};",
            f"args.b1 = {ptr['b1']}; args.bias1 = {ptr['bias1']}; args.d = {ptr['out']};"]


def _b2b_conv_fill(wl, ptr: dict[str, str]) -> list[str]:
    return [f"args.n = {wl.n}; args.h = {wl.h}; args.w = {wl.w}; args.c = {wl.c}; args.k0 = {wl.k0};",
            f"args.r = {wl.r}; args.s = {wl.s}; args.p = {wl.p}; args.q = {wl.q}; args.k1 = {wl.k1};",
            f"args.pad_h = {wl.pad[0]}; args.pad_w = {wl.pad[1]}; args.stride_h = {wl.stride[0]};"
            f" args.stride_w = {wl.stride[1]};",
            f"args.x = {ptr[ROLE_A]}; args.w0 = {ptr[ROLE_B]}; args.bias0 = {ptr[ROLE_BIAS]};",
            f"args.w1 = {ptr['b1']}; args.bias1 = {ptr['bias1']}; args.y = {ptr['out']};"]


def _attention_fill(wl, ptr: dict[str, str]) -> list[str]:
    (qb, qh, qm), (kb, kh, km), (vb, vh, vm) = wl.q.strides(), wl.k.strides(), wl.v.strides()
    bb, bh, bm = wl.bias_strides()
    batch, heads = wl.batch_heads
    return [f"args.batch = {batch}; args.heads = {heads}; args.m = {wl.m}; args.n = {wl.n};",
            f"args.d = {wl.d}; args.dv = {wl.dv}; args.scale = {wl.scale!r}f; args.causal = {int(wl.causal)};",
            f"args.q_stride_b = {qb}; args.q_stride_h = {qh}; args.q_stride_m = {qm};",
            f"args.k_stride_b = {kb}; args.k_stride_h = {kh}; args.k_stride_m = {km};",
            f"args.v_stride_b = {vb}; args.v_stride_h = {vh}; args.v_stride_m = {vm};",
            f"args.bias_stride_b = {bb}; args.bias_stride_h = {bh}; args.bias_stride_m = {bm};",
            f"args.o_stride_m = {heads * wl.dv};",
            f"args.q = {ptr[ROLE_Q]}; args.k = {ptr[ROLE_K]}; args.v = {ptr[ROLE_V]};",
            f"args.bias = {ptr.get(ROLE_BIAS, 'nullptr')}; args.o = {ptr['out']};"]


#: kind -> (``fill(workload, pointers, split_k) -> C++ lines``, argument struct of the entry point).
_FILLERS = {
    "gemm": (_gemm_fill, "TvmExtGemmArgs"),
    "conv2d": (lambda wl, ptr, split_k: _conv_fill(wl, ptr), "TvmExtConv2dArgs"),
    "b2b_gemm": (lambda wl, ptr, split_k: _b2b_fill(wl, ptr), "TvmExtB2bGemmArgs"),
    "b2b_conv2d": (lambda wl, ptr, split_k: _b2b_conv_fill(wl, ptr), "TvmExtB2bConv2dArgs"),
    "attention": (lambda wl, ptr, split_k: _attention_fill(wl, ptr), "TvmExtAttentionArgs"),
}
#: Roles of tensors read in the input dtype (the attention core's Q, K and V included).
INPUT_ROLES = (ROLE_A, ROLE_B, "b1", ROLE_Q, ROLE_K, ROLE_V)


def operand_alignment_bytes(wl, cfg: KernelConfig) -> dict[str, int]:
    """Bytes each tensor role's data pointer must be a multiple of for the instance ``cfg``.

    The kernels move A, B and C/D in vectors of ``cfg.alignment`` elements (a bias or residual
    travels as C, or as the broadcast vector read like it); TVM allocates on 64-byte or wider
    boundaries, so only a caller's own views (a sliced DLPack tensor) can miss it.
    """
    in_bytes = tvm.DataType(wl.dtype).bits // 8
    out_bytes = tvm.DataType(getattr(wl, "out_dtype", wl.final_dtype)).bits // 8
    final_bytes = tvm.DataType(wl.final_dtype).bits // 8
    a, b, c = cfg.alignment
    return {ROLE_A: a * in_bytes, ROLE_B: b * in_bytes, "b1": b * in_bytes, ROLE_Q: a * in_bytes,
            ROLE_K: b * in_bytes, ROLE_V: b * in_bytes, ROLE_BIAS: c * out_bytes,
            ROLE_RESIDUAL: c * out_bytes, "bias1": c * out_bytes, "out": c * final_bytes}


def emit_glue_function(off: Offload, entry: str, cfg: KernelConfig) -> str:
    """C++ for the exported function ``off.symbol`` calling the C entry point ``entry``.

    The shapes of the offload are passed here, and the runtime part of ``cfg`` (split-K
    slices): the instance behind ``entry`` is shape-generic and may serve several offloads.
    Every tensor is checked for its element count, dtype, contiguity and the alignment the
    instance needs (:func:`operand_alignment_bytes`); a failure raises naming the tensor.
    """
    wl = off.workload
    params = [f"tvm::ffi::TensorView p{i}" for i in range(len(off.roles))] + ["tvm::ffi::TensorView out"]
    checks, ptr = [], {"out": "tvm_ext_ptr(out)"}
    align = operand_alignment_bytes(wl, cfg)
    in_code, in_bits = _DL_CODES[wl.dtype]
    for i, (role, shape) in enumerate(zip(off.roles, off.param_shapes)):
        if role in INPUT_ROLES:
            checks.append(f'tvm_ext_check(p{i}, {_numel(shape)}, {in_code}, {in_bits}, "{off.symbol}", "{role}");')
        elif role in (ROLE_BIAS, ROLE_RESIDUAL, "bias1"):
            code, bits = _DL_CODES[getattr(wl, "out_dtype", wl.final_dtype)]  # pre-cast dtype
            checks.append(f'tvm_ext_check(p{i}, {_numel(shape)}, {code}, {bits}, "{off.symbol}", "{role}");')
        else:
            continue
        checks.append(f'tvm_ext_check_aligned(p{i}, {align[role]}, "{off.symbol}", "{role}");')
        ptr[role] = f"tvm_ext_ptr(p{i})"
    out_code, out_bits = _DL_CODES[wl.final_dtype]
    checks.append(f'tvm_ext_check(out, {_numel(off.out_shape)}, {out_code}, {out_bits}, "{off.symbol}", "output");')
    checks.append(f'tvm_ext_check_aligned(out, {align["out"]}, "{off.symbol}", "output");')
    fill_args, args_type = _FILLERS[wl.kind]
    fill = fill_args(wl, ptr, cfg.split_k)
    body = "\n  ".join(checks + [f"{args_type} args{{}};"] + fill)
    return f"""
extern "C" int {entry}(const {args_type}*, char*, int);
static void {off.symbol}_impl({", ".join(params)}) {{
  {body}
  args.stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(out.device().device_type, out.device().device_id));
  char err[512] = {{0}};
  if ({entry}(&args, err, sizeof(err)) != 0) {{
    TVM_FFI_THROW(RuntimeError) << "{off.symbol} (CUTLASS): " << err;
  }}
}}
TVM_FFI_DLL_EXPORT_TYPED_FUNC({off.symbol}, {off.symbol}_impl);
"""


def emit_glue(offloads: Sequence[Offload], entries: Sequence[str], configs: Sequence[KernelConfig]) -> str:
    """The whole glue translation unit: one exported function per offload, calling ``entries``
    with the instance configurations ``configs``."""
    if not len(offloads) == len(entries) == len(configs):
        raise ValueError(f"{len(offloads)} offloads, {len(entries)} entry points and {len(configs)} configurations")
    return GLUE_PRELUDE + "".join(emit_glue_function(o, e, c) for o, e, c in zip(offloads, entries, configs))


def compile_glue(source: str) -> Path:
    """Compile the glue with g++ (cached like the kernels)."""
    flags = ["-std=c++17", "-O2", "-fPIC", "-c", f"-I{cuda_root() / 'include'}", f"-I{tvm_ffi_include()}"]
    target = cache_dir() / (source_key(source, flags + ["glue"]) + ".o")
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(prefix="tvm_ext_glue_") as tmp:
        src = Path(tmp) / "glue.cc"
        src.write_text(source)
        out = Path(tmp) / "glue.o"
        cxx = shutil.which("g++") or shutil.which("c++")
        if cxx is None:
            raise CutlassSetupError("a host C++ compiler (g++) is needed for the CUTLASS glue")
        proc = subprocess.run([cxx, *flags, str(src), "-o", str(out)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise KernelCompileError(f"g++ failed on the CUTLASS glue:\n{proc.stderr[-4000:]}")
        staged = target.with_suffix(f".{os.getpid()}.tmp")
        shutil.copyfile(out, staged)
        os.replace(staged, target)  # atomic for concurrent builds
    return target
