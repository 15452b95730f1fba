"""Hand-written convolutional corpus models: ResNeXt-50 32x4d, YOLOv5s and NAFNet."""
from __future__ import annotations

import torch
from torch import nn

from init_weights import fan_in_init
from spec import Built, Variant, seeded_randn


# ---------------------------------------------------------------- ResNeXt-50 32x4d
class _XBlock(nn.Module):
    """ResNeXt bottleneck: 1x1 reduce, grouped 3x3 (stride here, as in ResNet v1.5), 1x1."""

    def __init__(self, c_in: int, width: int, c_out: int, stride: int, groups: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c_in, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride, 1, groups=groups, bias=False),
            nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, c_out, 1, bias=False), nn.BatchNorm2d(c_out))
        self.short = (nn.Identity() if stride == 1 and c_in == c_out else nn.Sequential(
            nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.short(x))


class ResNeXt(nn.Module):
    """ResNeXt-50 (32x4d): stages of 3-4-6-3 blocks, widths 128..1024, 1000 classes."""

    def __init__(self, depths: tuple[int, ...] = (3, 4, 6, 3), groups: int = 32,
                 base_width: int = 4, classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        blocks, c_in = [], 64
        for stage, n in enumerate(depths):
            planes = 64 * 2 ** stage
            width, c_out = planes * base_width * groups // 64, planes * 4
            for i in range(n):
                blocks.append(_XBlock(c_in, width, c_out, 2 if i == 0 and stage > 0 else 1,
                                      groups))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c_in, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


def resnext50(v: Variant) -> Built:
    """ResNeXt-50 32x4d at 224x224."""
    model = fan_in_init(ResNeXt().eval())
    return Built(model, {"pixel_values": seeded_randn(v.batch, 3, 224, 224)}, ["logits"])


# ---------------------------------------------------------------- YOLOv5s (v6 layout)
class _CBS(nn.Sequential):
    """Conv (no bias) + BatchNorm + SiLU, YOLOv5's ``Conv``."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1, p: int | None = None):
        super().__init__(nn.Conv2d(c_in, c_out, k, s, k // 2 if p is None else p, bias=False),
                         nn.BatchNorm2d(c_out), nn.SiLU())


class _C3(nn.Module):
    """CSP block with three convs and ``n`` bottlenecks on one half of the channels."""

    def __init__(self, c_in: int, c_out: int, n: int = 1, shortcut: bool = True):
        super().__init__()
        c = c_out // 2
        self.cv1, self.cv2, self.cv3 = _CBS(c_in, c), _CBS(c_in, c), _CBS(2 * c, c_out)
        self.m = nn.ModuleList(nn.Sequential(_CBS(c, c), _CBS(c, c, 3)) for _ in range(n))
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv1(x)
        for block in self.m:
            y = y + block(y) if self.shortcut else block(y)
        return self.cv3(torch.cat([y, self.cv2(x)], 1))


class _SPPF(nn.Module):
    """Spatial pyramid pooling (fast): three chained 5x5 max pools, concatenated."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.cv1, self.cv2 = _CBS(c_in, c_in // 2), _CBS(2 * c_in, c_out)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.pool(x)
        y2 = self.pool(y1)
        return self.cv2(torch.cat([x, y1, y2, self.pool(y2)], 1))


_ANCHORS = ((10, 13, 16, 30, 33, 23), (30, 61, 62, 45, 59, 119), (116, 90, 156, 198, 373, 326))


class _Detect(nn.Module):
    """Detection head with inference-time box decoding (grids precomputed as buffers)."""

    def __init__(self, channels: tuple[int, ...], image: int, classes: int = 80):
        super().__init__()
        self.no, self.na = classes + 5, 3
        self.convs = nn.ModuleList(nn.Conv2d(c, self.na * self.no, 1) for c in channels)
        self.strides = (8, 16, 32)
        for i, s in enumerate(self.strides):
            n = image // s
            yy, xx = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
            grid = torch.stack([xx, yy], -1).float().expand(1, self.na, n, n, 2) - 0.5
            anchors = torch.tensor(_ANCHORS[i], dtype=torch.float32).view(1, self.na, 1, 1, 2)
            self.register_buffer(f"grid{i}", grid.contiguous())
            self.register_buffer(f"anchor{i}", anchors)  # broadcast over the grid

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        out = []
        for i, (conv, f) in enumerate(zip(self.convs, feats)):
            b, _, h, w = f.shape
            y = conv(f).view(b, self.na, self.no, h, w).permute(0, 1, 3, 4, 2).sigmoid()
            xy = (y[..., :2] * 2 + getattr(self, f"grid{i}")) * self.strides[i]
            wh = (y[..., 2:4] * 2) ** 2 * getattr(self, f"anchor{i}")
            out.append(torch.cat([xy, wh, y[..., 4:]], -1).view(b, -1, self.no))
        return torch.cat(out, 1)


class YOLOv5s(nn.Module):
    """YOLOv5s (depth 0.33, width 0.50; v6.0 layout with a 6x6 stem conv and SPPF)."""

    def __init__(self, image: int = 640, classes: int = 80):
        super().__init__()
        self.b0 = nn.Sequential(_CBS(3, 32, 6, 2, 2), _CBS(32, 64, 3, 2), _C3(64, 64, 1),
                                _CBS(64, 128, 3, 2), _C3(128, 128, 2))           # P3, 128
        self.b1 = nn.Sequential(_CBS(128, 256, 3, 2), _C3(256, 256, 3))          # P4, 256
        self.b2 = nn.Sequential(_CBS(256, 512, 3, 2), _C3(512, 512, 1), _SPPF(512, 512))
        self.lat5, self.up = _CBS(512, 256), nn.Upsample(scale_factor=2.0, mode="nearest")
        self.c4 = _C3(512, 256, 1, False)
        self.lat4, self.c3 = _CBS(256, 128), _C3(256, 128, 1, False)
        self.down3, self.n4 = _CBS(128, 128, 3, 2), _C3(256, 256, 1, False)
        self.down4, self.n5 = _CBS(256, 256, 3, 2), _C3(512, 512, 1, False)
        self.detect = _Detect((128, 256, 512), image, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p3 = self.b0(x)
        p4 = self.b1(p3)
        l5 = self.lat5(self.b2(p4))
        l4 = self.lat4(self.c4(torch.cat([self.up(l5), p4], 1)))
        o3 = self.c3(torch.cat([self.up(l4), p3], 1))
        o4 = self.n4(torch.cat([self.down3(o3), l4], 1))
        o5 = self.n5(torch.cat([self.down4(o4), l5], 1))
        return self.detect([o3, o4, o5])


def yolov5s(v: Variant) -> Built:
    """YOLOv5s at 640x640, decoded predictions [batch, 25200, 85]."""
    model = fan_in_init(YOLOv5s().eval(), gain=2 ** 0.5)
    return Built(model, {"images": seeded_randn(v.batch, 3, 640, 640)}, ["predictions"])


# ---------------------------------------------------------------- NAFNet
class LayerNorm2d(nn.Module):
    """Layer norm over the channel axis of an NCHW tensor."""

    def __init__(self, c: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(c)), nn.Parameter(torch.zeros(c))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu = x.mean(1, keepdim=True)
        var = (x - mu).pow(2).mean(1, keepdim=True)
        y = (x - mu) / torch.sqrt(var + self.eps)
        return y * self.weight.view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)


class _NAFBlock(nn.Module):
    """NAFNet block: LN, 1x1 expand, 3x3 depthwise, SimpleGate, simplified channel
    attention, 1x1; then LN, 1x1 expand, SimpleGate, 1x1; two scaled residuals."""

    def __init__(self, c: int):
        super().__init__()
        self.norm1, self.norm2 = LayerNorm2d(c), LayerNorm2d(c)
        self.conv1, self.conv2 = nn.Conv2d(c, 2 * c, 1), nn.Conv2d(2 * c, 2 * c, 3, 1, 1, groups=2 * c)
        self.sca, self.conv3 = nn.Conv2d(c, c, 1), nn.Conv2d(c, c, 1)
        self.conv4, self.conv5 = nn.Conv2d(c, 2 * c, 1), nn.Conv2d(c, c, 1)
        self.beta = nn.Parameter(torch.zeros(1, c, 1, 1))
        self.gamma = nn.Parameter(torch.zeros(1, c, 1, 1))

    @staticmethod
    def _gate(x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=1)
        return a * b

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        x = self._gate(self.conv2(self.conv1(self.norm1(inp))))
        x = self.conv3(x * self.sca(nn.functional.adaptive_avg_pool2d(x, 1)))
        y = inp + x * self.beta
        x = self.conv5(self._gate(self.conv4(self.norm2(y))))
        return y + x * self.gamma


class NAFNet(nn.Module):
    """NAFNet U-Net (SIDD width-32 configuration: encoders 2-2-4-8, 12 middle blocks,
    decoders 2-2-2-2), strided-conv downsampling, 1x1 conv + PixelShuffle upsampling,
    global residual."""

    def __init__(self, width: int = 32, enc: tuple[int, ...] = (2, 2, 4, 8), middle: int = 12,
                 dec: tuple[int, ...] = (2, 2, 2, 2)):
        super().__init__()
        self.intro, self.ending = nn.Conv2d(3, width, 3, 1, 1), nn.Conv2d(width, 3, 3, 1, 1)
        self.encoders, self.downs = nn.ModuleList(), nn.ModuleList()
        c = width
        for n in enc:
            self.encoders.append(nn.Sequential(*(_NAFBlock(c) for _ in range(n))))
            self.downs.append(nn.Conv2d(c, 2 * c, 2, 2))
            c *= 2
        self.middle = nn.Sequential(*(_NAFBlock(c) for _ in range(middle)))
        self.ups, self.decoders = nn.ModuleList(), nn.ModuleList()
        for n in dec:
            self.ups.append(nn.Sequential(nn.Conv2d(c, 2 * c, 1, bias=False), nn.PixelShuffle(2)))
            c //= 2
            self.decoders.append(nn.Sequential(*(_NAFBlock(c) for _ in range(n))))

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        x, skips = self.intro(inp), []
        for encoder, down in zip(self.encoders, self.downs):
            x = encoder(x)
            skips.append(x)
            x = down(x)
        x = self.middle(x)
        for decoder, up, skip in zip(self.decoders, self.ups, reversed(skips)):
            x = decoder(up(x) + skip)
        return self.ending(x) + inp


def nafnet(v: Variant) -> Built:
    """NAFNet-width32 on a 256x256 image; residual scales beta/gamma start at 0.5 (the
    paper starts them at 0, which would make every block an identity)."""
    model = fan_in_init(NAFNet().eval())
    with torch.no_grad():
        for block in model.modules():
            if isinstance(block, _NAFBlock):
                block.beta.fill_(0.5)
                block.gamma.fill_(0.5)
    return Built(model, {"image": seeded_randn(v.batch, 3, 256, 256)}, ["restored"])
