"""The attention core as one CUTLASS kernel: ``softmax(Q K^T * scale + bias) V`` (Bolt's library path).

CUTLASS's fused multi-head attention (``examples/41_fused_multi_head_attention``, the
memory-efficient kernel xformers and PyTorch ship) computes a block of queries against all keys
in one threadblock with an online softmax, so neither the score matrix nor the probabilities
reach global memory. It reads Q, K, V as ``[batch, rows, heads, head_dim]`` with runtime strides
for rows, heads and batches and writes ``[batch, queries, heads, head_dim_v]``: exactly the
layout the projections of a transformer produce before their ``reshape`` / ``permute_dims``.

The pattern (:func:`attention_patterns`) matches, as ONNX exports of BERT, ViT, GPT-2 and Llama
write it::

    s = matmul(Q', permute_dims(K))        Q' = permute_dims(q, [0, 2, 1, 3]) or q [B, H, M, D]
    s = s * scale  (or s / c)              a scalar constant (optional)
    s = s + bias                           broadcastable to [B, H, M, N] (optional)
    p = softmax(s, axis=-1)  (+ casts to the same dtype)
    o = permute_dims(matmul(p, V'), [0, 2, 1, 3])

A constant bias that is a causal mask (0 on and below the diagonal, <= -1e4 above) becomes the
kernel's causal masking, which also skips the masked key blocks; a constant bias of zeros (DETR's
empty key-padding mask) is dropped; any other constant bias stays with TVM. The match is partitioned with its constants bound (:data:`BIND_CONSTANTS`), so the
scale and a causal mask are read from the composite function itself.

Limits (else the core stays with TVM, with the reason): 16-bit inputs, head dims multiples of 8
up to 128 (the register-resident kernels), rank-4 operands whose head dim is contiguous, no
broadcast between Q, K and V.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard
from tvm.relax.transform import FusionPattern, PatternCheckContext

from . import checks
from .config import API_2X, KernelConfig
from .epilogue import Epilogue
from .errors import CutlassCodegenError
from .patterns import CODEGEN_NAME, CompositeName
from .workload import ROLE_BIAS, ROLE_K, ROLE_Q, ROLE_SCALAR, ROLE_V, register_parser

ATTENTION = "attention"
ATTENTION_NAME = f"{CODEGEN_NAME}.{ATTENTION}"
#: Largest head dim of the register-resident kernels (``kMaxK``).
MAX_HEAD_DIM = 128
#: A mask entry at or below this is masked out (exp underflows to 0 in float32 after the max).
MASKED = -1.0e4
#: Partition the attention core with its constants bound (scale, causal mask).
BIND_CONSTANTS = True
_PERMUTE, _MATMUL = "relax.permute_dims", "relax.matmul"
_OUT_AXES = (0, 2, 1, 3)


@dataclass(frozen=True)
class Operand:
    """How a logical ``[B, H, rows, D]`` operand lies in its contiguous tensor.

    ``axes[i]`` is the tensor axis of logical axis ``i`` (D must be the last one)."""

    shape: tuple[int, ...]
    axes: tuple[int, int, int, int]

    @property
    def logical(self) -> tuple[int, int, int, int]:
        """``(B, H, rows, D)``."""
        return tuple(self.shape[a] for a in self.axes)  # type: ignore[return-value]

    def strides(self) -> tuple[int, int, int]:
        """Element strides of batch, head and row."""
        contiguous = [math.prod(self.shape[i + 1:]) for i in range(len(self.shape))]
        return contiguous[self.axes[0]], contiguous[self.axes[1]], contiguous[self.axes[2]]

    def to_logical(self, data: np.ndarray) -> np.ndarray:
        """``data`` (this tensor) viewed as ``[B, H, rows, D]``."""
        return np.transpose(data.reshape(self.shape), self.axes)


@dataclass(frozen=True)
class AttentionWorkload:
    """``O[B, M, H, Dv] = softmax(Q K^T * scale + bias) V`` per batch entry and head."""

    q: Operand
    k: Operand
    v: Operand
    dtype: str
    scale: float
    causal: bool = False
    bias_shape: tuple[int, ...] = ()

    op = ATTENTION
    kind = ATTENTION

    @property
    def batch_heads(self) -> tuple[int, int]:
        return self.q.logical[0], self.q.logical[1]

    @property
    def m(self) -> int:
        return self.q.logical[2]

    @property
    def n(self) -> int:
        return self.k.logical[2]

    @property
    def d(self) -> int:
        return self.q.logical[3]

    @property
    def dv(self) -> int:
        return self.v.logical[3]

    @property
    def batch(self) -> int:
        """Independent problems of one launch: batch entries x heads."""
        b, h = self.batch_heads
        return b * h

    @property
    def out_dtype(self) -> str:
        return self.dtype

    @property
    def final_dtype(self) -> str:
        return self.dtype

    @property
    def epilogue(self) -> Epilogue:
        return Epilogue("bias") if self.bias_shape else Epilogue()

    @property
    def gemm_mnk(self) -> tuple[int, int, int]:
        """M, N, K of the first product (Q K^T) per batch entry and head."""
        return self.m, self.n, self.d

    @property
    def pairs(self) -> int:
        """(query, key) pairs computed per batch entry and head (causal: on and below the diagonal)."""
        if not self.causal:
            return self.m * self.n
        return sum(min(i + 1, self.n) for i in range(self.m))

    @property
    def flops(self) -> int:
        """Both products."""
        return 2 * self.batch * self.pairs * (self.d + self.dv)

    @property
    def max_alignment(self) -> tuple[int, int, int]:
        vec = 128 // tvm.DataType(self.dtype).bits
        return vec, vec, vec

    def bias_strides(self) -> tuple[int, int, int]:
        """Element strides of the bias's batch, head and query axes (0 where it broadcasts)."""
        shape = (1,) * (4 - len(self.bias_shape)) + tuple(self.bias_shape)
        contiguous = [math.prod(shape[i + 1:]) for i in range(4)]
        return tuple(0 if shape[i] == 1 else contiguous[i] for i in range(3))  # type: ignore[return-value]

    def key(self) -> str:
        b, h = self.batch_heads
        mask = "_causal" if self.causal else ("_bias" if self.bias_shape else "")
        return f"attention_b{b}_h{h}_m{self.m}_n{self.n}_d{self.d}_dv{self.dv}{mask}"


