"""Hand-written non-CNN corpus models: NeRF MLP, MMoE and an unrolled LSTM."""
from __future__ import annotations

import torch
from torch import nn

from init_weights import fan_in_init
from spec import Built, Variant, seeded_randn


class PositionalEncoding(nn.Module):
    """NeRF's ``[x, sin(2^k pi x), cos(2^k pi x)]`` for ``k < octaves``."""

    def __init__(self, octaves: int):
        super().__init__()
        self.register_buffer("freqs", (2.0 ** torch.arange(octaves)) * torch.pi)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scaled = (x[..., None] * self.freqs).flatten(-2)          # [N, 3 * octaves]
        return torch.cat([x, torch.sin(scaled), torch.cos(scaled)], dim=-1)


class NeRFMLP(nn.Module):
    """The original NeRF MLP: 8 x 256 ReLU layers on encoded positions (63 features),
    the encoded input concatenated again after layer 4, a density head, and a 128-wide
    colour branch on the encoded view direction (27 features)."""

    def __init__(self, width: int = 256, depth: int = 8, skip: int = 4):
        super().__init__()
        self.pos_enc, self.dir_enc = PositionalEncoding(10), PositionalEncoding(4)
        in_pos, in_dir = 3 + 3 * 2 * 10, 3 + 3 * 2 * 4
        self.skip = skip
        layers = []
        for i in range(depth):
            d_in = in_pos if i == 0 else width + (in_pos if i == skip + 1 else 0)
            layers.append(nn.Linear(d_in, width))
        self.layers = nn.ModuleList(layers)
        self.sigma = nn.Linear(width, 1)
        self.feature = nn.Linear(width, width)
        self.view = nn.Linear(width + in_dir, width // 2)
        self.rgb = nn.Linear(width // 2, 3)

    def forward(self, xyz: torch.Tensor, dirs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p, d = self.pos_enc(xyz), self.dir_enc(dirs)
        h = p
        for i, layer in enumerate(self.layers):
            if i == self.skip + 1:
                h = torch.cat([p, h], dim=-1)
            h = torch.relu(layer(h))
        sigma = torch.relu(self.sigma(h))
        h = torch.relu(self.view(torch.cat([self.feature(h), d], dim=-1)))
        return torch.sigmoid(self.rgb(h)), sigma


def nerf_mlp(v: Variant) -> Built:
    """NeRF MLP over ``65536 * batch`` sample points (positions and view directions)."""
    n = 65536 * v.batch
    model = fan_in_init(NeRFMLP().eval(), gain=2 ** 0.5)
    xyz, dirs = seeded_randn(n, 3, seed=1), seeded_randn(n, 3, seed=2)
    return Built(model, {"xyz": xyz, "dirs": dirs}, ["rgb", "sigma"])


class MMoE(nn.Module):
    """Multi-gate mixture of experts (Ma et al., KDD 2018): shared MLP experts, one
    softmax gate and one tower per task."""

    def __init__(self, features: int = 512, experts: int = 8, tasks: int = 2,
                 expert_hidden: tuple[int, int] = (256, 128), tower_hidden: int = 64):
        super().__init__()
        h1, h2 = expert_hidden
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(features, h1), nn.ReLU(), nn.Linear(h1, h2), nn.ReLU())
            for _ in range(experts))
        self.gates = nn.ModuleList(nn.Linear(features, experts) for _ in range(tasks))
        self.towers = nn.ModuleList(
            nn.Sequential(nn.Linear(h2, tower_hidden), nn.ReLU(), nn.Linear(tower_hidden, 1))
            for _ in range(tasks))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        expert_out = torch.stack([e(x) for e in self.experts], dim=1)      # [B, E, H]
        outs = []
        for gate, tower in zip(self.gates, self.towers):
            w = torch.softmax(gate(x), dim=-1).unsqueeze(-1)               # [B, E, 1]
            outs.append(torch.sigmoid(tower((w * expert_out).sum(dim=1))))
        return tuple(outs)


def mmoe(v: Variant) -> Built:
    """MMoE with 8 experts (512 -> 256 -> 128) and 2 task towers over 512 dense features."""
    model = fan_in_init(MMoE().eval(), gain=2 ** 0.5)
    return Built(model, {"features": seeded_randn(v.batch, 512)}, ["task0", "task1"])


class UnrolledLSTM(nn.Module):
    """A stacked LSTM written with Linear layers and unrolled over time in Python.

    TVM's Relax ONNX importer has no ``LSTM`` operator, so the exported graph spells
    every cell out: one fused ``[x, h] @ W`` gate matmul, Sigmoid/Tanh, elementwise
    state updates. Gate order is PyTorch's (input, forget, cell, output)."""

    def __init__(self, input_size: int = 256, hidden: int = 512, layers: int = 2):
        super().__init__()
        self.hidden = hidden
        self.cells = nn.ModuleList(
            nn.Linear((input_size if i == 0 else hidden) + hidden, 4 * hidden)
            for i in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, steps, _ = x.shape
        seq = list(x.unbind(1))
        for cell in self.cells:
            h = x.new_zeros(batch, self.hidden)
            c = x.new_zeros(batch, self.hidden)
            out = []
            for t in range(steps):
                i, f, g, o = cell(torch.cat([seq[t], h], dim=-1)).chunk(4, dim=-1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                out.append(h)
            seq = out
        return torch.stack(seq, dim=1)


def lstm(v: Variant) -> Built:
    """2-layer LSTM (input 256, hidden 512) over ``v.seq`` steps, unrolled."""
    model = fan_in_init(UnrolledLSTM().eval())
    return Built(model, {"x": seeded_randn(v.batch, v.seq, 256)}, ["hidden_states"],
                 notes="unrolled: TVM's ONNX importer has no LSTM op")
