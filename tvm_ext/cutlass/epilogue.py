"""Epilogues fused into CUTLASS kernels: what the pattern matched and how CUTLASS spells it.

An epilogue is ``D = cast(act(acc + source))`` where ``source`` is nothing, a bias vector
broadcast over the rows of the output (length N, the last axis), a residual tensor of the
output's shape, or both (``acc + bias + residual``: ResNet's conv+bias+add+relu, BERT's
dense+bias+residual); ``act`` is one of :data:`ACTIVATIONS` or none; ``cast`` converts to
another output dtype (the operator's own output dtype is the dtype of ``acc + source``). With
both sources the residual may instead be added after the activation, ``act(acc + bias) +
residual`` (YOLO's bottleneck: conv + bias + SiLU, then the shortcut).

CUTLASS spelling: 2.x kernels use ``LinearCombinationGeneric<act>`` (one source tensor C with
``beta = 1``; a bias is C with stride 0) or, for bias + residual, the broadcast epilogue
(``DefaultGemmWithBroadcast`` / ``DefaultConv2dFpropWithBroadcast`` with
``LinearCombinationResidualBlock<..., Identity, plus, act>``: ``act(acc + bias + residual)``
with the bias as the broadcast vector and the residual as C; ``<..., act, plus, Identity>`` for
``act(acc + bias) + residual``). 3.x kernels use the fusion operations ``LinearCombination`` /
``LinCombEltAct`` / ``LinCombPerColBiasEltAct`` (C = residual); they have no residual after the
activation, so that epilogue is 2.x only.
"""
from __future__ import annotations

from dataclasses import dataclass

from tvm.relax.dpl import DFPattern, is_op, wildcard

ACTIVATIONS: tuple[str, ...] = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid", "hardswish")
#: Activations a residual may follow (hardswish's decomposition has adds of its own that the
#: workload reader would take for the residual add).
ACTIVATIONS_BEFORE_RESIDUAL: tuple[str, ...] = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid")
SOURCES: tuple[str, ...] = ("none", "bias", "residual", "bias_residual")
#: The operands each source adds, innermost add first (also the pattern annotation names).
SOURCE_OPERANDS: dict[str, tuple[str, ...]] = {"none": (), "bias": ("bias",), "residual": ("residual",),
                                               "bias_residual": ("bias", "residual")}

#: CUTLASS thread-level activation functors (``cutlass/epilogue/thread/activation.h``).
CUTLASS_ACTIVATION: dict[str | None, str] = {
    None: "cutlass::epilogue::thread::Identity",
    "relu": "cutlass::epilogue::thread::ReLu",
    "gelu": "cutlass::epilogue::thread::GELU",
    "gelu_tanh": "cutlass::epilogue::thread::GELU_taylor",
    "silu": "cutlass::epilogue::thread::SiLu",
    "sigmoid": "cutlass::epilogue::thread::Sigmoid",
    "hardswish": "cutlass::epilogue::thread::HardSwish",
}


@dataclass(frozen=True)
class Epilogue:
    """The element-wise tail fused after a GEMM or convolution.

    Parameters
    ----------
    source : str
        ``"none"``, ``"bias"`` (vector of length N broadcast over rows), ``"residual"`` (tensor
        of the output's shape) or ``"bias_residual"`` (both, added in either order).
    activation : str or None
        One of :data:`ACTIVATIONS`.
    cast : bool
        Whether an ``astype`` follows (the output dtype differs from the operator's).
    residual_after_act : bool
        ``act(acc + bias) + residual`` instead of ``act(acc + bias + residual)`` (``bias_residual``
        with an activation of :data:`ACTIVATIONS_BEFORE_RESIDUAL` only).
    """

    source: str = "none"
    activation: str | None = None
    cast: bool = False
    residual_after_act: bool = False

    def __post_init__(self) -> None:
        if self.cast and self.source != "none":
            raise ValueError("a fused cast needs an epilogue without bias or residual")
        if self.source not in SOURCES:
            raise ValueError(f"epilogue source must be one of {SOURCES}, got {self.source!r}")
        if self.activation is not None and self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS} or None, got {self.activation!r}")
        if self.residual_after_act and (self.source != "bias_residual"
                                        or self.activation not in ACTIVATIONS_BEFORE_RESIDUAL):
            raise ValueError("a residual after the activation needs source 'bias_residual' and one of "
                             f"{ACTIVATIONS_BEFORE_RESIDUAL}, got {self.source!r} / {self.activation!r}")

    @property
    def suffix(self) -> str:
        """Name suffix used in pattern names, e.g. ``"_bias_relu_cast"``, ``"_bias_silu_residual"``
        (a residual after the activation; empty for none)."""
        if self.residual_after_act:
            return f"_bias_{self.activation}_residual"
        parts = [] if self.source == "none" else [self.source]
        if self.activation:
            parts.append(self.activation)
        if self.cast:
            parts.append("cast")
        return "".join("_" + p for p in parts)

    @property
    def length(self) -> int:
        """Number of Relax operators the epilogue spans (for longest-first ordering)."""
        # silu may be matched as x * sigmoid(x): rank it above the one-op sigmoid pattern
        act_len = {None: 0, "hardswish": 4, "silu": 2}.get(self.activation, 1)
        return len(SOURCE_OPERANDS[self.source]) + act_len + int(self.cast)

    @property
    def has_bias(self) -> bool:
        """Whether a bias vector is added."""
        return self.source in ("bias", "bias_residual")

    @property
    def has_residual(self) -> bool:
        """Whether a residual tensor is added."""
        return self.source in ("residual", "bias_residual")

    @property
    def cutlass_activation(self) -> str:
        """The CUTLASS activation functor template name."""
        return CUTLASS_ACTIVATION[self.activation]

    @classmethod
    def parse(cls, suffix: str) -> "Epilogue":
        """Inverse of :attr:`suffix` (``"bias_relu"``, ``"_residual_gelu_tanh_cast"``, ``""``)."""
        text = suffix.strip("_")
        middle = text[len("bias_"):-len("_residual")] if text.startswith("bias_") and text.endswith("_residual") else ""
        if middle in ACTIVATIONS_BEFORE_RESIDUAL:
            return cls("bias_residual", middle, residual_after_act=True)
        cast = text.endswith("cast")
        if cast:
            text = text[: -len("cast")].rstrip("_")
        source = "none"
        for candidate in ("bias_residual", "bias", "residual"):  # longest first
            if text == candidate or text.startswith(candidate + "_"):
                source, text = candidate, text[len(candidate):].lstrip("_")
                break
        activation = text or None
        return cls(source, activation, cast)


