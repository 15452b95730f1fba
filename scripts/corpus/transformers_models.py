"""Corpus models built from ``transformers`` configs (random init, never from a hub).

Every model uses eager attention (plain MatMul/Softmax in the ONNX graph) and no KV
cache. Decoder LMs (GPT-2, Llama) get a fixed all-ones padding mask, so the exported
causal mask folds to a constant (without one, ``transformers`` traces a packed-sequence
check through ``aten::diff``, which the ONNX exporter cannot export). Classification models keep their 1000-class heads; language models keep their
LM heads.
"""
from __future__ import annotations

import transformers as hf
from torch import nn

from init_weights import fan_in_init
from spec import Built, IntRange, OutputSelect, Variant, seeded_ids, seeded_randn

_EAGER = {"attn_implementation": "eager"}


def _init(model: nn.Module, gain: float = 1.0) -> nn.Module:
    return fan_in_init(model.eval(), seed=0, gain=gain)


def _bert(v: Variant, *, hidden: int, layers: int, heads: int) -> Built:
    cfg = hf.BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=4 * hidden, max_position_embeddings=512, **_EAGER)
    model = _init(hf.BertModel(cfg, add_pooling_layer=False))
    names = ["input_ids", "attention_mask"]
    ids = seeded_ids(v.batch, v.seq, cfg.vocab_size)
    mask = ids.new_ones(ids.shape)
    return Built(OutputSelect(model, names, ["last_hidden_state"]),
                 {"input_ids": ids, "attention_mask": mask}, ["last_hidden_state"],
                 int_ranges={"input_ids": IntRange(0, cfg.vocab_size),
                             "attention_mask": IntRange(1, 2)})


def bert_base(v: Variant) -> Built:
    """BERT-base encoder (12 layers, hidden 768, 12 heads), no pooler."""
    return _bert(v, hidden=768, layers=12, heads=12)


def bert_large(v: Variant) -> Built:
    """BERT-large encoder (24 layers, hidden 1024, 16 heads), no pooler."""
    return _bert(v, hidden=1024, layers=24, heads=16)


def gpt2(v: Variant) -> Built:
    """GPT-2 small (12 layers, hidden 768) with its tied LM head; logits out."""
    cfg = hf.GPT2Config(use_cache=False, **_EAGER)
    model = _init(hf.GPT2LMHeadModel(cfg))
    ids = seeded_ids(v.batch, v.seq, cfg.vocab_size)
    return Built(OutputSelect(model, ["input_ids"], ["logits"], use_cache=False,
                              attention_mask=ids.new_ones(ids.shape)),
                 {"input_ids": ids}, ["logits"],
                 int_ranges={"input_ids": IntRange(0, cfg.vocab_size)})


def llama4(v: Variant) -> Built:
    """A 4-layer Llama with TinyLlama-1.1B dimensions: GQA (32 q / 4 kv heads), RMSNorm,
    RoPE, SwiGLU MLP (2048 -> 5632), untied LM head over 32000 tokens."""
    cfg = hf.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=4,
                         num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                         max_position_embeddings=2048, tie_word_embeddings=False,
                         use_cache=False, **_EAGER)
    model = _init(hf.LlamaForCausalLM(cfg))
    ids = seeded_ids(v.batch, v.seq, cfg.vocab_size)
    return Built(OutputSelect(model, ["input_ids"], ["logits"], use_cache=False,
                              attention_mask=ids.new_ones(ids.shape)),
                 {"input_ids": ids}, ["logits"],
                 int_ranges={"input_ids": IntRange(0, cfg.vocab_size)})


def _image(model: nn.Module, v: Variant, size: int, field: str = "logits") -> Built:
    pixels = seeded_randn(v.batch, 3, size, size)
    return Built(OutputSelect(model, ["pixel_values"], [field]), {"pixel_values": pixels},
                 [field])


def vit_b16(v: Variant) -> Built:
    """ViT-B/16 at 224x224 with a 1000-class head."""
    cfg = hf.ViTConfig(num_labels=1000, **_EAGER)
    return _image(_init(hf.ViTForImageClassification(cfg)), v, 224)


def swin_t(v: Variant) -> Built:
    """Swin-T (embed 96, depths 2-2-6-2, window 7) at 224x224 with a 1000-class head."""
    cfg = hf.SwinConfig(num_labels=1000, **_EAGER)
    return _image(_init(hf.SwinForImageClassification(cfg)), v, 224)


def convnext_t(v: Variant) -> Built:
    """ConvNeXt-T (96-192-384-768, depths 3-3-9-3) at 224x224; layer scales start at 1."""
    cfg = hf.ConvNextConfig(num_labels=1000, layer_scale_init_value=1.0)
    return _image(_init(hf.ConvNextForImageClassification(cfg)), v, 224)


def resnet50(v: Variant) -> Built:
    """ResNet-50 (bottleneck, 3-4-6-3) at 224x224 with a 1000-class head."""
    cfg = hf.ResNetConfig(num_labels=1000)
    return _image(_init(hf.ResNetForImageClassification(cfg)), v, 224)


def mobilenet_v2(v: Variant) -> Built:
    """MobileNet-V2 1.0 at 224x224 (symmetric PyTorch padding, not TF 'same')."""
    cfg = hf.MobileNetV2Config(num_labels=1000, tf_padding=False)
    # He gain: without residuals around most blocks, ReLU6 halves the variance per layer.
    return _image(_init(hf.MobileNetV2ForImageClassification(cfg), gain=2 ** 0.5), v, 224)


def efficientnet_b0(v: Variant) -> Built:
    """EfficientNet-B0 at 224x224. transformers pools with ``AvgPool2d(1280, ceil_mode)``;
    it is replaced by the equivalent global average pool."""
    cfg = hf.EfficientNetConfig(num_labels=1000, width_coefficient=1.0, depth_coefficient=1.0,
                                image_size=224, dropout_rate=0.2, hidden_dim=1280)
    model = hf.EfficientNetForImageClassification(cfg)
    model.efficientnet.pooler = nn.AdaptiveAvgPool2d(1)
    return _image(_init(model, gain=2 ** 0.5), v, 224)


def detr_r50(v: Variant) -> Built:
    """DETR with a ResNet-50 backbone (transformers' own ResNet, not timm) at 512x512: 6 encoder
    and 6 decoder layers, d_model 256, 100 queries, 91 classes; outputs logits and boxes."""
    backbone = hf.ResNetConfig(out_features=["stage4"])
    cfg = hf.DetrConfig(backbone_config=backbone, num_labels=91, **_EAGER)
    model = _init(hf.DetrForObjectDetection(cfg))
    pixels = seeded_randn(v.batch, 3, 512, 512)
    fields = ["logits", "pred_boxes"]
    return Built(OutputSelect(model, ["pixel_values"], fields), {"pixel_values": pixels}, fields)


def segformer_b0(v: Variant) -> Built:
    """Segformer-B0 (MiT-B0 encoder + all-MLP decoder, 150 ADE20k classes) at 512x512;
    logits come out at 1/4 resolution, [batch, 150, 128, 128]."""
    cfg = hf.SegformerConfig(num_labels=150, **_EAGER)
    return _image(_init(hf.SegformerForSemanticSegmentation(cfg)), v, 512)