# ---- the core, from a matched expression or a composite function ---------------------------------


def _axes(call: relax.Call, rank: int) -> tuple[int, ...]:
    axes = call.attrs.axes
    return tuple(range(rank))[::-1] if axes is None else tuple(int(a) for a in axes)


@dataclass(frozen=True)
class Core:
    """What :func:`analyze` found: the operand expressions and what the workload needs."""

    q: relax.Expr
    k: relax.Expr
    v: relax.Expr
    bias: relax.Expr | None
    workload: AttentionWorkload
    #: The two products (Q K^T, P V) as the expressions that name them.
    products: tuple = ()


def _operand(expr, lookup, transposed: bool) -> tuple[relax.Expr, Operand] | str:
    """The tensor behind a product's operand and its layout (``transposed``: the operand is K^T)."""
    value = lookup(expr)
    shape = checks.static_shape(expr)
    if shape is None or len(shape) != 4:
        return "attention operands must be rank-4 tensors of static shape"
    if checks.is_op_call(value, _PERMUTE):
        inner = value.args[0]
        ishape = checks.static_shape(inner)
        if ishape is None or len(ishape) != 4:
            return "attention operands must be rank-4 tensors of static shape"
        p = _axes(value, 4)
        tensor, axes = inner, ((p[0], p[1], p[3], p[2]) if transposed else p)
    elif transposed:
        return "K^T is not a permute_dims of K (the kernel reads K with its head dim contiguous)"
    else:
        tensor, ishape, axes = expr, shape, (0, 1, 2, 3)
    if axes[3] != 3:
        return "an operand's head dim is not its contiguous axis"
    return tensor, Operand(tuple(ishape), tuple(axes))


def _scale_of(call, lookup) -> tuple[float, relax.Expr] | str | None:
    """``(scale, scores)`` of ``scores * c`` / ``c * scores`` / ``scores / c``; None if ``call`` is no such op."""
    for name, invert in (("relax.multiply", False), ("relax.divide", True)):
        if checks.is_op_call(call, name):
            lhs, rhs = call.args
            orders = ((lhs, rhs),) if invert else ((lhs, rhs), (rhs, lhs))   # c / scores is no scale
            for scores, const in orders:
                c = checks.scalar_value(lookup(const))
                if c is not None and checks.is_op_call(lookup(scores), _MATMUL):
                    return (1.0 / c if invert else c), scores
            return "the scores are scaled by a value that is not a scalar constant"
    return None


def _causal(bias: np.ndarray, m: int, n: int) -> bool:
    """Whether constant ``bias`` (broadcast to [.., m, n]) is a top-left causal mask."""
    if bias.ndim < 2 or any(d != 1 for d in bias.shape[:-2]) or bias.shape[-2:] != (m, n) or m != n:
        return False
    values = bias.reshape(m, n).astype(np.float64)
    upper = np.triu(np.ones((m, n), dtype=bool), k=1)
    return bool(np.all(values[~upper] == 0.0) and np.all(values[upper] <= MASKED))


