"""Back-to-back (persistent) convolution: ``conv+bias+ReLU -> conv1x1+bias+act`` in one kernel.

Bolt §3.1.1, Table 2 (CUTLASS ``examples/13_two_tensor_op_fusion``, ``B2bImplicitGemmConvolution``):
the first convolution (any R x S, stride, padding; e.g. 3x3) feeds a 1x1 / stride 1 / no padding
convolution without writing its output to global memory. As an implicit GEMM the pair is two
GEMMs with the same M = N*P*Q; each threadblock owns whole rows of the intermediate (threadblock
N = K0 for the first conv, K1 for the second), so K0 and K1 must be small (<= 128 / 256).

As for the b2b GEMM, the fusion is **chosen only when measurements say it is faster**: the
pattern's check needs a database record of the fused pair for this arch that beats the sum of
the two single-conv records (:func:`tvm_ext.cutlass.b2b.profitability_reason`).
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard
from tvm.relax.transform import FusionPattern, PatternCheckContext

from . import checks
from .b2b import B2B_ACTIVATIONS, ROLE_B1, ROLE_BIAS1, B2bEpilogueMixin, profitability_reason
from ..select.database import Database
from .epilogue import Epilogue
from .errors import CutlassCodegenError
from .patterns import CODEGEN_NAME
from .patterns import CompositeName
from .workload import ROLE_A, ROLE_B, ROLE_BIAS, ROLE_SCALAR, Conv2dWorkload, register_parser

B2B_CONV_NAME = f"{CODEGEN_NAME}.b2b_conv2d"
MAX_K0, MAX_K1 = 128, 256


@dataclass(frozen=True)
class B2bConv2dWorkload(B2bEpilogueMixin):
    """``y = act1(conv1x1(relu(conv(x, w0) + b0), w1) + b1)``, NHWC/OHWI, float16."""

    n: int
    h: int
    w: int
    c: int
    k0: int
    r: int
    s: int
    p: int
    q: int
    pad: tuple[int, int]
    stride: tuple[int, int]
    k1: int
    dtype: str
    activation1: str

    op = "b2b_conv2d"
    kind = "b2b_conv2d"
    batch = 1

    @property
    def gemm_mnk(self) -> tuple[int, int, int]:
        """M, N, K of the first convolution as an implicit GEMM."""
        return self.n * self.p * self.q, self.k0, self.r * self.s * self.c

    @property
    def flops(self) -> int:
        """Both convolutions."""
        m, n0, k0 = self.gemm_mnk
        return 2 * m * (n0 * k0 + self.k1 * n0)

    @property
    def n0(self) -> int:
        """GEMM N of the first convolution (its output channels): the threadblock N."""
        return self.k0

    @property
    def n1(self) -> int:
        """GEMM N of the 1x1 convolution."""
        return self.k1

    @property
    def max_alignment(self) -> tuple[int, int, int]:
        return (8, 8, 8)  # the example's b2b conv kernels use 128-bit accesses only

    def key(self) -> str:
        return (f"b2b_conv2d_n{self.n}_h{self.h}_w{self.w}_c{self.c}_k{self.k0}_r{self.r}_s{self.s}"
                f"_pad{self.pad[0]}x{self.pad[1]}_str{self.stride[0]}x{self.stride[1]}_k{self.k1}")

    def parts(self) -> tuple[Conv2dWorkload, Conv2dWorkload]:
        """The two unfused convolutions (for the profitability check)."""
        dt = self.dtype
        c0 = Conv2dWorkload(self.n, self.h, self.w, self.c, self.k0, self.r, self.s, self.p, self.q, self.pad,
                            self.stride, (1, 1), dt, dt, dt, Epilogue("bias", "relu"))
        c1 = Conv2dWorkload(self.n, self.p, self.q, self.k0, self.k1, 1, 1, self.p, self.q, (0, 0), (1, 1), (1, 1),
                            dt, dt, dt, Epilogue("bias", self.activation1))
        return c0, c1


def b2b_conv_pattern() -> tuple:
    """DPL root and annotations of the b2b conv pattern."""
    x, w0, b0, w1, b1 = (wildcard() for _ in range(5))
    c0 = is_op("relax.nn.conv2d")(x, w0)
    s0 = is_op("relax.add")(c0, b0)
    a0 = is_op("relax.nn.relu")(s0)
    c1 = is_op("relax.nn.conv2d")(a0, w1)
    s1 = is_op("relax.add")(c1, b1)
    root = None
    for name in B2B_ACTIVATIONS:
        alt = is_op(name)(s1)
        root = alt if root is None else root | alt
    ann = {"x": x, "w0": w0, "b0": b0, "w1": w1, "b1": b1, "c0": c0, "c1": c1, "a0": a0, "s0": s0, "s1": s1,
           "root": root}
    return root, ann


def _workload(ann) -> B2bConv2dWorkload:
    n, h, w, c = checks.static_shape(ann["x"])
    k0, r, s, _ = checks.static_shape(ann["w0"])
    k1 = checks.static_shape(ann["w1"])[0]
    _, p, q, _ = checks.static_shape(ann["c0"])
    attrs = ann["c0"].attrs
    pad = [int(v) for v in attrs.padding]
    root = ann["root"]
    act = B2B_ACTIVATIONS.get(root.op.name, "relu") if isinstance(root, relax.Call) else "relu"
    return B2bConv2dWorkload(n, h, w, c, k0, r, s, p, q, (pad[0], pad[1]), tuple(int(v) for v in attrs.strides),
                             k1, checks.dtype_of(ann["x"]), act)


def b2b_conv_reject_reason(ann, database: Database | None, device: str, arch: str, matched_expr=None, bindings=None,
                           usages=None) -> str | None:
    """Why a b2b conv match must not be fused (None if it may)."""
    for conv, data, weight in (("c0", "x", "w0"), ("c1", "a0", "w1")):
        reason = checks.conv2d_reject_reason(ann[data], ann[weight], ann[conv])
        if reason:
            return reason
        if checks.dtype_of(ann[conv]) != "float16":
            return "b2b kernels take float16 only"
        if any(int(d) != 1 for d in ann[conv].attrs.dilation):
            return "dilated convolution"
    attrs1 = ann["c1"].attrs
    if checks.static_shape(ann["w1"])[1:3] != (1, 1) or any(int(v) != 1 for v in attrs1.strides) \
            or any(int(v) for v in attrs1.padding):
        return "the second convolution must be 1x1, stride 1, no padding"
    for bias, add in (("b0", "s0"), ("b1", "s1")):
        reason = checks.epilogue_reject_reason({"bias": ann[bias], "source_add": ann[add]}, ann[add], ann[add])
        if reason:
            return reason
    wl = _workload(ann)
    if wl.c % 8 or wl.k0 % 16 or wl.k0 > MAX_K0 or wl.k1 % 16 or wl.k1 > MAX_K1:
        return (f"C={wl.c}, K0={wl.k0}, K1={wl.k1}: 128-bit accesses and whole-N threadblocks need C % 8 == 0, "
                f"K0 <= {MAX_K0}, K1 <= {MAX_K1}, K0 and K1 multiples of 16")
    if bindings is not None:
        leaks = checks.leaking_intermediates(matched_expr, bindings, usages)
        if leaks:
            return f"intermediate values {leaks} are used outside the fused group"
    return profitability_reason(wl, database, device, arch)


def b2b_conv_patterns(database: Database | None, device: str, arch: str) -> list[FusionPattern]:
    """The b2b conv FusionPattern whose check consults ``database`` for ``device`` and ``arch``."""
    root, ann = b2b_conv_pattern()

    def check(ctx: PatternCheckContext) -> bool:
        return b2b_conv_reject_reason(ctx.annotated_expr, database, device, arch, ctx.matched_expr,
                                      ctx.matched_bindings, ctx.var_usages) is None

    return [FusionPattern(B2B_CONV_NAME, root, ann, check)]


def b2b_conv_from_composite(comp: CompositeName, inner: relax.Function) -> tuple[B2bConv2dWorkload, dict]:
    """Workload and parameter roles of a ``b2b_conv2d`` composite function."""
    values = {b.var: b.value for block in inner.body.blocks for b in block.bindings}
    calls = [v for v in values.values() if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)]
    convs = [c for c in calls if c.op.name == "relax.nn.conv2d"]
    adds = [c for c in calls if c.op.name == "relax.add"]
    if len(convs) != 2 or len(adds) != 2:
        raise CutlassCodegenError("malformed b2b_conv2d composite")
    x, w0, w1 = convs[0].args[0], convs[0].args[1], convs[1].args[1]
    biases = [a.args[0] if a.args[1] in values else a.args[1] for a in adds]  # the operand that is a parameter
    roles = {p: ROLE_SCALAR for p in inner.params}
    roles.update({x: ROLE_A, w0: ROLE_B, w1: ROLE_B1, biases[0]: ROLE_BIAS, biases[1]: ROLE_BIAS1})
    body = inner.body.body
    root = values[body] if isinstance(body, relax.Var) and body in values else body
    return _workload({"x": x, "w0": w0, "w1": w1, "c0": convs[0], "root": root}), roles


register_parser("b2b_conv2d", b2b_conv_from_composite)
