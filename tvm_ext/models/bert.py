"""One BERT encoder layer written with ``onnx.helper``, node for node as torch exports it.

Graph (post-LN BERT, as in ``transformers.BertLayer``)::

    q, k, v   = x @ Wq + bq, x @ Wk + bk, x @ Wv + bv           MatMul + Add
    heads     = Transpose(Reshape(q, [0, 0, H, D]), [0, 2, 1, 3])  (k: perm [0, 2, 3, 1])
    scores    = (q @ k^T) / sqrt(D) (+ attention_mask)             MatMul, Div, Add
    context   = Softmax(scores, -1) @ v                             Softmax, MatMul
    merged    = Reshape(Transpose(context, [0, 2, 1, 3]), [0, 0, hidden])
    h1        = LayerNorm(merged @ Wo + bo + x)
    ffn       = gelu_erf(h1 @ W1 + b1) @ W2 + b2                    Div, Erf, Add, Mul, Mul
    output    = LayerNorm(ffn + h1)

Reshapes use ``0`` ("copy this dimension") so the same graph also works with symbolic
batch and sequence dimensions (``dynamic=True``).
"""
from __future__ import annotations

import math

import numpy as np
import onnx

from ..errors import TvmExtError
from ._onnx_builder import GraphBuilder

#: Epsilon of both LayerNormalization nodes (BERT's value).
LAYER_NORM_EPS = 1e-12


def _linear(g: GraphBuilder, x: str, d_in: int, d_out: int, name: str) -> str:
    """``x @ W + b`` as torch exports ``nn.Linear`` (MatMul then Add)."""
    w = g.weight(f"{name}.weight", (d_in, d_out), fan_in=d_in)
    b = g.noise(f"{name}.bias", (d_out,), scale=0.02)
    return g.op("Add", [g.op("MatMul", [x, w], f"{name}_matmul"), b], f"{name}_out")


def _layer_norm(g: GraphBuilder, x: str, hidden: int, name: str, out: str | None = None,
                eps: float = LAYER_NORM_EPS) -> str:
    gamma = g.noise(f"{name}.weight", (hidden,), scale=0.1, offset=1.0)
    beta = g.noise(f"{name}.bias", (hidden,), scale=0.1)
    return g.op("LayerNormalization", [x, gamma, beta], out or f"{name}_out", axis=-1, epsilon=eps)


def _gelu_erf(g: GraphBuilder, x: str) -> str:
    """``x * 0.5 * (1 + erf(x / sqrt(2)))`` in torch's export order."""
    scaled = g.op("Div", [x, g.float_const("gelu.sqrt2", math.sqrt(2.0))], "gelu_div")
    erf = g.op("Erf", [scaled], "gelu_erf")
    shifted = g.op("Add", [erf, g.float_const("gelu.one", 1.0)], "gelu_add")
    prod = g.op("Mul", [x, shifted], "gelu_mul")
    return g.op("Mul", [prod, g.float_const("gelu.half", 0.5)], "gelu_out")


