"""Small ONNX models for coverage: an MLP, a CNN stem, and single-op models."""
from __future__ import annotations

from collections.abc import Sequence

import onnx

from ..errors import TvmExtError
from ._onnx_builder import GraphBuilder


def _check_positive(**sizes: int) -> None:
    for label, value in sizes.items():
        if int(value) < 1:
            raise TvmExtError(f"{label} must be positive, got {value}")


def mlp(batch: int = 8, sizes: Sequence[int] = (64, 128, 64), seed: int = 0,
        dtype: str = "float32") -> onnx.ModelProto:
    """Multi-layer perceptron: ``Gemm(transB=1)`` per layer, ``Relu`` between layers.

    Parameters
    ----------
    batch : int
        Rows of the input ``x`` (``[batch, sizes[0]]``).
    sizes : sequence of int
        Feature sizes; ``len(sizes) - 1`` layers map ``sizes[i]`` to ``sizes[i + 1]``.
        The last layer has no activation. Weights are stored ``[out, in]`` as torch does.
    seed : int
        Weight seed.
    dtype : str
        ``"float32"`` or ``"float16"``.

    Returns
    -------
    onnx.ModelProto
        Input ``x``, output ``y`` ``[batch, sizes[-1]]``.
    """
    sizes = [int(s) for s in sizes]
    if len(sizes) < 2:
        raise TvmExtError(f"mlp needs at least two sizes (one layer), got {sizes}")
    _check_positive(batch=batch, **{f"sizes[{i}]": s for i, s in enumerate(sizes)})
    g = GraphBuilder("mlp", seed=seed, dtype=dtype)
    h = g.input("x", [batch, sizes[0]])
    n_layers = len(sizes) - 1
    for i, (d_in, d_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        w = g.weight(f"fc{i}.weight", (d_out, d_in), fan_in=d_in)
        b = g.noise(f"fc{i}.bias", (d_out,), scale=0.1)
        last = i == n_layers - 1
        h = g.op("Gemm", [h, w, b], "y" if last else f"fc{i}", transB=1)
        if not last:
            h = g.op("Relu", [h], f"relu{i}")
    g.output(h, [batch, sizes[-1]])
    return g.model(f"MLP sizes={sizes} batch={batch} seed={seed}")


def conv_block(batch: int = 1, in_channels: int = 3, image: int = 32, channels: int = 16,
               num_classes: int = 10, seed: int = 0, dtype: str = "float32") -> onnx.ModelProto:
    """A mini ResNet stem and classifier head.

    ``Conv(7x7, stride 2, pad 3, no bias) -> BatchNormalization -> Relu ->
    MaxPool(3x3, stride 2, pad 1) -> GlobalAveragePool -> Flatten -> Gemm``.

    Parameters
    ----------
    batch, in_channels, image : int
        Input ``x`` is ``[batch, in_channels, image, image]`` (NCHW).
    channels : int
        Output channels of the convolution.
    num_classes : int
        Output features of the final Gemm.
    seed : int
        Weight seed.
    dtype : str
        ``"float32"`` or ``"float16"``.

    Returns
    -------
    onnx.ModelProto
        Input ``x``, output ``logits`` ``[batch, num_classes]``.
    """
    _check_positive(batch=batch, in_channels=in_channels, image=image, channels=channels,
                    num_classes=num_classes)
    g = GraphBuilder("conv_block", seed=seed, dtype=dtype)
    x = g.input("x", [batch, in_channels, image, image])
    w = g.weight("conv1.weight", (channels, in_channels, 7, 7), fan_in=in_channels * 49)
    h = g.op("Conv", [x, w], "conv1", kernel_shape=[7, 7], strides=[2, 2], pads=[3, 3, 3, 3])
    gamma = g.noise("bn1.weight", (channels,), scale=0.1, offset=1.0)
    beta = g.noise("bn1.bias", (channels,), scale=0.1)
    mean = g.noise("bn1.running_mean", (channels,), scale=0.1)
    var = g.float_const("bn1.running_var", 0.5 + g.rng.random(channels))
    h = g.op("BatchNormalization", [h, gamma, beta, mean, var], "bn1", epsilon=1e-5)
    h = g.op("Relu", [h], "relu1")
    h = g.op("MaxPool", [h], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    h = g.op("GlobalAveragePool", [h], "avgpool")
    h = g.op("Flatten", [h], "flatten", axis=1)
    fc_w = g.weight("fc.weight", (num_classes, channels), fan_in=channels)
    fc_b = g.noise("fc.bias", (num_classes,), scale=0.1)
    h = g.op("Gemm", [h, fc_w, fc_b], "logits", transB=1)
    g.output(h, [batch, num_classes])
    return g.model(f"ResNet-style stem: x=[{batch},{in_channels},{image},{image}] "
                   f"channels={channels} classes={num_classes} seed={seed}")


def softmax_model(shape: Sequence[int] = (4, 128), axis: int = -1,
                  dtype: str = "float32") -> onnx.ModelProto:
    """A single ``Softmax`` over ``axis`` of input ``x``; output ``y`` has the same shape."""
    shape = [int(s) for s in shape]
    _check_positive(**{f"shape[{i}]": s for i, s in enumerate(shape)})
    if not -len(shape) <= axis < len(shape):
        raise TvmExtError(f"axis {axis} out of range for rank {len(shape)}")
    g = GraphBuilder("softmax", dtype=dtype)
    y = g.op("Softmax", [g.input("x", shape)], "y", axis=axis)
    g.output(y, shape)
    return g.model(f"Softmax over axis {axis} of {shape}")


def layernorm_model(shape: Sequence[int] = (4, 128, 256), epsilon: float = 1e-5, seed: int = 0,
                    dtype: str = "float32") -> onnx.ModelProto:
    """A single ``LayerNormalization`` (opset 17) over the last axis with random scale/shift."""
    shape = [int(s) for s in shape]
    _check_positive(**{f"shape[{i}]": s for i, s in enumerate(shape)})
    g = GraphBuilder("layernorm", seed=seed, dtype=dtype)
    x = g.input("x", shape)
    gamma = g.noise("ln.weight", (shape[-1],), scale=0.1, offset=1.0)
    beta = g.noise("ln.bias", (shape[-1],), scale=0.1)
    y = g.op("LayerNormalization", [x, gamma, beta], "y", axis=-1, epsilon=float(epsilon))
    g.output(y, shape)
    return g.model(f"LayerNormalization of {shape}, epsilon={epsilon}")


__all__ = ["mlp", "conv_block", "softmax_model", "layernorm_model"]
