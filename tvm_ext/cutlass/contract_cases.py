"""Library calls built by hand: what the contract check covers beyond the models at hand.

:func:`gemm_offload`, :func:`conv_offload` and :func:`b2b_offload` make offloads as the
partitioner would (roles, tensor shapes); :func:`coverage_matrix` lists every code path the
offload can take, each epilogue, the odd extents the seed suite has (M = 1, 2, 77, 128, 197, 384;
N = 1000; widths that allow only 2- or 4-element vectors), split-K, batched operands, TF32,
strided convolutions and back-to-back pairs, with the configuration the codegen would choose.
``scripts/check_cutlass_calls.py --matrix`` checks them.
"""
from __future__ import annotations

from typing import Iterator

from .b2b import B2bGemmWorkload
from .b2b_conv import B2bConv2dWorkload
from .candidates import uses_3x
from .checks import min_alignment
from .epilogue import Epilogue, all_epilogues
from .workload import Conv2dWorkload, GemmWorkload, Offload

#: The GEMM extents the seed suite's calls have (M: tokens or rows; N, K: widths), and odd widths.
M_EXTENTS = (1, 2, 77, 128, 197, 384)
NK_EXTENTS = ((768, 768), (3072, 768), (768, 3072), (1000, 2048), (250, 258), (100, 36))


def gemm_offload(name: str, m: int, n: int, k: int, ep: Epilogue = Epilogue(), *, batch: int = 1,
                 b_batched: bool = False, layout_b: str = "col", dtype: str = "float16") -> Offload:
    """A GEMM call as the partitioner makes it: A ``[batch, M, K]``, B ``[N, K]`` (``col``, a dense
    weight), ``[K, N]`` or ``[batch, K, N]`` (``b_batched``); a fused cast makes float32."""
    op = "batch_matmul" if b_batched else ("dense" if layout_b == "col" else "matmul")
    final = "float32" if ep.cast else dtype
    wl = GemmWorkload(op, batch, m, n, k, dtype, dtype, final, layout_b, ep, b_batched=b_batched)
    b_shape = (n, k) if layout_b == "col" else ((batch, k, n) if b_batched else (k, n))
    roles, shapes = ["a", "b"], [(batch, m, k), b_shape]
    if ep.has_bias:
        roles.append("bias")
        shapes.append((n,))
    if ep.has_residual:
        roles.append("residual")
        shapes.append((batch, m, n))
    return Offload(name, f"tvm_ext_cutlass.{op}{ep.suffix}", wl, tuple(roles), tuple(shapes), (batch, m, n))


def conv_offload(name: str, hw: int, c: int, k: int, rs: int, stride: int, ep: Epilogue = Epilogue()) -> Offload:
    """An NHWC / OHWI convolution of a ``hw`` x ``hw`` image, ``rs`` x ``rs`` filter, "same" padding."""
    pad = rs // 2
    out = (hw + 2 * pad - rs) // stride + 1
    final = "float32" if ep.cast else "float16"
    wl = Conv2dWorkload(1, hw, hw, c, k, rs, rs, out, out, (pad, pad), (stride, stride), (1, 1), "float16",
                        "float16", final, ep)
    roles, shapes = ["a", "b"], [(1, hw, hw, c), (k, rs, rs, c)]
    if ep.has_bias:
        roles.append("bias")
        shapes.append((k,))
    if ep.has_residual:
        roles.append("residual")
        shapes.append((1, out, out, k))
    return Offload(name, f"tvm_ext_cutlass.conv2d{ep.suffix}", wl, tuple(roles), tuple(shapes), (1, out, out, k))


def b2b_offload(name: str, wl: B2bGemmWorkload | B2bConv2dWorkload) -> Offload:
    """A back-to-back GEMM or convolution pair."""
    if isinstance(wl, B2bGemmWorkload):
        shapes = ((wl.m, wl.k0), (wl.n0, wl.k0), (wl.n0,), (wl.n1, wl.n0), (wl.n1,))
        out = (wl.m, wl.n1)
    else:
        shapes = ((wl.n, wl.h, wl.w, wl.c), (wl.k0, wl.r, wl.s, wl.c), (wl.k0,), (wl.k1, 1, 1, wl.k0), (wl.k1,))
        out = (wl.n, wl.p, wl.q, wl.k1)
    return Offload(name, f"tvm_ext_cutlass.{wl.kind}", wl, ("a", "b", "bias", "b1", "bias1"), shapes, out)


