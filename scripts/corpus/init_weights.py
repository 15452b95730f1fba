"""Fan-in-scaled random initialisation for corpus models.

Default PyTorch / ``transformers`` initialisation (small truncated normals, zero-init
residual scales, ``1e-6`` layer scales) makes activations of deep random networks
vanish or blow up, so numerical checks on the exported graphs would compare tiny
numbers with tiny numbers. :func:`fan_in_init` re-initialises every parameter so that
each linear map roughly preserves the second moment of its input:

* Linear / Conv / ConvTranspose (and transformers' ``Conv1D``) weights: ``N(0, gain**2 / fan_in)`` (``fan_in`` counts
  only the input channels of one group, so depthwise convs get ``kh * kw``);
* their biases: ``U(-0.1, 0.1)`` (non-zero, so a dropped bias changes the result);
* normalisation layers: ``gamma = 1 + N(0, 0.05**2)``, ``beta = N(0, 0.05**2)``,
  BatchNorm running statistics reset to mean 0, variance 1;
* embeddings: ``N(0, 1)``;
* any other floating parameter or buffer that the model marks as a parameter
  (layer scales, class tokens, position tables, relative-position bias tables):
  ``N(0, 0.02**2)`` for tables with more than one row, ones for 1-D scales.

All draws come from one seeded ``torch.Generator``, so a model is reproducible.
"""
from __future__ import annotations

import math

import torch
from torch import nn

_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d,
          nn.InstanceNorm2d)
_LINEAR = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose2d)


def _is_norm(module: nn.Module) -> bool:
    if isinstance(module, _NORMS):
        return True
    # transformers' RMSNorm variants (LlamaRMSNorm, ...) and custom channel norms
    name = type(module).__name__.lower()
    return name.endswith("rmsnorm") or name.endswith("layernorm") or name.endswith("layernorm2d")


def _fan_in(weight: torch.Tensor, module: nn.Module) -> int:
    if isinstance(module, nn.ConvTranspose2d):
        return weight.shape[0] // module.groups * math.prod(weight.shape[2:])
    return math.prod(weight.shape[1:])


@torch.no_grad()
def fan_in_init(model: nn.Module, seed: int = 0, gain: float = 1.0) -> nn.Module:
    """Re-initialise ``model`` in place with fan-in-scaled random weights.

    Parameters
    ----------
    model : nn.Module
        Any module tree; parameters owned by recognised layers get the layer rule,
        the remaining parameters the generic rule (see the module docstring).
    seed : int
        Seed of the generator used for every draw.
    gain : float
        Multiplier of the weight standard deviation (``sqrt(2)`` is He init).

    Returns
    -------
    nn.Module
        ``model`` itself.
    """
    gen = torch.Generator().manual_seed(seed)

    def normal_(t: torch.Tensor, mean: float, std: float) -> None:
        t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float32) * std + mean)

    handled: set[int] = set()
    for module in model.modules():
        if isinstance(module, _LINEAR):
            normal_(module.weight, 0.0, gain / math.sqrt(_fan_in(module.weight, module)))
            handled.add(id(module.weight))
            if module.bias is not None:
                module.bias.copy_(torch.rand(module.bias.shape, generator=gen) * 0.2 - 0.1)
                handled.add(id(module.bias))
        elif type(module).__name__ == "Conv1D":  # transformers' GPT-2 linear, weight [in, out]
            normal_(module.weight, 0.0, gain / math.sqrt(module.weight.shape[0]))
            module.bias.copy_(torch.rand(module.bias.shape, generator=gen) * 0.2 - 0.1)
            handled.update((id(module.weight), id(module.bias)))
        elif isinstance(module, nn.Embedding):
            normal_(module.weight, 0.0, 1.0)
            handled.add(id(module.weight))
        elif _is_norm(module):
            weight = getattr(module, "weight", None)
            bias = getattr(module, "bias", None)
            if isinstance(weight, torch.Tensor):
                normal_(weight, 1.0, 0.05)
                handled.add(id(weight))
            if isinstance(bias, torch.Tensor):
                normal_(bias, 0.0, 0.05)
                handled.add(id(bias))
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
                module.running_mean.zero_()
                module.running_var.fill_(1.0)
    for param in model.parameters():
        if id(param) in handled or not param.is_floating_point():
            continue
        if param.dim() <= 1:
            param.fill_(1.0)
        else:
            normal_(param, 0.0, 0.02)
    return model
