"""Networks of GS-WGAN / DP-GAN-DPAC (official-code.md §1–2).

* :class:`ResNetGenerator` — the released generator: z = 10-d Bernoulli(0.5) ++ one-hot label →
  SN-Linear → 3 BigGAN-style GBlocks (pixel norm, nearest ×2 upsampling, two SN-conv3×3,
  1×1 SN shortcut) 4→8→16→32 → SN-conv3×3 → sigmoid → the official crop to H×W.
* DCGAN projection discriminator and the auxiliary classifier C, written as *pure functions* of
  a parameter dict (``disc_forward``/``clf_forward``) so that one code path serves a single
  network and a ``torch.func.vmap``-ed ensemble of many (see :mod:`dpgen.ensemble`).
  Spectral normalisation (Miyato et al. 2018) is functional too: ``power_iteration`` updates the
  singular-vector estimates ``u`` outside the differentiated forward (:mod:`dpgen.nets.spectral`).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm

from dpgen.core.generator import ReleasedGenerator
from dpgen.nets.spectral import Params, sn_weight

CONVS = ("c1", "c2", "c3")


def pixel_norm(x: torch.Tensor) -> torch.Tensor:
    """Karras et al. 2018 pixelwise feature normalisation over channels."""
    return x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + 1e-8)


def onehot(y: torch.Tensor, k: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """One-hot rows by comparison: ``F.one_hot`` validates the labels with a host sync (and vmap cannot batch it)."""
    return (y.unsqueeze(-1) == torch.arange(k, device=y.device)).to(dtype)


Inject = Callable[[torch.Tensor], torch.Tensor]


class GBlock(nn.Module):
    """The official GS-WGAN up-sampling residual block (``source/models.py``, BigGAN-style, pixel norm for BN):
    pixel_norm → nearest ×2 → SN-conv3×3 → ReLU(pixel_norm) → SN-conv3×3, plus a 1×1 SN shortcut of the
    up-sampled input. ``inject`` acts on the up-sampled main path (EFSGD's noise injection, Alg. 1)."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1 = spectral_norm(nn.Conv2d(cin, cout, 3, padding=1))
        self.conv2 = spectral_norm(nn.Conv2d(cout, cout, 3, padding=1))
        self.skip = spectral_norm(nn.Conv2d(cin, cout, 1))

    def forward(self, x: torch.Tensor, inject: Inject | None = None) -> torch.Tensor:
        h = F.interpolate(pixel_norm(x), scale_factor=2, mode="nearest")
        if inject is not None:
            h = inject(h)
        h = self.conv2(F.relu(pixel_norm(self.conv1(h))))
        return h + self.skip(F.interpolate(x, scale_factor=2, mode="nearest"))


class ResNetGenerator(ReleasedGenerator):
    """GS-WGAN's ResNet generator (the only network released; the EMA copy is what is saved).

    As the official ``GeneratorResNet``: SN-Linear → ReLU → pixel norm → 3 GBlocks (4→8→16→32) → SN-conv3×3
    → sigmoid. The output conv has no padding for images up to 30 px (32→30, then the official top-left crop
    ``[:H, :W]``: 28×28 for MNIST) and padding 1 for 31–32 px (DPAC's CelebA model, no crop).
    """

    def __init__(self, num_classes: int, shape: list[int], z_dim: int = 10, width: int = 256) -> None:
        super().__init__(num_classes=num_classes, shape=list(shape), z_dim=z_dim, width=width)
        c, h, w = shape
        if h > 32 or w > 32:
            raise ValueError(f"the GS-WGAN generator makes images up to 32x32, not {h}x{w}")
        self.z_dim, self.width = z_dim, width
        self.fc = spectral_norm(nn.Linear(z_dim + num_classes, 4 * 4 * width))
        self.blocks = nn.ModuleList(GBlock(width, width) for _ in range(3))
        self.out = spectral_norm(nn.Conv2d(width, c, 3, padding=0 if max(h, w) <= 30 else 1))

    def _inject(self, h: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Hook after each up-sampling; identity here (EFSGD's generator adds noise)."""
        return h

    def forward_input(self, u: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """G on a ready input vector u = [z, one-hot label] (EFSGD's reconstruction path feeds its own u)."""
        h = pixel_norm(F.relu(self.fc(u).view(-1, self.width, 4, 4)))
        for blk in self.blocks:
            h = blk(h, lambda t: self._inject(t, generator))
        img = torch.sigmoid(self.out(h))
        _, hh, ww = self.sample_shape
        return img[:, :, :hh, :ww]

    def input_code(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cat([z, onehot(y, self.num_classes, z.dtype)], dim=1)

    def forward(self, z: torch.Tensor, y: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.forward_input(self.input_code(z, y), generator)

    def sample_z(self, n: int, generator: torch.Generator | None = None, device=None) -> torch.Tensor:
        """z ~ Bernoulli(0.5)^z_dim, as GS-WGAN."""
        device = device if device is not None else self.fc.parametrizations.weight.original.device
        return (torch.rand(n, self.z_dim, generator=generator, device=device) < 0.5).float()

    def generate(self, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return self(self.sample_z(len(labels), generator, labels.device), labels, generator)


# ---- functional DCGAN trunk, projection discriminator and auxiliary classifier ---------------

def _uniform(shape: tuple[int, ...], fan_in: int, g: torch.Generator) -> torch.Tensor:
    """PyTorch's default Conv/Linear initialisation, U(±1/sqrt(fan_in)) (what the official nn modules get)."""
    bound = fan_in ** -0.5
    return (torch.rand(shape, generator=g, device=g.device) * 2.0 - 1.0) * bound


def dense(name: str, cout: int, cin: int, k: int, g: torch.Generator) -> Params:
    """``<name>.w`` (a k×k convolution, or a linear layer for k = 1) and ``<name>.b``, torch's default uniform init."""
    fan_in = cin * k * k
    w_shape = (cout, cin, k, k) if k > 1 else (cout, cin)
    return {name + ".w": _uniform(w_shape, fan_in, g), name + ".b": _uniform((cout,), fan_in, g)}


def trunk_init(shape: list[int], width: int, g: torch.Generator) -> Params:
    """The DCGAN trunk shared by D, C and EFSGD's encoder: three 5×5 stride-2 convolutions, width/2w/4w channels."""
    c = shape[0]
    chans = [c, width, 2 * width, 4 * width]
    p: Params = {}
    for i, name in enumerate(CONVS):
        p.update(dense(name, chans[i + 1], chans[i], 5, g))
    return p


def feature_dim(shape: list[int], width: int) -> int:
    s = shape[1]
    for _ in range(3):
        s = (s + 1) // 2  # conv 5x5, stride 2, padding 2
    return 4 * width * s * s


def disc_init(num_classes: int, shape: list[int], width: int, g: torch.Generator) -> Params:
    """Parameters of one DCGAN projection discriminator (Miyato & Koyama 2018; official DiscriminatorDCGAN:
    SN convs, SN Linear(F→1) and an SN class embedding initialised N(0, 1) as nn.Embedding)."""
    p = trunk_init(shape, width, g)
    f = feature_dim(shape, width)
    p.update(dense("lin", 1, f, 1, g))
    p["emb.w"] = torch.randn(num_classes, f, generator=g, device=g.device)
    return p


def clf_init(num_classes: int, shape: list[int], width: int, g: torch.Generator) -> Params:
    """Parameters of the auxiliary classifier C: same trunk + SN Linear(F → classes) (official ClassifierDCGAN)."""
    p = trunk_init(shape, width, g)
    p.update(dense("lin", num_classes, feature_dim(shape, width), 1, g))
    return p


def features(p: Params, u: Params, x: torch.Tensor) -> torch.Tensor:
    """The trunk's flattened features of ``x`` (spectrally normalised convolutions, ReLU)."""
    h = x
    for name in CONVS:
        h = F.relu(F.conv2d(h, sn_weight(p[name + ".w"], u[name + ".w"]), p[name + ".b"], stride=2, padding=2))
    return h.flatten(1)


def disc_forward(p: Params, u: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """D(x, y) = w·φ(x) + b + <emb(y), φ(x)>, all weights spectrally normalised: one critic value per sample."""
    h = features(p, u, x)
    emb = sn_weight(p["emb.w"], u["emb.w"])
    proj = (onehot(y, emb.shape[0], h.dtype) @ emb) * h
    return (h @ sn_weight(p["lin.w"], u["lin.w"]).t()).squeeze(1) + p["lin.b"] + proj.sum(1)


def clf_logits(p: Params, u: Params, x: torch.Tensor) -> torch.Tensor:
    return features(p, u, x) @ sn_weight(p["lin.w"], u["lin.w"]).t() + p["lin.b"]


def clf_forward(p: Params, u: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """C(x, y) = Σ_c logits_c · ŷ_c with ŷ = +1 for the true class, −1/(K−1) otherwise (official WGAN-style score)."""
    logits = clf_logits(p, u, x)
    k = logits.shape[1]
    yhat = onehot(y, k, logits.dtype) * (1.0 + 1.0 / (k - 1)) - 1.0 / (k - 1)
    return (logits * yhat).sum(1)


def clf_logprob(p: Params, u: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """C(x, y) = log softmax(logits)_y: the class log-probability (``classifier.loss=ce``, not in the papers)."""
    logp = torch.log_softmax(clf_logits(p, u, x), dim=1)
    return (logp * onehot(y, logp.shape[1], logp.dtype)).sum(1)


Forward = Callable[[Params, Params, torch.Tensor, torch.Tensor], torch.Tensor]
#: ``classifier.loss`` -> the score C(x, y) that C maximises and that G's C path ascends: ``wgan``, the papers'
#: WGAN-style class score (trained with a gradient penalty); ``ce``, the log-probability (cross-entropy training)
CLF_SCORES: dict[str, Forward] = {"wgan": clf_forward, "ce": clf_logprob}