def all_epilogues() -> list[Epilogue]:
    """Every epilogue the partitioner offers, longest first.

    A cast is fused only without a bias/residual: the CUTLASS 2.x epilogue reads its source
    in the output element type, so ``cast(act(acc + bias))`` keeps the cast outside.
    """
    eps = [Epilogue(src, act, cast) for cast in (True, False) for src in SOURCES
           for act in ACTIVATIONS + (None,) if not (cast and src != "none")]
    eps += [Epilogue("bias_residual", act, residual_after_act=True) for act in ACTIVATIONS_BEFORE_RESIDUAL]
    return sorted(eps, key=lambda e: -e.length)


def activation_pattern(act: str, x: DFPattern) -> tuple[DFPattern, dict[str, DFPattern]]:
    """DPL pattern applying ``act`` to ``x``; returns it and extra annotations to check.

    SiLU also matches ``x * sigmoid(x)`` and hardswish matches the importers' decomposition
    ``x * (clip(x + 3, 0, 6) / 6)`` (ONNX and PyTorch frontends).
    """
    if act == "relu":
        return is_op("relax.nn.relu")(x), {}
    if act == "gelu":
        return is_op("relax.nn.gelu")(x), {}
    if act == "gelu_tanh":
        return is_op("relax.nn.gelu_tanh")(x), {}
    if act == "sigmoid":
        return is_op("relax.sigmoid")(x), {}
    if act == "silu":
        return is_op("relax.nn.silu")(x) | is_op("relax.multiply")(x, is_op("relax.sigmoid")(x)), {}
    if act == "hardswish":
        three, six = wildcard(), wildcard()
        lo, hi = wildcard(), wildcard()
        clip = is_op("relax.clip")(is_op("relax.add")(x, three), lo, hi)
        pat = is_op("relax.multiply")(x, is_op("relax.divide")(clip, six))
        return pat, {"hs_three": three, "hs_six": six, "hs_lo": lo, "hs_hi": hi}
    raise ValueError(f"unknown activation {act!r}")


def epilogue_pattern(ep: Epilogue, op: DFPattern, swap: bool = False) -> tuple[DFPattern, dict[str, DFPattern]]:
    """Wrap the operator pattern ``op`` with the epilogue; returns root and annotations.

    ``swap`` puts the residual first in a residual-after-activation add: when both operands are
    activations of biased GEMMs/convs (YOLO's ``y + silu(conv(cv1(y)))`` with ``y`` itself a
    conv's SiLU), the first match may pick the operand whose value is used elsewhere, which the
    check rejects; the swapped pattern offers the other assignment."""
    ann: dict[str, DFPattern] = {}
    cur = op
    if ep.residual_after_act:  # add(act(add(op, bias)), residual), the adds' operands in either order
        bias, residual = wildcard(), wildcard()
        cur = is_op("relax.add")(op, bias)
        ann.update(bias=bias, source_add=cur)
        cur, extra = activation_pattern(ep.activation, cur)
        ann.update(extra)
        cur = is_op("relax.add")(residual, cur) if swap else is_op("relax.add")(cur, residual)
        ann.update(residual=residual, residual_add=cur)
        return cur, ann
    # bias_residual: the inner add's operand is annotated "bias", the outer one "residual"; the
    # check and the workload reader tell them apart by shape, so either order of the adds matches
    for i, name in enumerate(SOURCE_OPERANDS[ep.source]):
        operand = wildcard()
        cur = is_op("relax.add")(cur, operand)
        ann[name] = operand
        ann["source_add" if i == 0 else "residual_add"] = cur
    if ep.activation:
        cur, extra = activation_pattern(ep.activation, cur)
        ann.update(extra)
    if ep.cast:
        cur = is_op("relax.astype")(cur)
    return cur, ann
