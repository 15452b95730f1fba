"""One Swin Transformer block written with ``onnx.helper``, after the graph torch exports from Hugging
Face's ``SwinLayer`` (its transformers 4 attention: the bias added, then the shift mask through a
``[B, nW, heads, N, N]`` view). A stand-in of the export's structure for planning tests; its
numerics are not compared against ``SwinLayer`` here.

Graph (window ``w``, shift ``s``; ``torch.roll`` exports as two ``Slice`` and a ``Concat`` per
rolled axis)::

    x         = LayerNorm(hidden)  viewed as [B, H, W, C]
    shifted   = roll(x, (-s, -s), (1, 2))                          Slice, Slice, Concat (x2)
    windows   = Reshape(Transpose(Reshape(shifted, [B, H/w, w, W/w, w, C]), [0,1,3,2,4,5]),
                        [B*nW, w*w, C])                             window partition
    q, k, v   = windows @ Wq + bq, ...                              heads: Reshape + Transpose
    scores    = (q @ k^T) / sqrt(d) + relative position bias        [B*nW, heads, w*w, w*w]
    scores    = Reshape(Reshape(scores, [B, nW, heads, N, N]) + shift mask, [B*nW, heads, N, N])
    context   = Softmax(scores) @ v, heads merged, @ Wo + bo
    reversed  = Reshape(Transpose(Reshape(context, [B, H/w, W/w, w, w, C]), [0,1,3,2,4,5]), [B, H, W, C])
    attn      = roll(reversed, (s, s), (1, 2)) viewed as [B, H*W, C]
    h         = hidden + attn
    output    = h + gelu_erf(LayerNorm(h) @ W1 + b1) @ W2 + b2

The shift mask is HF's: -100 between tokens that the roll brought from different image regions.
With ``shift=0`` the block is Swin's unshifted one (no roll, no mask).
"""
from __future__ import annotations

import math

import numpy as np
import onnx

from ..errors import TvmExtError
from ._onnx_builder import GraphBuilder
from .bert import _gelu_erf, _linear
from .bert import _layer_norm as bert_layer_norm

#: Epsilon of both LayerNormalization nodes (``SwinConfig.layer_norm_eps``).
LAYER_NORM_EPS = 1e-5


def _layer_norm(g: GraphBuilder, x: str, channels: int, name: str) -> str:
    return bert_layer_norm(g, x, channels, name, eps=LAYER_NORM_EPS)


def shift_mask(size: int, window: int, shift: int) -> np.ndarray:
    """HF Swin's attention mask of a shifted block: ``[windows, window**2, window**2]``, 0 where two
    tokens of a window come from the same image region, -100 elsewhere."""
    region = np.zeros((size, size), dtype=np.int64)
    bounds = ((0, size - window), (size - window, size - shift), (size - shift, size))
    label = 0
    for h0, h1 in bounds:
        for w0, w1 in bounds:
            region[h0:h1, w0:w1] = label
            label += 1
    n = size // window
    per_window = region.reshape(n, window, n, window).transpose(0, 2, 1, 3).reshape(n * n, window * window)
    return np.where(per_window[:, :, None] == per_window[:, None, :], 0.0, -100.0)


def _roll(g: GraphBuilder, x: str, shift: int, axes: tuple[int, ...], sizes: tuple[int, ...]) -> str:
    """``torch.roll(x, shift, axes)`` as the exporter writes it: per axis, the last ``shift`` entries
    (``-shift``: all but the first) sliced off and concatenated in front."""
    for axis, size in zip(axes, sizes):
        cut = (size - shift) % size
        if cut == 0:
            continue
        bound = [g.const("roll.index", np.array([v], dtype=np.int64)) for v in (cut, size, 0, axis)]
        tail = g.op("Slice", [x, bound[0], bound[1], bound[3]], "roll_tail")
        head = g.op("Slice", [x, bound[2], bound[0], bound[3]], "roll_head")
        x = g.op("Concat", [tail, head], "rolled", axis=axis)
    return x


