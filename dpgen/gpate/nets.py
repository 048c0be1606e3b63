"""G-PATE networks: the official conditional DCGAN (image) and PATE-GAN-style MLPs (tabular).

Teachers are written as ordinary single-teacher modules whose normalisation uses only the
current batch's statistics (no running buffers).  Each teacher class also has ``stacked_forward``:
the same network for n teachers at once from stacked parameters, with grouped convolutions
(teacher i's channels form group i) and batched matmuls for the linear layers.  On CPU this is
far faster than ``torch.func.vmap`` over the module, which falls back to slow per-op batching
rules for conv2d (see :mod:`dpgen.gpate.ensemble` and bench/gpate_ensemble.py).
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


def _stacked_batch_norm(h: torch.Tensor, n: int, weight: torch.Tensor, bias: torch.Tensor,
                        eps: float) -> torch.Tensor:
    """:class:`BatchStatNorm` for n teachers at once; h is (b, n·C, H, W), teacher i owning channels iC..(i+1)C."""
    b, _, hh, ww = h.shape
    h5 = h.view(b, n, -1, hh, ww)
    mean = h5.mean(dim=(0, 3, 4), keepdim=True)
    var = h5.var(dim=(0, 3, 4), unbiased=False, keepdim=True)
    out = (h5 - mean) * torch.rsqrt(var + eps) * weight[None, :, :, None, None] + bias[None, :, :, None, None]
    return out.view(b, -1, hh, ww)


def _stacked_batch_norm_fc(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """:class:`BatchStatNorm` on (n, b, F) features: statistics over each teacher's own batch."""
    mean = h.mean(dim=1, keepdim=True)
    var = h.var(dim=1, unbiased=False, keepdim=True)
    return (h - mean) * torch.rsqrt(var + eps) * weight[:, None, :] + bias[:, None, :]


def _stacked_linear(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """n independent Linear layers: h (n, b, F_in), weight (n, F_out, F_in), bias (n, F_out) → (n, b, F_out)."""
    return torch.baddbmm(bias[:, None, :], h, weight.transpose(1, 2))


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

    def stacked_forward(self, p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                        shared_input: bool) -> torch.Tensor:
        """Logits (n, b) of n teachers with stacked parameters ``p`` (leading axis n): :meth:`forward` for each.

        x is (b, c, H, W) shared by all teachers or (n, b, c, H, W) per teacher; y is (b,) or (n, b).
        Feature maps are laid out (b, n·C, H, W) so that one grouped convolution (groups=n) runs every
        teacher's convolution; a shared input needs no grouping in the first layer (one conv with the
        n weight tensors stacked as output channels).  A convolution is linear in its input channels,
        so the concatenated one-hot label maps contribute a fixed response per class (it varies only
        at the zero-padded borders): :func:`_label_response` computes it once for the K classes and
        each sample adds its class's map, instead of convolving K constant channels for every sample
        (the label channels are 10 of conv1's 11 inputs on MNIST).  Same function, ~3x fewer FLOPs.
        """
        n, k = p["conv1.weight"].shape[0], self.k
        c = x.shape[-3]
        w1, w2 = p["conv1.weight"], p["conv2.weight"]
        c1 = w1.shape[1]  # conv1 output channels (= c + K)
        if shared_input:
            y1h_t = F.one_hot(y, k).to(x.dtype).unsqueeze(1).expand(-1, n, -1)  # (b, n, K)
            h = F.conv2d(x, w1[:, :, :c].flatten(0, 1), p["conv1.bias"].flatten(), stride=2, padding=2)
            y_flat = y
        else:
            y1h_t = F.one_hot(y, k).to(x.dtype).transpose(0, 1)  # (b, n, K)
            b = x.shape[1]
            h = F.conv2d(x.transpose(0, 1).reshape(b, n * c, *x.shape[3:]), w1[:, :, :c].flatten(0, 1),
                         p["conv1.bias"].flatten(), stride=2, padding=2, groups=n)
            y_flat = y.transpose(0, 1)  # (b, n)
        h = h + _label_response(w1[:, :, c:], x.shape[-2], x.shape[-1], y_flat)
        h = F.leaky_relu(h, 0.2)
        h_in = h
        h = F.conv2d(h_in, w2[:, :, :c1].flatten(0, 1), p["conv2.bias"].flatten(), stride=2, padding=2, groups=n)
        h = h + _label_response(w2[:, :, c1:], h_in.shape[-2], h_in.shape[-1], y_flat)
        h = F.leaky_relu(_stacked_batch_norm(h, n, p["bn2.weight"], p["bn2.bias"], self.bn2.eps), 0.2)
        b = h.shape[0]
        h = torch.cat([h.view(b, n, -1), y1h_t], 2).transpose(0, 1)  # (n, b, F): per-teacher flatten order
        h = _stacked_linear(h, p["fc1.weight"], p["fc1.bias"])
        h = F.leaky_relu(_stacked_batch_norm_fc(h, p["bn3.weight"], p["bn3.bias"], self.bn3.eps), 0.2)
        h = _stacked_linear(torch.cat([h, y1h_t.transpose(0, 1)], 2), p["fc2.weight"], p["fc2.bias"])
        return h.squeeze(2)


def _label_response(w_label: torch.Tensor, hh: int, ww: int, y: torch.Tensor) -> torch.Tensor:
    """Each sample's share of a 5×5/2 convolution from its one-hot label-map input channels.

    w_label (n, C_out, K, 5, 5): the n teachers' weights on the K label channels.  Class j's label
    maps are ones in channel j, so its response is conv(e_j maps) — computed once for all K classes
    as (K, n·C_out, H', W') — and a sample of class y gets response[y].  y is (b,) for labels shared
    by all teachers, or (b, n) per teacher; returns (b, n·C_out, H', W').
    """
    n, c_out, k = w_label.shape[:3]
    eye = torch.eye(k, dtype=w_label.dtype, device=w_label.device)[:, :, None, None].expand(k, k, hh, ww)
    resp = F.conv2d(eye, w_label.flatten(0, 1), stride=2, padding=2)  # (K, n·C_out, H', W')
    if y.dim() == 1:
        return resp[y]
    ho, wo = resp.shape[-2:]
    resp = resp.view(k, n, c_out, ho, wo)
    return resp[y, torch.arange(n, device=y.device)[None, :]].reshape(y.shape[0], n * c_out, ho, wo)


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

    def stacked_forward(self, p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                        shared_input: bool) -> torch.Tensor:
        """Logits (n, b) of n teachers with stacked parameters (see :meth:`TeacherCNN.stacked_forward`)."""
        n = p["fc1.weight"].shape[0]
        h = torch.cat([x, F.one_hot(y, self.k).to(x.dtype)], -1)
        if shared_input:
            h = h.unsqueeze(0).expand(n, -1, -1)
        h = F.leaky_relu(_stacked_linear(h, p["fc1.weight"], p["fc1.bias"]), 0.2)
        h = F.leaky_relu(_stacked_linear(h, p["fc2.weight"], p["fc2.bias"]), 0.2)
        return _stacked_linear(h, p["fc3.weight"], p["fc3.bias"]).squeeze(2)


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