def _gemm_cases() -> Iterator[Offload]:
    for ep in all_epilogues():                       # every epilogue at an odd M
        yield gemm_offload(f"gemm_m197{ep.suffix}", 197, 768, 768, ep)
    for m in M_EXTENTS:                               # every extent, with and without an epilogue
        for n, k in NK_EXTENTS:
            for ep in (Epilogue(), Epilogue("bias", "gelu"), Epilogue("bias_residual")):
                yield gemm_offload(f"gemm_m{m}_n{n}_k{k}{ep.suffix}", m, n, k, ep)
    for m in (77, 128, 384):                          # attention: QK^T / PV with a batched B, shared B
        yield gemm_offload(f"qkt_m{m}", m, m, 64, batch=12, b_batched=True, layout_b="row")
        yield gemm_offload(f"pv_m{m}", m, 64, m, batch=12, b_batched=True, layout_b="row")
        yield gemm_offload(f"shared_b_m{m}", m, 256, 64, batch=4, layout_b="row")
    for m in (1, 77, 197):                            # TF32 on float32 operands
        yield gemm_offload(f"tf32_m{m}", m, 768, 768, Epilogue("bias", "gelu"), dtype="float32")


def _conv_cases() -> Iterator[Offload]:
    for ep in all_epilogues():
        yield conv_offload(f"conv_unit{ep.suffix}", 14, 64, 64, 3, 1, ep)
    for ep in (Epilogue(), Epilogue("bias", "relu"), Epilogue("bias_residual", "relu"), Epilogue("bias", "silu")):
        yield conv_offload(f"conv_strided{ep.suffix}", 28, 64, 128, 3, 2, ep)
        yield conv_offload(f"conv_1x1{ep.suffix}", 14, 256, 64, 1, 1, ep)
    yield conv_offload("conv_odd_channels", 14, 6, 10, 3, 1, Epilogue("bias", "relu"))


def _b2b_cases() -> Iterator[Offload]:
    yield b2b_offload("b2b_gemm_gelu", B2bGemmWorkload(384, 64, 256, 128, "float16", "gelu"))
    yield b2b_offload("b2b_gemm_relu", B2bGemmWorkload(128, 128, 768, 64, "float16", "relu"))
    yield b2b_offload("b2b_conv", B2bConv2dWorkload(1, 14, 14, 64, 64, 3, 3, 14, 14, (1, 1), (1, 1), 64, "float16",
                                                    "relu"))


def _partitioner_admits(off: Offload) -> bool:
    """The partitioner's alignment rule for GEMMs (:func:`~tvm_ext.cutlass.checks.gemm_reject_reason`):
    K and N multiples of the narrowest vector the kernels load (e.g. QK^T at 77 tokens has N = 77
    and stays with TVM, so no call of it is checked)."""
    wl = off.workload
    align = min_alignment(wl.dtype)
    return wl.kind != "gemm" or (wl.k % align == 0 and wl.n % align == 0)


def coverage_matrix(arch: str) -> list[Offload]:
    """Every hand-built call for ``arch`` that the partitioner admits (sm_90a: the GEMMs CUTLASS
    3.x may serve; sm_80: every path, 2.x kernels being the same on every arch)."""
    if arch == "sm_90a":
        return [off for off in _gemm_cases() if _partitioner_admits(off) and uses_3x(off.workload, arch)]
    return [off for off in (*_gemm_cases(), *_conv_cases(), *_b2b_cases()) if _partitioner_admits(off)]


__all__ = ["M_EXTENTS", "NK_EXTENTS", "b2b_offload", "conv_offload", "coverage_matrix", "gemm_offload"]