def bert_layer(
    batch: int = 1,
    seq: int = 128,
    hidden: int = 256,
    heads: int = 4,
    intermediate: int = 1024,
    dtype: str = "float32",
    seed: int = 0,
    *,
    attention_mask: bool = True,
    dynamic: bool = False,
    pre_norm: bool = False,
) -> onnx.ModelProto:
    """Build one BERT encoder layer.

    Parameters
    ----------
    batch, seq, hidden, heads, intermediate : int
        Sizes; ``hidden`` must be divisible by ``heads``.
    dtype : str
        ``"float32"`` or ``"float16"`` for inputs, weights and output.
    seed : int
        Seed of the weight generator (same seed, same weights).
    attention_mask : bool
        Add a float input ``attention_mask`` of shape ``[batch, 1, 1, seq]`` that is
        added to the attention scores before the softmax (0 keeps, large negative masks).
    dynamic : bool
        Declare batch and sequence as symbolic dims ``"batch"`` and ``"seq"``.
    pre_norm : bool
        A pre-LN layer (ViT, GPT-2): ``x1 = x + attention(LayerNorm(x))``,
        ``output = x1 + mlp(LayerNorm(x1))``, where each layer norm feeds only its sublayer.

    Returns
    -------
    onnx.ModelProto
        Inputs ``hidden_states`` ``[batch, seq, hidden]`` (and ``attention_mask``),
        output ``output`` ``[batch, seq, hidden]``.
    """
    if hidden % heads != 0:
        raise TvmExtError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    for label, value in (("batch", batch), ("seq", seq), ("hidden", hidden),
                         ("heads", heads), ("intermediate", intermediate)):
        if value < 1:
            raise TvmExtError(f"{label} must be positive, got {value}")
    head_dim = hidden // heads
    b_dim: int | str = "batch" if dynamic else batch
    s_dim: int | str = "seq" if dynamic else seq

    g = GraphBuilder("bert_layer", seed=seed, dtype=dtype)
    x = g.input("hidden_states", [b_dim, s_dim, hidden])
    mask = g.input("attention_mask", [b_dim, 1, 1, s_dim]) if attention_mask else None

    split_shape = g.const("attention.split_heads_shape",
                          np.array([0, 0, heads, head_dim], dtype=np.int64))
    merge_shape = g.const("attention.merge_heads_shape", np.array([0, 0, hidden], dtype=np.int64))

    def heads_of(t: str, name: str, perm: list[int]) -> str:
        return g.op("Transpose", [g.op("Reshape", [t, split_shape], f"{name}_split")],
                    f"{name}_heads", perm=perm)

    src = _layer_norm(g, x, hidden, "attention.LayerNorm") if pre_norm else x
    q = heads_of(_linear(g, src, hidden, hidden, "attention.query"), "query", [0, 2, 1, 3])
    k_t = heads_of(_linear(g, src, hidden, hidden, "attention.key"), "key", [0, 2, 3, 1])
    v = heads_of(_linear(g, src, hidden, hidden, "attention.value"), "value", [0, 2, 1, 3])

    scores = g.op("MatMul", [q, k_t], "attention_scores")
    scores = g.op("Div", [scores, g.float_const("attention.scale", math.sqrt(head_dim))],
                  "attention_scaled")
    if mask is not None:
        scores = g.op("Add", [scores, mask], "attention_masked")
    probs = g.op("Softmax", [scores], "attention_probs", axis=-1)
    context = g.op("MatMul", [probs, v], "context")
    context = g.op("Transpose", [context], "context_transposed", perm=[0, 2, 1, 3])
    context = g.op("Reshape", [context, merge_shape], "context_merged")

    attn_out = _linear(g, context, hidden, hidden, "attention.output.dense")
    attn_out = g.op("Add", [attn_out, x], "attention_residual")
    if pre_norm:
        h1, mlp_in = attn_out, _layer_norm(g, attn_out, hidden, "output.LayerNorm")
    else:
        h1 = mlp_in = _layer_norm(g, attn_out, hidden, "attention.output.LayerNorm")

    inter = _gelu_erf(g, _linear(g, mlp_in, hidden, intermediate, "intermediate.dense"))
    ffn = _linear(g, inter, intermediate, hidden, "output.dense")
    if pre_norm:
        out = g.op("Add", [ffn, h1], "output")
    else:
        ffn = g.op("Add", [ffn, h1], "output_residual")
        out = _layer_norm(g, ffn, hidden, "output.LayerNorm", out="output")
    g.output(out, [b_dim, s_dim, hidden])
    return g.model(
        f"BERT encoder layer: batch={b_dim} seq={s_dim} hidden={hidden} heads={heads} "
        f"intermediate={intermediate} dtype={dtype} seed={seed} mask={attention_mask}"
        + (" pre_norm=True" if pre_norm else "")
    )
