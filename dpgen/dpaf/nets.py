"""DPAF's networks (Sec. IV-B, V-C, VI-A): a cDCGAN-style classifier C / discriminator D split into
conv1 | conv2* | SIN → (DP)AGG | conv3* | two FC* layers, and the generator.

C and D share one layout (``DpafNet``) so that C's conv1 can be transferred into D (Alg. 1 line 5).
No BatchNorm anywhere in C/D: per-sample gradients (DP-SGD) need per-sample independence.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dpgen.core.precision import at_least_fp32
from dpgen.errors import DpgenError

# Cx1-Cx2-Cx3 defaults by image size (Sec. VI-A: C2-C2-C1 for 64 px CelebA, C3-C1-× for 128 px FFHQ).
DEFAULT_LAYERS = {28: [1, 1, 1], 32: [1, 1, 1], 64: [2, 2, 1], 128: [3, 1, 0]}


def sin(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Simplified instance normalization, Eq. (3): each feature map minus its mean, divided by its std.

    No learnable centre/scale. ``eps`` inside the square root keeps a constant map finite (it maps to 0);
    every map then has ℓ2 norm ≤ p (= p exactly up to ``eps`` for non-constant p×p maps), which is what
    bounds the sensitivity of AGG (Eq. 4).

    In at least fp32 (``x`` from a bf16 convolution under ``precision=bf16`` is cast up first): a map
    normalised in bf16 may exceed the bound by 2^-8 relative (:mod:`dpgen.core.precision`).
    """
    x = at_least_fp32(x)
    mu = x.mean(dim=(-2, -1), keepdim=True)
    var = (x - mu).pow(2).mean(dim=(-2, -1), keepdim=True)
    return (x - mu) / torch.sqrt(var + eps)


def agg_sensitivity(m: int, h: int, w: int) -> float:
    """ℓ2 sensitivity of AGG over SIN-normalized features, Eq. (4): √(m·h·w) (= √m·p for p×p maps)."""
    return math.sqrt(m * h * w)


def num_layers(size: int) -> int:
    """Stride-2 conv layers available for a ``size`` px input, down to a 2×2 map (5 for 64 px, Sec. VI-B5)."""
    n = 0
    while size > 2:
        size = (size - 1) // 2 + 1
        n += 1
    return n


def resolve_layers(layers, size: int) -> list[int]:
    """Validated Cx1-Cx2-Cx3 split (``null``: the paper's default for this resolution)."""
    if layers is None:
        if size not in DEFAULT_LAYERS:
            raise DpgenError(f"dpaf has no default layer split for {size} px; set dpaf.layers=[x1,x2,x3]")
        return list(DEFAULT_LAYERS[size])
    layers = [int(v) for v in layers]
    if len(layers) != 3 or min(layers) < 0 or layers[1] < 1:
        raise DpgenError(f"dpaf.layers must be [x1, x2, x3] with x1, x3 >= 0 and x2 >= 1, got {layers}")
    if sum(layers) > num_layers(size):
        raise DpgenError(f"dpaf.layers={layers} needs {sum(layers)} conv layers; {size} px allows {num_layers(size)}")
    return layers


class DpafNet(nn.Module):
    """conv1 → conv2(*) → SIN → [AGG] → conv3(*) → FC → FC (Fig. 4).

    ``num_classes_in > 0`` makes it the conditional D: one-hot label maps are concatenated to the input of
    conv2* (cDCGAN feeds labels to the 2nd layer; here to the first layer after the frozen conv1, see docs/methods.md).
    ``out_dim`` is K for C (class proportions) and 1 for D.
    """

    def __init__(self, shape: list[int], layers: list[int], width: int, out_dim: int, num_classes_in: int = 0,
                 fc_hidden: int = 128, activation: str = "lrelu") -> None:
        super().__init__()
        if activation not in ("lrelu", "tanh"):
            raise DpgenError(f"dpaf.activation must be lrelu or tanh, got {activation!r}")
        act = (lambda: nn.LeakyReLU(0.2)) if activation == "lrelu" else nn.Tanh
        c, size = shape[0], shape[1]
        self.k_in = num_classes_in
        blocks: list[nn.Sequential] = []
        ch_in = c
        for part, n in enumerate(layers):
            mods: list[nn.Module] = []
            for j in range(n):
                ch = width * 2 ** min(sum(layers[:part]) + j, 3)
                extra = num_classes_in if (part == 1 and j == 0) else 0
                mods += [nn.Conv2d(ch_in + extra, ch, 3, 2, 1), act()]
                ch_in, size = ch, (size - 1) // 2 + 1
                if part == 1:
                    self.feat_shape = (ch, size, size)
            blocks.append(nn.Sequential(*mods))
        self.conv1, self.conv2, conv3 = blocks
        self.head = nn.Sequential(conv3, nn.Flatten(), nn.Linear(ch_in * size * size, fc_hidden), act(),
                                  nn.Linear(fc_hidden, out_dim))

    @property
    def sensitivity(self) -> float:
        """√m·p of the features entering AGG (Eq. 4)."""
        return agg_sensitivity(*self.feat_shape)

    def features(self, x: torch.Tensor, labels: torch.Tensor | None = None, sin_eps: float = 1e-5) -> torch.Tensor:
        """SIN(conv2*(conv1(x), label maps)): the per-sample vectors that (DP)AGG sums."""
        h = self.conv1(x * 2 - 1)
        if self.k_in:
            maps = F.one_hot(labels, self.k_in).to(h.dtype)[:, :, None, None].expand(-1, -1, *h.shape[-2:])
            h = torch.cat([h, maps], dim=1)
        return sin(self.conv2(h), sin_eps)

    def score(self, feats: torch.Tensor) -> torch.Tensor:
        """conv3* and FC* on per-sample (D̂) or aggregated (D) features."""
        out = self.head(feats)
        return out.squeeze(1) if out.shape[1] == 1 else out
