"""The data of a CUTLASS contract run and the Relax reference of each element a call writes.

A contract program (:mod:`tvm_ext.cutlass.contract`) fills every input tensor with small
integers in [-2, 2] from a hash of the element index and the tensor's seed, and the output with
NaN (``contract_main.h``); :func:`filled` reproduces those tensors here. Small integers keep every
product and sum exact in the kernel's float32 accumulator, so an emulated output differs from
the reference only by the final rounding and the activation's last bits, while a wrong stride,
operand or broadcast axis changes it by whole units.

:func:`reference_at` computes what the composite Relax function (GEMM or convolution, then
bias, activation, residual, cast; back-to-back pairs) gives at given flat indices of its output,
from those tensors: one dot product per index, so a model-sized call costs milliseconds.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np
from scipy.special import erf

from .b2b import ROLE_B1, ROLE_BIAS1
from .epilogue import Epilogue
from .workload import ROLE_A, ROLE_B, ROLE_BIAS, ROLE_K, ROLE_Q, ROLE_RESIDUAL, ROLE_V, Offload

#: numpy dtype of each tensor dtype a CUTLASS call takes (bfloat16 values are held as float32).
_NUMPY = {"float16": np.float16, "bfloat16": np.float32, "float32": np.float32}


def small_ints(count: int, seed: int) -> np.ndarray:
    """``tvm_ext_contract::small_int`` for elements ``0..count-1`` of a tensor filled with ``seed``."""
    i = np.arange(count, dtype=np.uint64).astype(np.uint32)
    with np.errstate(over="ignore"):
        h = i * np.uint32(2654435761) + np.uint32((seed * 97531) % 2**32)
        h ^= h >> np.uint32(15)
        h *= np.uint32(2246822519)
        h ^= h >> np.uint32(13)
    return (h % np.uint32(5)).astype(np.int64) - 2


def filled(shape: Sequence[int], seed: int) -> np.ndarray:
    """The tensor a contract program passes for a parameter of ``shape`` and ``seed`` (float64;
    seed 0 is the poisoned output: NaN)."""
    count = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    if seed == 0:
        return np.full(tuple(shape), np.nan)
    return small_ints(count, seed).astype(np.float64).reshape(tuple(shape))


def activation(name: str | None, x: np.ndarray) -> np.ndarray:
    """Relax's activation ``name`` (``None``: identity) in float64."""
    if name is None:
        return x
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "gelu":
        return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))
    if name == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if name == "hardswish":
        return x * np.clip(x + 3.0, 0.0, 6.0) / 6.0
    raise ValueError(f"no reference for activation {name!r}")


def rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` rounded to ``dtype`` and back to float64 (bfloat16: round to nearest even on float32 bits)."""
    if dtype == "bfloat16":
        bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    return np.asarray(x).astype(_NUMPY[dtype]).astype(np.float64)


def _epilogue(ep: Epilogue, acc: np.ndarray, bias: np.ndarray | None, residual: np.ndarray | None,
              out_dtype: str, final_dtype: str) -> np.ndarray:
    """``cast(act(acc + bias + residual))``, or ``act(acc + bias) + residual`` after the activation."""
    z = acc + (bias if bias is not None else 0.0)
    if residual is not None and not ep.residual_after_act:
        z = z + residual
    z = activation(ep.activation, z)
    if residual is not None and ep.residual_after_act:
        z = z + residual
    return rounded(rounded(z, out_dtype), final_dtype)


def _gemm(off: Offload, t: Mapping[str, np.ndarray], idx: np.ndarray) -> np.ndarray:
    wl = off.workload
    a = t[ROLE_A].reshape(wl.batch, wl.m, wl.k)
    if wl.layout_b == "row":
        b = t[ROLE_B].reshape(-1, wl.k, wl.n)
    else:
        b = np.swapaxes(t[ROLE_B].reshape(-1, wl.n, wl.k), -1, -2)
    batch, m, n = np.unravel_index(idx, (wl.batch, wl.m, wl.n))
    b_batch = batch if b.shape[0] > 1 else np.zeros_like(batch)
    acc = np.einsum("ik,ik->i", a[batch, m, :], np.swapaxes(b, -1, -2)[b_batch, n, :])
    bias = t[ROLE_BIAS].reshape(-1)[n] if ROLE_BIAS in t else None
    residual = t[ROLE_RESIDUAL].reshape(-1)[idx] if ROLE_RESIDUAL in t else None
    return _epilogue(wl.epilogue, acc, bias, residual, wl.out_dtype, wl.final_dtype)


def _conv_at(x: np.ndarray, w: np.ndarray, n: int, p: int, q: int, pad, stride, dilation) -> np.ndarray:
    """All output channels of an NHWC / OHWI cross-correlation at output pixel (n, p, q)."""
    _, h_in, w_in, _ = x.shape
    k, r, s, _ = w.shape
    acc = np.zeros(k)
    for fr in range(r):
        h = p * stride[0] - pad[0] + fr * dilation[0]
        if not 0 <= h < h_in:
            continue
        for fs in range(s):
            col = q * stride[1] - pad[1] + fs * dilation[1]
            if 0 <= col < w_in:
                acc += w[:, fr, fs, :] @ x[n, h, col, :]
    return acc


def _conv(off: Offload, t: Mapping[str, np.ndarray], idx: np.ndarray) -> np.ndarray:
    wl = off.workload
    x = t[ROLE_A].reshape(wl.n, wl.h, wl.w, wl.c)
    w = t[ROLE_B].reshape(wl.k, wl.r, wl.s, wl.c)
    n, p, q, k = np.unravel_index(idx, (wl.n, wl.p, wl.q, wl.k))
    acc = np.array([_conv_at(x, w, *pix, wl.pad, wl.stride, wl.dilation)[ch] for *pix, ch in zip(n, p, q, k)])
    bias = t[ROLE_BIAS].reshape(-1)[k] if ROLE_BIAS in t else None
    residual = t[ROLE_RESIDUAL].reshape(-1)[idx] if ROLE_RESIDUAL in t else None
    return _epilogue(wl.epilogue, acc, bias, residual, wl.out_dtype, wl.final_dtype)


def _b2b_second(wl, z0: np.ndarray, w1: np.ndarray, bias1: np.ndarray) -> np.ndarray:
    """``act1(z0 @ w1^T + bias1)``: the second GEMM of a pair on the first one's fp16 output."""
    return _epilogue(Epilogue("bias", wl.activation1), z0 @ w1.T, bias1, None, wl.dtype, wl.dtype)


def _b2b_gemm(off: Offload, t: Mapping[str, np.ndarray], idx: np.ndarray) -> np.ndarray:
    wl = off.workload
    x = t[ROLE_A].reshape(wl.m, wl.k0)
    m, n = np.unravel_index(idx, (wl.m, wl.n1))
    w0, w1 = t[ROLE_B].reshape(wl.n0, wl.k0), t[ROLE_B1].reshape(wl.n1, wl.n0)
    z0 = rounded(np.maximum(x[m] @ w0.T + t[ROLE_BIAS].reshape(-1), 0.0), wl.dtype)
    return np.array([_b2b_second(wl, z0[i], w1[n[i]][None, :], t[ROLE_BIAS1].reshape(-1)[n[i]])[0]
                     for i in range(len(idx))])


def _b2b_conv(off: Offload, t: Mapping[str, np.ndarray], idx: np.ndarray) -> np.ndarray:
    wl = off.workload
    x = t[ROLE_A].reshape(wl.n, wl.h, wl.w, wl.c)
    w0 = t[ROLE_B].reshape(wl.k0, wl.r, wl.s, wl.c)
    w1 = t[ROLE_B1].reshape(wl.k1, wl.k0)
    n, p, q, k = np.unravel_index(idx, (wl.n, wl.p, wl.q, wl.k1))
    out = []
    for i in range(len(idx)):
        acc0 = _conv_at(x, w0, n[i], p[i], q[i], wl.pad, wl.stride, (1, 1))
        z0 = rounded(np.maximum(acc0 + t[ROLE_BIAS].reshape(-1), 0.0), wl.dtype)
        out.append(_b2b_second(wl, z0, w1[k[i]][None, :], t[ROLE_BIAS1].reshape(-1)[k[i]])[0])
    return np.array(out)


def _attention(off: Offload, t: Mapping[str, np.ndarray], idx: np.ndarray) -> np.ndarray:
    """``softmax(Q K^T * scale + bias) V`` at flat indices of the ``[B, M, H, Dv]`` output, with the
    operands viewed through the layouts the composite reads them in."""
    wl = off.workload
    q, k, v = (op.to_logical(t[role]) for op, role in ((wl.q, ROLE_Q), (wl.k, ROLE_K), (wl.v, ROLE_V)))
    batch, heads = wl.batch_heads
    bias = None
    if ROLE_BIAS in t:
        shape = (1,) * (4 - len(wl.bias_shape)) + tuple(wl.bias_shape)
        bias = np.broadcast_to(t[ROLE_BIAS].reshape(shape), (batch, heads, wl.m, wl.n))
    b, m, h, d = np.unravel_index(idx, (batch, wl.m, heads, wl.dv))
    out = np.empty(len(idx))
    for i in range(len(idx)):
        s = k[b[i], h[i]] @ q[b[i], h[i], m[i]] * wl.scale
        if bias is not None:
            s = s + bias[b[i], h[i], m[i]]
        if wl.causal:
            s[m[i] + 1:] = -np.inf
        e = np.exp(s - s.max())
        out[i] = e @ v[b[i], h[i], :, d[i]] / e.sum()
    return rounded(out, wl.dtype)


#: workload kind -> ``reference(offload, tensors by role, flat output indices) -> values``.
REFERENCES: dict[str, Callable[[Offload, Mapping[str, np.ndarray], np.ndarray], np.ndarray]] = {
    "gemm": _gemm, "conv2d": _conv, "b2b_gemm": _b2b_gemm, "b2b_conv2d": _b2b_conv, "attention": _attention,
}


def reference_at(off: Offload, tensors: Mapping[str, np.ndarray], indices: Sequence[int]) -> np.ndarray:
    """The composite's output at the flat ``indices`` of its output tensor, from ``tensors``
    (parameter role -> array, as :func:`filled` made them)."""
    idx = np.asarray(indices, dtype=np.int64)
    if idx.size == 0:
        return np.zeros(0)
    return REFERENCES[off.workload.kind](off, tensors, idx)


__all__ = ["REFERENCES", "activation", "filled", "reference_at", "rounded", "small_ints"]
