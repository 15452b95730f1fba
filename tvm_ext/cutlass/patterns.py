"""Relax DPL patterns that offload GEMMs and convolutions (+ epilogues) to CUTLASS.

Pattern names are ``tvm_ext_cutlass.<op><epilogue suffix>``, e.g.
``tvm_ext_cutlass.dense_bias_gelu_tanh`` or ``tvm_ext_cutlass.conv2d_residual_relu_cast``;
the part before the dot is the BYOC codegen name (``relax.ext.tvm_ext_cutlass``).

Operators (all with 16-bit inputs, or float32 inputs on TF32 tensor cores while
:func:`~tvm_ext.cutlass.precision.allow_tf32` is on; fp32 accumulation):

* ``matmul``: ``matmul(A, B)`` with a 2-D ``B[K, N]``; leading axes of ``A`` fold into M;
* ``batch_matmul``: ``matmul(A, B)`` with equal batch axes on both operands;
* ``dense``: ``matmul(A, permute_dims(W))`` with ``W[N, K]`` (a linear layer's weight);
* ``conv2d``: NHWC data, OHWI weight, ``groups == 1``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Iterator

from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard
from tvm.relax.transform import FusionPattern, PatternCheckContext

from . import checks
from .epilogue import Epilogue, all_epilogues, epilogue_pattern

_LOG = logging.getLogger(__name__)

CODEGEN_NAME = "tvm_ext_cutlass"
OP_KINDS: tuple[str, ...] = ("dense", "batch_matmul", "matmul", "conv2d")


@dataclass(frozen=True)
class CompositeName:
    """A parsed composite (pattern) name."""

    op: str
    epilogue: Epilogue

    @property
    def name(self) -> str:
        return f"{CODEGEN_NAME}.{self.op}{self.epilogue.suffix}"

    @classmethod
    def parse(cls, name: str) -> "CompositeName":
        """Parse ``tvm_ext_cutlass.<op><suffix>``; raises ValueError for other names."""
        prefix, _, rest = str(name).partition(".")
        if prefix != CODEGEN_NAME:
            raise ValueError(f"{name!r} is not a {CODEGEN_NAME} composite")
        if rest == "attention":    # the attention core (:mod:`.attention`): no epilogue of its own
            return cls(rest, Epilogue())
        for op in sorted(OP_KINDS + ("b2b_gemm", "b2b_conv2d"), key=len, reverse=True):
            if rest == op or rest.startswith(op + "_"):
                return cls(op, Epilogue.parse(rest[len(op):]))
        raise ValueError(f"unknown operator in composite name {name!r}")


def _op_pattern(op: str) -> tuple[DFPattern, dict[str, DFPattern]]:
    lhs, rhs = wildcard(), wildcard()
    extra: dict[str, DFPattern] = {}
    if op == "dense":
        extra["transpose"] = is_op("relax.permute_dims")(rhs)
        call = is_op("relax.matmul")(lhs, extra["transpose"])
    elif op in ("matmul", "batch_matmul"):
        call = is_op("relax.matmul")(lhs, rhs)
    elif op == "conv2d":
        call = is_op("relax.nn.conv2d")(lhs, rhs)
    else:
        raise ValueError(f"unknown operator kind {op!r}")
    return call, {"lhs": lhs, "rhs": rhs, "op": call, **extra}


def reject_reason(op: str, annotated, matched_expr=None, matched_bindings=None, var_usages=None,
                  ordered: bool = False) -> str | None:
    """Why a match of ``op`` (annotations from :func:`make_pattern`) must stay in the graph
    (``ordered``: see :func:`~tvm_ext.cutlass.checks.epilogue_reject_reason`)."""
    call = annotated["op"]
    if op == "conv2d":
        reason = checks.conv2d_reject_reason(annotated["lhs"], annotated["rhs"], call)
    else:
        reason = checks.gemm_reject_reason(op, annotated["lhs"], annotated["rhs"], call,
                                           annotated.get("transpose"))
    if reason is None:
        reason = checks.epilogue_reject_reason(annotated, call, annotated["root"], ordered)
    if reason is None:
        for source in ("bias", "residual"):
            if source in annotated and any(annotated[source].same_as(annotated[x]) for x in ("lhs", "rhs")):
                reason = f"the {source} is also an operand of the operator"
    if reason is None and matched_bindings is not None:
        leaks = checks.leaking_intermediates(matched_expr, matched_bindings, var_usages)
        if leaks:
            reason = f"intermediate values {leaks} are used outside the fused group"
    return reason


@dataclass
class Rejections:
    """Why operators matched by the bare-operator patterns were rejected, per binding variable.

    Filled while a partition runs (the patterns' checks record into it); an operator another
    pattern took anyway is the reader's to skip.
    """

    reasons: dict = field(default_factory=dict)

    def record(self, var: relax.Var, op: str, reason: str) -> None:
        """Operator kind ``op`` cannot take the call bound to ``var``, because of ``reason``."""
        self.reasons.setdefault(var, {})[op] = reason

    def items(self) -> Iterator[tuple[relax.Var, str]]:
        """``(variable, reason)`` per rejected call; reasons that differ by operator kind are joined."""
        for var, by_op in self.reasons.items():
            distinct = list(dict.fromkeys(by_op.values()))
            yield var, distinct[0] if len(distinct) == 1 else "; ".join(f"as {op}: {r}" for op, r in by_op.items())


def _bound_var(ctx: PatternCheckContext, expr: relax.Expr) -> relax.Var | None:
    return next((var for var, value in ctx.matched_bindings.items() if value.same_as(expr)), None)


def _make_check(op: str, epilogue: Epilogue, name: str,
                rejections: Rejections | None = None) -> Callable[[PatternCheckContext], bool]:
    bare = epilogue == Epilogue()

    def check(ctx: PatternCheckContext) -> bool:
        reason = reject_reason(op, ctx.annotated_expr, ctx.matched_expr, ctx.matched_bindings, ctx.var_usages,
                               ordered=epilogue.residual_after_act)
        if reason is not None:
            _LOG.debug("%s rejected: %s", name, reason)
            var = _bound_var(ctx, ctx.annotated_expr["op"]) if bare and rejections is not None else None
            if var is not None:
                rejections.record(var, op, reason)
        return reason is None

    return check


def make_pattern(op: str, epilogue: Epilogue, swap: bool = False, rejections: Rejections | None = None
                 ) -> FusionPattern:
    """The :class:`FusionPattern` for one operator and epilogue (``swap``: see
    :func:`~tvm_ext.cutlass.epilogue.epilogue_pattern`); the bare operator's pattern records its
    rejections into ``rejections``."""
    call, ann = _op_pattern(op)
    root, ep_ann = epilogue_pattern(epilogue, call, swap)
    ann.update(ep_ann)
    ann["root"] = root
    name = CompositeName(op, epilogue).name
    return FusionPattern(name, root, ann, _make_check(op, epilogue, name, rejections))


def cutlass_patterns(ops: tuple[str, ...] = OP_KINDS, rejections: Rejections | None = None,
                     keep: Callable[[Epilogue], bool] | None = None) -> list[FusionPattern]:
    """All single-operator patterns, longest epilogue first (dense before matmul); a residual
    after the activation in both operand orders. ``rejections`` collects why bare operators were
    not taken (see :class:`Rejections`); ``keep`` limits the epilogues."""
    return [make_pattern(op, ep, swap, rejections) for ep in all_epilogues() if keep is None or keep(ep)
            for op in OP_KINDS if op in ops for swap in ((False, True) if ep.residual_after_act else (False,))]


def partition_for_cutlass(mod, ops: tuple[str, ...] = OP_KINDS, extra_patterns: list[FusionPattern] | None = None):
    """Group every offloadable match into a function with ``Codegen="tvm_ext_cutlass"``.

    Parameters
    ----------
    mod : tvm.IRModule
        Relax module (dataflow blocks; convs already NHWC).
    ops : tuple of str
        Operator kinds to offload.
    extra_patterns : list of FusionPattern, optional
        Tried before the single-operator patterns (back-to-back fusion).
    """
    patterns = list(extra_patterns or []) + cutlass_patterns(ops)
    return relax.transform.FuseOpsByPattern(patterns, bind_constants=False, annotate_codegen=True)(mod)