def swin_block(size: int = 14, window: int = 7, shift: int = 3, channels: int = 32, heads: int = 2,
               batch: int = 1, dtype: str = "float32", seed: int = 0, *, mlp: bool = True) -> onnx.ModelProto:
    """Build one Swin block on a ``size x size`` token grid (see the module docstring).

    Parameters
    ----------
    size, window, shift : int
        Token grid edge, window edge (dividing ``size``) and shift (0: no roll, no mask).
    channels, heads, batch : int
        Embedding width (divisible by ``heads``), attention heads, images.
    dtype : str
        ``"float32"`` or ``"float16"``.
    seed : int
        Seed of the weight generator.
    mlp : bool
        Include the MLP half (``output = h`` without it).

    Returns
    -------
    onnx.ModelProto
        Input ``hidden_states`` ``[batch, size*size, channels]``, output ``output`` of that shape.
    """
    if size % window or channels % heads or not 0 <= shift < window:
        raise TvmExtError(f"a Swin block needs window | size, heads | channels and 0 <= shift < window; got "
                          f"size={size} window={window} shift={shift} channels={channels} heads={heads}")
    n, tokens, head_dim, grid = size // window, window * window, channels // heads, size * size
    windows = batch * n * n
    g = GraphBuilder("swin_block", seed=seed, dtype=dtype)
    x = g.input("hidden_states", [batch, grid, channels])

    def shape(*dims: int) -> str:
        return g.const("shape", np.array(dims, dtype=np.int64))

    def reshape(t: str, *dims: int) -> str:
        return g.op("Reshape", [t, shape(*dims)], "view")

    normed = reshape(_layer_norm(g, x, channels, "layernorm_before"), batch, size, size, channels)
    rolled = _roll(g, normed, -shift, (1, 2), (size, size)) if shift else normed
    parts = g.op("Transpose", [reshape(rolled, batch, n, window, n, window, channels)], "partition", perm=[0, 1, 3, 2, 4, 5])
    win = reshape(parts, windows, tokens, channels)

    def heads_of(name: str, perm: list[int]) -> str:
        return g.op("Transpose", [reshape(_linear(g, win, channels, channels, name), windows, tokens, heads, head_dim)],
                    f"{name}_heads", perm=perm)

    q, k_t, v = heads_of("query", [0, 2, 1, 3]), heads_of("key", [0, 2, 3, 1]), heads_of("value", [0, 2, 1, 3])
    scores = g.op("Div", [g.op("MatMul", [q, k_t], "scores"), g.float_const("scale", math.sqrt(head_dim))], "scaled")
    scores = g.op("Add", [scores, g.noise("relative_position_bias", (1, heads, tokens, tokens), scale=0.02)], "biased")
    if shift:
        mask = g.float_const("shift_mask", shift_mask(size, window, shift).reshape(1, n * n, 1, tokens, tokens))
        masked = g.op("Add", [reshape(scores, batch, n * n, heads, tokens, tokens), mask], "masked")
        scores = reshape(masked, windows, heads, tokens, tokens)
    context = g.op("MatMul", [g.op("Softmax", [scores], "probs", axis=-1), v], "context")
    merged = reshape(g.op("Transpose", [context], "context_t", perm=[0, 2, 1, 3]), windows, tokens, channels)
    attn = reshape(_linear(g, merged, channels, channels, "attention.output"), batch, n, n, window, window, channels)
    back = reshape(g.op("Transpose", [attn], "reverse", perm=[0, 1, 3, 2, 4, 5]), batch, size, size, channels)
    unrolled = _roll(g, back, shift, (1, 2), (size, size)) if shift else back
    h = g.op("Add", [x, reshape(unrolled, batch, grid, channels)], "residual")
    if mlp:
        inter = _gelu_erf(g, _linear(g, _layer_norm(g, h, channels, "layernorm_after"), channels, 4 * channels,
                                     "mlp.fc1"))
        out = g.op("Add", [h, _linear(g, inter, 4 * channels, channels, "mlp.fc2")], "output")
    else:
        out = g.op("Identity", [h], "output")
    g.output(out, [batch, grid, channels])
    return g.model(f"Swin block: batch={batch} size={size} window={window} shift={shift} channels={channels} "
                   f"heads={heads} dtype={dtype} seed={seed} mlp={mlp}")


__all__ = ["shift_mask", "swin_block"]
