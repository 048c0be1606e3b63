"""G-PATE networks: the official conditional DCGAN (image) and PATE-GAN-style MLPs (tabular).

Teachers are written as ordinary single-teacher modules whose normalisation uses only the
current batch's statistics (no running buffers), so that ``torch.func.functional_call`` +
``vmap`` can run thousands of them as one batched model (see :mod:`dpgen.gpate.ensemble`).
"""
from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from dpgen.core.generator import ReleasedGenerator


def label_maps(y1h: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """One-hot labels broadcast to (N, K, H, W) maps, concatenated to feature maps (official ``conv_cond_concat``)."""
    return y1h[:, :, None, None].expand(-1, -1, h, w)


class BatchStatNorm(nn.Module):
    """BatchNorm in training mode without running statistics (vmap-friendly: no buffers, no in-place)."""

    def __init__(self, ch: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ch))
        self.bias = nn.Parameter(torch.zeros(ch))
        self.eps = eps

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        dims = [0] + list(range(2, h.dim()))
        mean = h.mean(dim=dims, keepdim=True)
        var = h.var(dim=dims, unbiased=False, keepdim=True)
        shape = [1, -1] + [1] * (h.dim() - 2)
        return (h - mean) * torch.rsqrt(var + self.eps) * self.weight.view(shape) + self.bias.view(shape)


