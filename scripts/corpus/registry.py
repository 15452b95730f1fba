"""Names of the corpus models, their builders and the variants exported for each."""
from __future__ import annotations

import cnn_models as cnn
import custom_models as custom
import transformers_models as tfm
from spec import ModelSpec, Variant

_B1 = (Variant(1),)


def _spec(name: str, family: str, builder, variants=_B1) -> ModelSpec:
    return ModelSpec(name, family, builder, tuple(variants),
                     (builder.__doc__ or "").strip().splitlines()[0])


#: Every corpus model by name, in build order (small to large within a family).
REGISTRY: dict[str, ModelSpec] = {s.name: s for s in [
    _spec("bert_base", "transformers", tfm.bert_base,
          [Variant(1, 128), Variant(32, 128), Variant(1, 384), Variant(32, 384)]),
    _spec("bert_large", "transformers", tfm.bert_large, [Variant(1, 128), Variant(1, 384)]),
    _spec("gpt2", "transformers", tfm.gpt2, [Variant(1, 128)]),
    _spec("llama4", "transformers", tfm.llama4, [Variant(1, 128)]),
    _spec("vit_b16", "transformers", tfm.vit_b16),
    _spec("swin_t", "transformers", tfm.swin_t),
    _spec("convnext_t", "transformers", tfm.convnext_t),
    _spec("resnet50", "transformers", tfm.resnet50, [Variant(1), Variant(32)]),
    _spec("mobilenet_v2", "transformers", tfm.mobilenet_v2),
    _spec("efficientnet_b0", "transformers", tfm.efficientnet_b0),
    _spec("segformer_b0", "transformers", tfm.segformer_b0),
    _spec("detr_r50", "transformers", tfm.detr_r50),
    _spec("resnext50", "cnn", cnn.resnext50),
    _spec("yolov5s", "cnn", cnn.yolov5s),
    _spec("nafnet", "cnn", cnn.nafnet),
    _spec("nerf_mlp", "custom", custom.nerf_mlp),
    _spec("mmoe", "custom", custom.mmoe),
    _spec("lstm", "custom", custom.lstm, [Variant(1, 32)]),
]}
