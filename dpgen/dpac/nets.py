"""Networks of GS-WGAN / DP-GAN-DPAC (official-code.md §1–2).

* :class:`ResNetGenerator` — the released generator: z = 10-d Bernoulli(0.5) ++ one-hot label →
  SN-Linear → 3 BigGAN-style GBlocks (pixel norm, nearest ×2 upsampling, two SN-conv3×3,
  1×1 SN shortcut) 4→8→16→32 → SN-conv3×3 → sigmoid → centre crop to H×W.
* DCGAN projection discriminator and the auxiliary classifier C, written as *pure functions* of
  a parameter dict (``disc_forward``/``clf_forward``) so that one code path serves a single
  network and a ``torch.func.vmap``-ed ensemble of many (see :mod:`dpgen.dpac.ensemble`).
  Spectral normalisation (Miyato et al. 2018) is functional too: ``power_iteration`` updates the
  singular-vector estimates ``u`` outside the differentiated forward.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm

from dpgen.core.generator import ReleasedGenerator

Params = dict[str, torch.Tensor]
CONVS = ("c1", "c2", "c3")


def pixel_norm(x: torch.Tensor) -> torch.Tensor:
    """Karras et al. 2018 pixelwise feature normalisation over channels."""
    return x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + 1e-8)


class GBlock(nn.Module):
    """BigGAN-style up-sampling residual block with pixel norm instead of BatchNorm."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1 = spectral_norm(nn.Conv2d(cin, cout, 3, padding=1))
        self.conv2 = spectral_norm(nn.Conv2d(cout, cout, 3, padding=1))
        self.skip = spectral_norm(nn.Conv2d(cin, cout, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.interpolate(F.relu(pixel_norm(x)), scale_factor=2, mode="nearest")
        h = self.conv2(F.relu(pixel_norm(self.conv1(h))))
        return h + self.skip(F.interpolate(x, scale_factor=2, mode="nearest"))


class ResNetGenerator(ReleasedGenerator):
    """GS-WGAN's ResNet generator (the only network released; the EMA copy is what is saved)."""

    def __init__(self, num_classes: int, shape: list[int], z_dim: int = 10, width: int = 256) -> None:
        super().__init__(num_classes=num_classes, shape=list(shape), z_dim=z_dim, width=width)
        c, h, w = shape
        if h > 32 or w > 32:
            raise ValueError(f"the GS-WGAN generator makes images up to 32x32, not {h}x{w}")
        self.z_dim, self.width = z_dim, width
        self.fc = spectral_norm(nn.Linear(z_dim + num_classes, 4 * 4 * width))
        self.blocks = nn.Sequential(*(GBlock(width, width) for _ in range(3)))
        self.out = spectral_norm(nn.Conv2d(width, c, 3, padding=1))

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.fc(torch.cat([z, F.one_hot(y, self.num_classes).to(z.dtype)], dim=1))
        h = pixel_norm(F.relu(h.view(-1, self.width, 4, 4)))
        img = torch.sigmoid(self.out(F.relu(pixel_norm(self.blocks(h)))))
        _, hh, ww = self.sample_shape
        top, left = (32 - hh) // 2, (32 - ww) // 2
        return img[:, :, top:top + hh, left:left + ww]

    def sample_z(self, n: int, generator: torch.Generator | None = None, device=None) -> torch.Tensor:
        """z ~ Bernoulli(0.5)^z_dim, as GS-WGAN."""
        device = device if device is not None else self.fc.parametrizations.weight.original.device
        return (torch.rand(n, self.z_dim, generator=generator, device=device) < 0.5).float()

    def generate(self, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return self(self.sample_z(len(labels), generator, labels.device), labels)


# ---- functional DCGAN trunk, projection discriminator and auxiliary classifier ---------------

def _trunk_init(shape: list[int], width: int, g: torch.Generator) -> Params:
    c, h, _ = shape
    chans = [c, width, 2 * width, 4 * width]
    p: Params = {}
    for i, name in enumerate(CONVS):
        fan_in = chans[i] * 25
        p[name + ".w"] = torch.randn(chans[i + 1], chans[i], 5, 5, generator=g) * (2.0 / fan_in) ** 0.5
        p[name + ".b"] = torch.zeros(chans[i + 1])
    return p


def feature_dim(shape: list[int], width: int) -> int:
    s = shape[1]
    for _ in range(3):
        s = (s + 1) // 2  # conv 5x5, stride 2, padding 2
    return 4 * width * s * s


def disc_init(num_classes: int, shape: list[int], width: int, g: torch.Generator) -> Params:
    """Parameters of one DCGAN projection discriminator (Miyato & Koyama 2018)."""
    p = _trunk_init(shape, width, g)
    f = feature_dim(shape, width)
    p["lin.w"] = torch.randn(1, f, generator=g) * (1.0 / f) ** 0.5
    p["lin.b"] = torch.zeros(1)
    p["emb"] = torch.randn(num_classes, f, generator=g) * (1.0 / f) ** 0.5
    return p


def clf_init(num_classes: int, shape: list[int], width: int, g: torch.Generator) -> Params:
    """Parameters of the auxiliary classifier C: same trunk + Linear(F → classes) (official ClassifierDCGAN)."""
    p = _trunk_init(shape, width, g)
    f = feature_dim(shape, width)
    p["lin.w"] = torch.randn(num_classes, f, generator=g) * (1.0 / f) ** 0.5
    p["lin.b"] = torch.zeros(num_classes)
    return p


def sn_init(p: Params, g: torch.Generator) -> Params:
    """Initial left-singular-vector estimates for every spectrally normalised weight."""
    return {k: F.normalize(torch.randn(p[k].shape[0], generator=g), dim=0) for k in p if k.endswith(".w")}


@torch.no_grad()
def power_iteration(p: Params, u: Params) -> Params:
    """One power-iteration step per weight (torch's spectral_norm does the same per training forward)."""
    new = {}
    for k, uk in u.items():
        w = p[k].reshape(p[k].shape[0], -1)
        v = F.normalize(w.t() @ uk, dim=0, eps=1e-12)
        new[k] = F.normalize(w @ v, dim=0, eps=1e-12)
    return new


def _sn(w: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    wm = w.reshape(w.shape[0], -1)
    v = F.normalize(wm.t() @ u, dim=0, eps=1e-12).detach()
    sigma = torch.dot(u.detach(), wm @ v)
    return w / sigma


def _features(p: Params, u: Params, x: torch.Tensor) -> torch.Tensor:
    h = x
    for name in CONVS:
        h = F.relu(F.conv2d(h, _sn(p[name + ".w"], u[name + ".w"]), p[name + ".b"], stride=2, padding=2))
    return h.flatten(1)


def _onehot(y: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    # a comparison, not F.one_hot: F.one_hot checks values with .item(), which vmap cannot batch
    return (y.unsqueeze(-1) == torch.arange(k, device=y.device)).to(dtype)


def disc_forward(p: Params, u: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """D(x, y) = w·φ(x) + b + <emb(y), φ(x)>: one critic value per sample."""
    h = _features(p, u, x)
    onehot = _onehot(y, p["emb"].shape[0], h.dtype)
    return (h @ _sn(p["lin.w"], u["lin.w"]).t()).squeeze(1) + p["lin.b"] + ((onehot @ p["emb"]) * h).sum(1)


def clf_logits(p: Params, u: Params, x: torch.Tensor) -> torch.Tensor:
    return _features(p, u, x) @ _sn(p["lin.w"], u["lin.w"]).t() + p["lin.b"]


def clf_forward(p: Params, u: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """C(x, y) = Σ_c logits_c · ŷ_c with ŷ = +1 for the true class, −1/(K−1) otherwise (official WGAN-style score)."""
    logits = clf_logits(p, u, x)
    k = logits.shape[1]
    yhat = _onehot(y, k, logits.dtype) * (1.0 + 1.0 / (k - 1)) - 1.0 / (k - 1)
    return (logits * yhat).sum(1)


Forward = Callable[[Params, Params, torch.Tensor, torch.Tensor], torch.Tensor]