class TeacherCNN(nn.Module):
    """Official G-PATE teacher discriminator (official-code.md §3), one teacher.

    concat label maps → conv5×5/2 to (c+K) ch, lrelu, concat maps → conv5×5/2 to (df+K) ch, BN, lrelu
    → flatten, concat y → Linear dfc, BN, lrelu, concat y → Linear 1 (a logit).
    """

    def __init__(self, num_classes: int, shape: list[int], df_dim: int = 32, dfc_dim: int = 256) -> None:
        super().__init__()
        c, size = shape[0], shape[1]
        k = num_classes
        self.k = k
        self.conv1 = nn.Conv2d(c + k, c + k, 5, 2, 2)
        self.conv2 = nn.Conv2d(c + 2 * k, df_dim + k, 5, 2, 2)
        self.bn2 = BatchStatNorm(df_dim + k)
        s4 = (size + 3) // 4
        self.fc1 = nn.Linear((df_dim + k) * s4 * s4 + k, dfc_dim)
        self.bn3 = BatchStatNorm(dfc_dim)
        self.fc2 = nn.Linear(dfc_dim + k, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        y1h = F.one_hot(y, self.k).to(x.dtype)
        h = torch.cat([x, label_maps(y1h, x.shape[2], x.shape[3])], 1)
        h = F.leaky_relu(self.conv1(h), 0.2)
        h = torch.cat([h, label_maps(y1h, h.shape[2], h.shape[3])], 1)
        h = F.leaky_relu(self.bn2(self.conv2(h)), 0.2)
        h = torch.cat([h.flatten(1), y1h], 1)
        h = F.leaky_relu(self.bn3(self.fc1(h)), 0.2)
        return self.fc2(torch.cat([h, y1h], 1)).squeeze(1)


class TeacherMLP(nn.Module):
    """Fully connected teacher for tabular data (PATE-GAN style): [x, y] → h → h → logit."""

    def __init__(self, num_classes: int, shape: list[int], hidden: int = 64) -> None:
        super().__init__()
        self.k = num_classes
        self.fc1 = nn.Linear(shape[0] + num_classes, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = torch.cat([x, F.one_hot(y, self.k).to(x.dtype)], 1)
        h = F.leaky_relu(self.fc1(h), 0.2)
        h = F.leaky_relu(self.fc2(h), 0.2)
        return self.fc3(h).squeeze(1)


class GPateGenerator(ReleasedGenerator):
    """Official G-PATE conditional generator; z ~ U(-1, 1); output in [0, 1] (sigmoid).

    [z, y] → Linear gfc, BN, ReLU, concat y → Linear (2·gf)(s/4)², BN, ReLU, reshape, concat maps
    → deconv5×5/2 to 2·gf ch, BN, ReLU, concat maps → deconv5×5/2 to c ch, sigmoid.
    ``class_prior`` (a DP estimate, or None for uniform) is only used when sampling labels for training.
    """

    def __init__(self, num_classes: int, shape: list[int], z_dim: int = 100, gf_dim: int = 64,
                 gfc_dim: int = 1024, class_prior: list[float] | None = None) -> None:
        super().__init__(num_classes=num_classes, shape=list(shape), z_dim=z_dim, gf_dim=gf_dim, gfc_dim=gfc_dim,
                         class_prior=class_prior)
        c, size = shape[0], shape[1]
        k = num_classes
        self.k, self.z_dim, self.c = k, z_dim, c
        self.s2, self.s4 = (size + 1) // 2, (size + 3) // 4
        self.size = size
        self.ch = 2 * gf_dim
        self.fc1 = nn.Sequential(nn.Linear(z_dim + k, gfc_dim), nn.BatchNorm1d(gfc_dim), nn.ReLU(True))
        self.fc2 = nn.Sequential(nn.Linear(gfc_dim + k, self.ch * self.s4 ** 2), nn.BatchNorm1d(self.ch * self.s4 ** 2),
                                 nn.ReLU(True))
        self.up1 = nn.Sequential(nn.ConvTranspose2d(self.ch + k, self.ch, 5, 2, 2, output_padding=1),
                                 nn.BatchNorm2d(self.ch), nn.ReLU(True))
        self.up2 = nn.ConvTranspose2d(self.ch + k, c, 5, 2, 2, output_padding=1)

    def forward(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        y1h = F.one_hot(labels, self.k).to(z.dtype)
        h = self.fc1(torch.cat([z, y1h], 1))
        h = self.fc2(torch.cat([h, y1h], 1)).view(-1, self.ch, self.s4, self.s4)
        h = self.up1(torch.cat([h, label_maps(y1h, self.s4, self.s4)], 1))[:, :, : self.s2, : self.s2]
        h = self.up2(torch.cat([h, label_maps(y1h, self.s2, self.s2)], 1))[:, :, : self.size, : self.size]
        return torch.sigmoid(h)

    def generate(self, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        z = torch.rand(len(labels), self.z_dim, device=labels.device, generator=generator) * 2 - 1
        return self(z, labels)


def to_model_space(x: torch.Tensor) -> torch.Tensor:
    """Fixed, data-independent squashing of raw tabular features: sign(x)·log1p(|x|).

    Needs no statistics of the private data (standardising would), so it costs no privacy.
    """
    return torch.sign(x) * torch.log1p(x.abs())


def from_model_space(u: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`to_model_space`."""
    return torch.sign(u) * torch.expm1(u.abs())


class GPateTabularGenerator(ReleasedGenerator):
    """MLP generator for tabular data (PATE-GAN style); z ~ U(-1, 1).

    The network works in :func:`to_model_space`; :meth:`generate` returns the RAW feature scale
    of the dataset (the inverse transform), as the tabular evaluator expects.
    """

    clamp_output = False  # raw tabular features, not images in [0, 1]

    def __init__(self, num_classes: int, shape: list[int], z_dim: int = 32, hidden: int = 128,
                 class_prior: list[float] | None = None) -> None:
        super().__init__(num_classes=num_classes, shape=list(shape), z_dim=z_dim, hidden=hidden,
                         class_prior=class_prior)
        self.k, self.z_dim = num_classes, z_dim
        self.net = nn.Sequential(nn.Linear(z_dim + num_classes, hidden), nn.BatchNorm1d(hidden), nn.ReLU(True),
                                 nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(True),
                                 nn.Linear(hidden, shape[0]))

    def forward(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Samples in model space (see :func:`to_model_space`)."""
        return self.net(torch.cat([z, F.one_hot(labels, self.k).to(z.dtype)], 1))

    def generate(self, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        z = torch.rand(len(labels), self.z_dim, device=labels.device, generator=generator) * 2 - 1
        return from_model_space(self(z, labels))