def analyze(root: relax.Expr, lookup: Callable[[relax.Expr], relax.Expr]) -> Core | str:
    """The attention core ending in ``root`` (``lookup`` resolves a variable to its bound value,
    or returns it), or why the kernel cannot compute it."""
    if not checks.is_op_call(root, _PERMUTE) or _axes(root, 4) != _OUT_AXES:
        return "the output is not permuted [0, 2, 1, 3] (the kernel writes [B, M, H, Dv])"
    pv = lookup(root.args[0])
    if not checks.is_op_call(pv, _MATMUL):
        return "no P @ V product"
    probs = lookup(pv.args[0])
    dtype = checks.dtype_of(pv)
    while checks.is_op_call(probs, "relax.astype"):
        if checks.dtype_of(probs) != checks.dtype_of(probs.args[0]):
            return "a cast between the softmax and P @ V changes the dtype"
        probs = lookup(probs.args[0])
    if not checks.is_op_call(probs, "relax.nn.softmax") or int(probs.attrs.axis) not in (-1, 3):
        return "no softmax over the keys"
    x, bias = probs.args[0], None
    if checks.is_op_call(lookup(x), "relax.add"):
        lhs, rhs = lookup(x).args
        chain_first = checks.is_op_call(lookup(lhs), _MATMUL) or _scale_of(lookup(lhs), lookup) is not None
        x, bias = (lhs, rhs) if chain_first else (rhs, lhs)
    x_expr, x = x, lookup(x)
    scale = 1.0
    scaled = _scale_of(x, lookup)
    if isinstance(scaled, str):
        return scaled
    scores = x_expr
    if scaled is not None:
        scale, scores = scaled[0], scaled[1]
        x = lookup(scores)
    if not checks.is_op_call(x, _MATMUL):
        return "no Q @ K^T product"
    parts = [_operand(x.args[0], lookup, False), _operand(x.args[1], lookup, True), _operand(pv.args[1], lookup, False)]
    for part in parts:
        if isinstance(part, str):
            return part
    (q, qo), (k, ko), (v, vo) = parts
    folded = [role for role, e in ((ROLE_Q, q), (ROLE_K, k), (ROLE_V, v)) if isinstance(lookup(e), tvm.ir.Constant)]
    if folded:      # DETR's first decoder layer: its queries are constants the import folded
        return f"the {'/'.join(folded)} operands are constants (the kernel reads them as call arguments)"
    reason = _shape_reason(qo, ko, vo, dtype, [checks.dtype_of(e) for e in (q, k, v)])
    if reason:
        return reason
    b, h, m, _ = qo.logical
    n = ko.logical[2]
    causal, bias_shape = False, ()
    if bias is not None:
        value = lookup(bias)
        shape = checks.static_shape(bias)
        if shape is None or checks.dtype_of(bias) != dtype or len(shape) > 4 or shape[-1] != n or any(
                s not in (1, full) for s, full in zip(shape[::-1], (n, m, h, b))):
            return f"the bias {shape} {checks.dtype_of(bias)} is not a {dtype} tensor broadcastable to {(b, h, m, n)}"
        if isinstance(value, tvm.ir.Constant):
            data = value.value.numpy()
            if data.any() and not _causal(data, m, n):
                return "a constant bias that is not a causal mask"
            causal, bias = bool(data.any()), None   # zeros (DETR's empty padding mask) add nothing
        else:
            bias_shape = tuple(shape)
    wl = AttentionWorkload(qo, ko, vo, dtype, float(scale), causal, bias_shape)
    vec = wl.max_alignment[0]
    if bias_shape and n % vec:   # also a broadcast row: the last vector would read past its end
        return f"bias rows of {n} elements are not {vec}-element aligned (the kernel loads them in vectors)"
    return Core(q, k, v, bias, wl, (scores, root.args[0]))


def _shape_reason(q: Operand, k: Operand, v: Operand, dtype: str, dtypes: list[str]) -> str | None:
    if dtype not in ("float16", "bfloat16") or any(d != dtype for d in dtypes):
        return f"attention in {dtypes} -> {dtype} (the kernel takes float16 or bfloat16 throughout)"
    (b, h, _, d), (kb, kh, n, kd), (vb, vh, vn, dv) = q.logical, k.logical, v.logical
    if (kb, kh, kd) != (b, h, d) or (vb, vh, vn) != (b, h, n):
        return f"Q {q.logical}, K {k.logical}, V {v.logical} broadcast or disagree"
    vec = 128 // tvm.DataType(dtype).bits
    if d % vec or dv % vec or max(d, dv) > MAX_HEAD_DIM:
        return f"head dims {d}/{dv}: the kernels take multiples of {vec} up to {MAX_HEAD_DIM}"
    return None


# ---- pattern, check, parser ------------------------------------------------------------------------

