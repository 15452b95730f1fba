"""Bundled demo models, built with ``onnx.helper`` from seeded random weights.

``BUNDLED`` maps a model name to its builder; ``get_model(name, **kwargs)`` calls it.
The default BERT layer is also shipped as a file, :data:`BUNDLED_FILE`
(regenerate it with :func:`write_bundled`).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx

from ..errors import TvmExtError
from .bert import bert_layer
from .small import conv_block, layernorm_model, mlp, softmax_model
from .variants import VARIANTS

#: Builders of every bundled model, by name. Each returns a checked ``onnx.ModelProto``.
BUNDLED: dict[str, Callable[..., onnx.ModelProto]] = {
    "bert_layer": bert_layer,
    "mlp": mlp,
    "conv_block": conv_block,
    "softmax": softmax_model,
    "layernorm": layernorm_model,
}

#: The shipped default model: ``bert_layer()`` (batch 1, seq 128, hidden 256, fp32, seed 0).
BUNDLED_FILE = Path(__file__).with_name("bert_layer.onnx")


def get_model(name: str, **kwargs) -> onnx.ModelProto:
    """Build the bundled model ``name`` with builder keyword arguments ``kwargs``.

    Raises
    ------
    TvmExtError
        If ``name`` is not in :data:`BUNDLED`; the message lists the known names.
    """
    try:
        builder = BUNDLED[name]
    except KeyError:
        raise TvmExtError(
            f"unknown bundled model {name!r}; known models: {', '.join(sorted(BUNDLED))}"
        ) from None
    return builder(**kwargs)


def write_bundled(path: str | Path | None = None) -> Path:
    """Write the default ``bert_layer()`` model to ``path`` (default :data:`BUNDLED_FILE`).

    The bytes depend only on the builder (fixed seed), so re-running gives the same file.
    """
    target = Path(path) if path is not None else BUNDLED_FILE
    target.write_bytes(bert_layer().SerializeToString(deterministic=True))
    return target


__all__ = [
    "BUNDLED", "BUNDLED_FILE", "VARIANTS", "get_model", "write_bundled",
    "bert_layer", "mlp", "conv_block", "softmax_model", "layernorm_model",
]
