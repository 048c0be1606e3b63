"""A conditional DCGAN pair for 28, 32, 64 and 128 px images (Radford et al. 2016).

The discriminator uses no BatchNorm (per-sample gradients need per-sample independence,
Abadi et al. 2016) and conditions on the label by projection (Miyato & Koyama 2018).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from dpgen.core.generator import ReleasedGenerator


def _base_size(size: int) -> tuple[int, int]:
    """(starting resolution, number of ×2 upsamplings) for an output of ``size`` px."""
    if size in (28, 32):
        return size // 4, 2
    ups = int(round(math.log2(size / 8)))
    if 8 * 2**ups != size:
        raise ValueError(f"unsupported image size {size}; use 28, 32, 64 or 128")
    return 8, ups


class CondGenerator(ReleasedGenerator):
    """z ~ N(0, I) and a label embedding → image in [0, 1]."""

    def __init__(self, num_classes: int, shape: list[int], z_dim: int = 100, width: int = 64) -> None:
        super().__init__(num_classes=num_classes, shape=list(shape), z_dim=z_dim, width=width)
        c, size = shape[0], shape[1]
        s0, ups = _base_size(size)
        ch = width * 2 ** (ups - 1)
        self.z_dim, self.s0, self.ch0 = z_dim, s0, ch
        self.embed = nn.Embedding(num_classes, z_dim)
        self.fc = nn.Sequential(nn.Linear(2 * z_dim, ch * s0 * s0), nn.BatchNorm1d(ch * s0 * s0), nn.ReLU(True))
        blocks: list[nn.Module] = []
        for _ in range(ups):
            blocks += [nn.ConvTranspose2d(ch, ch // 2, 4, 2, 1), nn.BatchNorm2d(ch // 2), nn.ReLU(True)]
            ch //= 2
        blocks += [nn.Conv2d(ch, c, 3, 1, 1), nn.Sigmoid()]
        self.blocks = nn.Sequential(*blocks)

    def forward(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.fc(torch.cat([z, self.embed(labels)], dim=1))
        return self.blocks(h.view(-1, self.ch0, self.s0, self.s0))

    def generate(self, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        z = torch.randn(len(labels), self.z_dim, device=labels.device, generator=generator)
        return self(z, labels)


class ProjectionDiscriminator(nn.Module):
    """Stride-2 3×3 convs + LeakyReLU down to 4×4, then a linear score plus the class
    projection ⟨embed(y), h⟩ (Miyato & Koyama 2018).

    Kept small on purpose: DP-SGD materialises one gradient per sample, so memory and
    time scale with (parameters × batch).
    """

    def __init__(self, num_classes: int, shape: list[int], width: int = 64) -> None:
        super().__init__()
        c, size = shape[0], shape[1]
        layers: list[nn.Module] = []
        ch_in, ch, i = c, width, 0
        while size > 4:
            layers += [nn.Conv2d(ch_in, ch, 3, 2, 1), nn.LeakyReLU(0.2)]
            size = (size - 1) // 2 + 1
            ch_in, ch, i = ch, min(ch * 2, 2 * width), i + 1
        self.features = nn.Sequential(*layers, nn.Flatten())
        feat = ch_in * size * size
        self.score = nn.Linear(feat, 1)
        self.embed = nn.Embedding(num_classes, feat)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.features(x * 2 - 1)
        return self.score(h).squeeze(1) + (self.embed(labels) * h).sum(1) / math.sqrt(h.shape[1])
