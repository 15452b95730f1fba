"""Shape variants the seed suite lacks, so that no planning rule is only ever tried on seed shapes.

Each entry builds a small ONNX model (seeded weights, no download): transformer layers with
narrow and wide MLPs, head dimensions that are not 64, sequence lengths that are not powers of
two, an fp16 layer, and convolution blocks with odd sizes. The kernel check
(:func:`tvm_ext.testing.kernel_check.check_planned_kernels`, ``scripts/stitch_kernel_check.py
--variants``) runs on all of them.

Example
-------
>>> sorted(VARIANTS)[:2]
['bert_head128_fp16_s65', 'bert_head48_s50']
>>> model = VARIANTS["vit_narrow_mlp_s77"]()
"""
from __future__ import annotations

from collections.abc import Callable

import onnx

from .bert import bert_layer
from .small import conv_block

#: name -> builder of a small model the seed suite has no shape like.
VARIANTS: dict[str, Callable[[], onnx.ModelProto]] = {
    # pre-LN, MLP 192 wide: layer_norm -> matmul -> add -> GELU runs as one GEMM-with-prologue kernel
    "vit_narrow_mlp_s77": lambda: bert_layer(seq=77, hidden=192, heads=3, intermediate=192, pre_norm=True),
    # pre-LN, 256 wide (the prologue's column cap), fp16
    "vit_mlp256_fp16_s50": lambda: bert_layer(seq=50, hidden=128, heads=2, intermediate=256, dtype="float16",
                                              pre_norm=True),
    "bert_narrow_mlp_s77": lambda: bert_layer(seq=77, hidden=192, heads=3, intermediate=192),
    # a ViT-S-like layer: 197 tokens, MLP four times as wide as the model
    "bert_wide_mlp_s197": lambda: bert_layer(seq=197, hidden=384, heads=6, intermediate=1536),
    "bert_head48_s50": lambda: bert_layer(seq=50, hidden=240, heads=5, intermediate=960),
    "bert_head96_s96": lambda: bert_layer(seq=96, hidden=384, heads=4, intermediate=768),
    "bert_head128_fp16_s65": lambda: bert_layer(seq=65, hidden=256, heads=2, intermediate=512, dtype="float16"),
    "conv_block_odd": lambda: conv_block(image=35, channels=24, num_classes=7),
    "conv_block_wide": lambda: conv_block(batch=2, in_channels=5, image=28, channels=48),
}

__all__ = ["VARIANTS"]
