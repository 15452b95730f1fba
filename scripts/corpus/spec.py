"""Data types shared by the corpus builders: variants, built models and model specs."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass(frozen=True)
class Variant:
    """One static shape of a model: the batch size and, for sequence models, the length."""

    batch: int = 1
    seq: int | None = None

    @property
    def tag(self) -> str:
        """File-name fragment, e.g. ``"s128_b1"`` or ``"b32"``."""
        return (f"s{self.seq}_" if self.seq is not None else "") + f"b{self.batch}"


@dataclass
class IntRange:
    """Valid half-open value range ``[low, high)`` of an integer input (token ids)."""

    low: int
    high: int


@dataclass
class Built:
    """A ready-to-export model: the module, named example inputs and output names."""

    module: nn.Module
    inputs: dict[str, torch.Tensor]
    output_names: list[str]
    int_ranges: dict[str, IntRange] = field(default_factory=dict)
    notes: str = ""


@dataclass(frozen=True)
class ModelSpec:
    """A corpus entry: name, family, builder and the variants to export."""

    name: str
    family: str
    builder: Callable[[Variant], Built]
    variants: tuple[Variant, ...]
    description: str


def seeded_randn(*shape: int, seed: int = 0) -> torch.Tensor:
    """Standard-normal float32 tensor drawn from a generator seeded with ``seed``."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def seeded_ids(batch: int, seq: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """Random int64 token ids in ``[0, vocab)``, shape ``[batch, seq]``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=gen, dtype=torch.int64)


class OutputSelect(nn.Module):
    """Wraps a ``transformers`` model: calls it with keyword inputs, returns chosen fields.

    ``transformers`` models take many optional keyword arguments and return
    ``ModelOutput`` objects; the TorchScript exporter wants positional tensors in and
    tensors out.
    """

    def __init__(self, model: nn.Module, input_names: list[str], fields: list[str],
                 **fixed: object):
        super().__init__()
        self.model = model
        self.input_names = list(input_names)
        self.fields = list(fields)
        self.fixed = dict(fixed)

    def forward(self, *args: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        out = self.model(**dict(zip(self.input_names, args)), **self.fixed)
        picked = tuple(getattr(out, f) for f in self.fields)
        return picked[0] if len(picked) == 1 else picked
