"""Back-to-back (persistent) GEMM fusion: ``GEMM0+bias+ReLU -> GEMM1+bias+act`` in one kernel.

Both main loops run in one threadblock that owns whole rows of the intermediate (threadblock
N = N0 for GEMM0 and N1 for GEMM1), so ``D0 = relu(A @ W0^T + b0)`` never reaches global memory
(Bolt §3.1.1; CUTLASS ``examples/13_two_tensor_op_fusion``). GEMM0's epilogue must be ReLU
(the example's scale/bias fragment epilogue exists only for ReLU); GEMM1 takes any single-op
activation. Both GEMMs are dense layers (weights ``[N, K]``) with 16-bit inputs.

The fusion is **chosen only when measurements say it is faster**: the pattern's check accepts
a match only if the database holds a b2b record for the pair on this arch that beats the sum of
the two single-GEMM records. Without such records the GEMMs are offloaded one by one.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard
from tvm.relax.transform import FusionPattern, PatternCheckContext

from . import checks
from ..select.database import Database
from .records import best_config
from .epilogue import Epilogue
from .errors import CutlassCodegenError
from .patterns import CODEGEN_NAME
from .patterns import CompositeName
from .workload import ROLE_A, ROLE_B, ROLE_BIAS, ROLE_SCALAR, GemmWorkload, register_parser

B2B_NAME = f"{CODEGEN_NAME}.b2b_gemm"
ROLE_B1, ROLE_BIAS1 = "b1", "bias1"
B2B_ACTIVATIONS = {"relax.nn.relu": "relu", "relax.nn.gelu": "gelu", "relax.nn.gelu_tanh": "gelu_tanh",
                   "relax.nn.silu": "silu", "relax.sigmoid": "sigmoid"}
MAX_N = 256


class B2bEpilogueMixin:
    """What both back-to-back workloads share: one dtype throughout, bias + activation last."""

    dtype: str
    activation1: str

    @property
    def final_dtype(self) -> str:
        return self.dtype

    @property
    def epilogue(self) -> Epilogue:
        return Epilogue("bias", self.activation1)


@dataclass(frozen=True)
class B2bGemmWorkload(B2bEpilogueMixin):
    """``D = act1(relu(A[M, K0] @ W0[N0, K0]^T + b0) @ W1[N1, N0]^T + b1)``."""

    m: int
    n0: int
    k0: int
    n1: int
    dtype: str
    activation1: str

    op = "b2b_gemm"
    kind = "b2b_gemm"
    batch = 1

    @property
    def gemm_mnk(self) -> tuple[int, int, int]:
        """M, N, K of the first GEMM."""
        return self.m, self.n0, self.k0

    @property
    def flops(self) -> int:
        """Both GEMMs."""
        return 2 * self.m * (self.n0 * self.k0 + self.n1 * self.n0)

    def key(self) -> str:
        return f"b2b_gemm_m{self.m}_n{self.n0}_k{self.k0}_n{self.n1}"

    def parts(self) -> tuple[GemmWorkload, GemmWorkload]:
        """The two unfused GEMMs (for the profitability check)."""
        g0 = GemmWorkload("dense", 1, self.m, self.n0, self.k0, self.dtype, self.dtype, self.dtype, "col",
                          Epilogue("bias", "relu"))
        g1 = GemmWorkload("dense", 1, self.m, self.n1, self.n0, self.dtype, self.dtype, self.dtype, "col",
                          Epilogue("bias", self.activation1))
        return g0, g1

    @property
    def max_alignment(self) -> tuple[int, int, int]:
        return (8 if self.k0 % 8 == 0 else 2, 8 if self.k0 % 8 == 0 else 2, 8 if self.n1 % 8 == 0 else 2)


def b2b_pattern() -> tuple:
    """DPL root and annotations of the b2b pattern."""
    x, w0, b0, w1, b1 = (wildcard() for _ in range(5))
    t0, t1 = is_op("relax.permute_dims")(w0), is_op("relax.permute_dims")(w1)
    g0 = is_op("relax.matmul")(x, t0)
    s0 = is_op("relax.add")(g0, b0)
    a0 = is_op("relax.nn.relu")(s0)
    g1 = is_op("relax.matmul")(a0, t1)
    s1 = is_op("relax.add")(g1, b1)
    root = None
    for name in B2B_ACTIVATIONS:
        alt = is_op(name)(s1)
        root = alt if root is None else root | alt
    ann = {"x": x, "w0": w0, "b0": b0, "w1": w1, "b1": b1, "t0": t0, "t1": t1, "g0": g0, "g1": g1,
           "s0": s0, "s1": s1, "root": root}
    return root, ann


def b2b_reject_reason(ann, database: Database | None, device: str, arch: str, matched_expr=None, bindings=None,
                      usages=None) -> str | None:
    """Why a b2b match must not be fused (None if it may)."""
    for g, a, b, t in (("g0", "x", "w0", "t0"), ("g1", "s0", "w1", "t1")):
        reason = checks.gemm_reject_reason("dense", ann[a] if a != "s0" else ann["g0"], ann[b], ann[g], ann[t])
        if reason:
            return reason
        if checks.dtype_of(ann[g]) != "float16":
            return "b2b kernels take float16 only"
    for bias, add in (("b0", "s0"), ("b1", "s1")):
        reason = checks.epilogue_reject_reason({"bias": ann[bias], "source_add": ann[add]}, ann[add], ann[add])
        if reason:
            return reason
    wl = _workload(ann)
    align = max(wl.max_alignment[0], wl.max_alignment[2])
    if wl.m % align:  # B2bGemm::can_implement: M of both GEMMs a multiple of the A and C vector widths
        return f"M={wl.m} is not a multiple of {align} (B2bGemm::can_implement)"
    if wl.n0 % 16 or wl.n0 > 128 or wl.n1 % 16 or wl.n1 > MAX_N:
        return f"N0={wl.n0}, N1={wl.n1}: a whole-N threadblock needs N0 <= 128, N1 <= {MAX_N}, multiples of 16"
    if bindings is not None:
        leaks = checks.leaking_intermediates(matched_expr, bindings, usages)
        if leaks:
            return f"intermediate values {leaks} are used outside the fused group"
    return profitability_reason(wl, database, device, arch)


def profitability_reason(wl, database: Database | None, device: str, arch: str) -> str | None:
    """None when measurements on ``device`` show the fused kernel beating the two unfused ones."""
    fused = best_config(database, wl, device, arch)
    parts = [best_config(database, g, device, arch) for g in wl.parts()]
    if fused is None or any(p is None for p in parts):
        return "no measurements (b2b fusion is chosen only by profiling)"
    unfused = sum(p[1] for p in parts)
    if fused[1] >= unfused:
        return f"fused {fused[1] * 1e6:.2f} us is not faster than unfused {unfused * 1e6:.2f} us"
    return None


def _workload(ann) -> B2bGemmWorkload:
    x_shape = checks.static_shape(ann["x"])
    n0, k0 = checks.static_shape(ann["w0"])
    n1, _ = checks.static_shape(ann["w1"])
    m = 1
    for d in x_shape[:-1]:
        m *= d
    root = ann["root"]
    act = B2B_ACTIVATIONS.get(root.op.name, "relu") if isinstance(root, relax.Call) else "relu"
    return B2bGemmWorkload(m, n0, k0, n1, checks.dtype_of(ann["x"]), act)


def b2b_patterns(database: Database | None, device: str, arch: str) -> list[FusionPattern]:
    """The b2b FusionPattern whose check consults ``database`` for ``device`` and ``arch``."""
    root, ann = b2b_pattern()

    def check(ctx: PatternCheckContext) -> bool:
        return b2b_reject_reason(ctx.annotated_expr, database, device, arch, ctx.matched_expr,
                                 ctx.matched_bindings, ctx.var_usages) is None

    return [FusionPattern(B2B_NAME, root, ann, check)]


def b2b_from_composite(comp: CompositeName, inner: relax.Function) -> tuple[B2bGemmWorkload, dict]:
    """Workload and parameter roles of a ``b2b_gemm`` composite function."""
    values = {b.var: b.value for block in inner.body.blocks for b in block.bindings}
    calls = [v for v in values.values() if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)]
    mms = [c for c in calls if c.op.name == "relax.matmul"]
    adds = [c for c in calls if c.op.name == "relax.add"]
    if len(mms) != 2 or len(adds) != 2:
        raise CutlassCodegenError("malformed b2b_gemm composite")
    roles = {p: ROLE_SCALAR for p in inner.params}
    x = mms[0].args[0]
    w0, w1 = values[mms[0].args[1]].args[0], values[mms[1].args[1]].args[0]
    roles.update({x: ROLE_A, w0: ROLE_B, w1: ROLE_B1, adds[0].args[1]: ROLE_BIAS, adds[1].args[1]: ROLE_BIAS1})
    ann = {"x": x, "w0": w0, "w1": w1, "root": inner.body.body if not isinstance(inner.body.body, relax.Var)
           else values[inner.body.body]}
    return _workload(ann), roles


register_parser("b2b_gemm", b2b_from_composite)