def attention_pattern():
    """DPL root and annotations of the attention core (optional parts as alternatives)."""
    q, k, v, const, bias = wildcard(), wildcard(), wildcard(), wildcard(), wildcard()
    scores = is_op(_MATMUL)(is_op(_PERMUTE)(q) | q, is_op(_PERMUTE)(k))
    scaled = (is_op("relax.multiply")(scores, const) | is_op("relax.multiply")(const, scores)
              | is_op("relax.divide")(scores, const) | scores)
    biased = is_op("relax.add")(scaled, bias) | is_op("relax.add")(bias, scaled) | scaled
    probs = is_op("relax.nn.softmax")(biased)
    cast1 = is_op("relax.astype")(probs) | probs
    cast2 = is_op("relax.astype")(cast1) | cast1
    root = is_op(_PERMUTE)(is_op(_MATMUL)(cast2, is_op(_PERMUTE)(v) | v))
    return root, {"root": root}


def match_reason(ctx: PatternCheckContext) -> str | None:
    """Why a match of :func:`attention_pattern` must stay with TVM (None if the kernel takes it)."""
    bindings = ctx.matched_bindings
    core = analyze(ctx.matched_expr, lambda e: bindings.get(e, e) if isinstance(e, relax.Var) else e)
    if isinstance(core, str):
        return core
    leaks = checks.leaking_intermediates(ctx.matched_expr, bindings, ctx.var_usages)
    return f"intermediate values {leaks} are used outside the attention core" if leaks else None


def attention_patterns(rejections: list | None = None) -> list[FusionPattern]:
    """The attention FusionPattern (its check appends ``(matched variables, reason)`` of each
    refusal to ``rejections``)."""
    root, ann = attention_pattern()

    def check(ctx: PatternCheckContext) -> bool:
        reason = match_reason(ctx)
        if reason is not None and rejections is not None:
            rejections.append((list(ctx.matched_bindings.keys()), reason))
        return reason is None

    return [FusionPattern(ATTENTION_NAME, root, ann, check)]


def partition_attention(mod: tvm.IRModule, rejections: list | None = None) -> tvm.IRModule:
    """Group every attention core the kernel takes into a ``Codegen="tvm_ext_cutlass"`` function
    (constants bound: the scale and a causal mask live in the composite)."""
    return relax.transform.FuseOpsByPattern(attention_patterns(rejections), bind_constants=BIND_CONSTANTS,
                                            annotate_codegen=True)(mod)


def attention_products(func: relax.Function) -> set:
    """Variables of the two products of every attention core in ``func`` the kernel takes (GEMM
    padding leaves them alone: the fused kernel takes any number of queries and keys)."""
    values = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    lookup: Callable = lambda e: values.get(e, e) if isinstance(e, relax.Var) else e  # noqa: E731
    out: set = set()
    for value in values.values():
        if checks.is_op_call(value, _PERMUTE):
            core = analyze(value, lookup)
            if isinstance(core, Core):
                out.update(core.products)
    return out


def _from_composite(comp: CompositeName, inner: relax.Function) -> tuple[AttentionWorkload, dict]:
    """Workload and parameter roles of an ``attention`` composite function."""
    values = {b.var: b.value for block in inner.body.blocks for b in block.bindings}
    body = inner.body.body
    core = analyze(values.get(body, body), lambda e: values.get(e, e) if isinstance(e, relax.Var) else e)
    if isinstance(core, str):
        raise CutlassCodegenError(f"composite {comp.name}: {core}")
    roles = {p: ROLE_SCALAR for p in inner.params}
    for expr, role in ((core.q, ROLE_Q), (core.k, ROLE_K), (core.v, ROLE_V), (core.bias, ROLE_BIAS)):
        if expr is None:
            continue
        if expr not in roles:
            raise CutlassCodegenError(f"composite {comp.name}: the {role} operand is not a parameter")
        roles[expr] = role
    return core.workload, roles


def attention_configs(wl: AttentionWorkload) -> list[KernelConfig]:
    """Register-resident kernel shapes for the head dim: ``(queries, keys, max head dim)`` per
    threadblock, as xformers builds them for sm_80 (64 x 64 up to 64, 64 x 128 up to 128)."""
    vec = wl.max_alignment
    shapes = [(64, 64, 64), (64, 128, 128)] if max(wl.d, wl.dv) <= 64 else [(64, 128, 128)]
    return [KernelConfig(API_2X, shape, (shape[0] * shape[1] // 1024, 1, 1), (16, 8, 16), 2, swizzle=1,
                         alignment=vec) for shape in shapes]


register_parser(ATTENTION, _from_composite)

__all__ = ["ATTENTION", "ATTENTION_NAME", "AttentionWorkload", "Core", "Operand", "ROLE_K", "ROLE_Q", "ROLE_V",
           "analyze", "attention_configs", "attention_patterns", "attention_products", "partition_attention"]
