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
from dpgen.errors import DpgenError


def label_maps(y1h: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """One-hot labels broadcast to (N, K, H, W) maps, concatenated to feature maps (official ``conv_cond_concat``)."""
    return y1h[:, :, None, None].expand(-1, -1, h, w)


TEACHER_NORMS = ("none", "layer", "batch")


class BatchStatNorm(nn.Module):
    """BatchNorm in training mode without running statistics (vmap-friendly: no buffers, no in-place).

    The official DCGAN teacher's ``batch_norm`` (always ``is_training``): a batch's statistics, so the
    real and the fake batch (separate forward calls) are each normalised by their own mean.
    """

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


class SampleNorm(BatchStatNorm):
    """Layer norm: each sample normalised by its own statistics over all its features (per-channel affine).

    A per-sample norm keeps a batch's mean logit free to differ between real and fake batches (batch
    statistics remove it at the fc layer), and keeps each sample's gradient independent of the others.
    """

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        dims = list(range(1, h.dim()))
        mean = h.mean(dim=dims, keepdim=True)
        var = h.var(dim=dims, unbiased=False, keepdim=True)
        shape = [1, -1] + [1] * (h.dim() - 2)
        return (h - mean) * torch.rsqrt(var + self.eps) * self.weight.view(shape) + self.bias.view(shape)


def make_norm(kind: str, ch: int) -> nn.Module | None:
    """The teacher normalisation layer ``kind`` (``gpate.teacher_norm``): none | layer | batch."""
    if kind not in TEACHER_NORMS:
        raise DpgenError(f"gpate.teacher_norm must be one of {', '.join(TEACHER_NORMS)}, got {kind!r}")
    if kind == "none":
        return None
    return SampleNorm(ch) if kind == "layer" else BatchStatNorm(ch)


def _stacked_norm_conv(h: torch.Tensor, n: int, kind: str, weight: torch.Tensor | None, bias: torch.Tensor | None,
                       eps: float) -> torch.Tensor:
    """:func:`make_norm` for n teachers at once; h is (b, n·C, H, W), teacher i owning channels iC..(i+1)C.

    batch: statistics over each teacher's batch and positions; layer: over each sample's channels and positions.
    """
    if kind == "none":
        return h
    b, _, hh, ww = h.shape
    h5 = h.reshape(b, n, -1, hh, ww)
    dims = (0, 3, 4) if kind == "batch" else (2, 3, 4)
    mean = h5.mean(dim=dims, keepdim=True)
    var = h5.var(dim=dims, unbiased=False, keepdim=True)
    out = (h5 - mean) * torch.rsqrt(var + eps) * weight[None, :, :, None, None] + bias[None, :, :, None, None]
    return out.reshape(b, -1, hh, ww)


def _stacked_norm_fc(h: torch.Tensor, kind: str, weight: torch.Tensor | None, bias: torch.Tensor | None,
                     eps: float) -> torch.Tensor:
    """:func:`make_norm` on (n, b, F) features: batch statistics over dim 1, layer statistics over dim 2."""
    if kind == "none":
        return h
    dim = 1 if kind == "batch" else 2
    mean = h.mean(dim=dim, keepdim=True)
    var = h.var(dim=dim, unbiased=False, keepdim=True)
    return (h - mean) * torch.rsqrt(var + eps) * weight[:, None, :] + bias[:, None, :]


def _stacked_linear(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """n independent Linear layers: h (n, b, F_in), weight (n, F_out, F_in), bias (n, F_out) → (n, b, F_out)."""
    return torch.baddbmm(bias[:, None, :], h, weight.transpose(1, 2))


def dcgan_init_(module: nn.Module) -> nn.Module:
    """The official G-PATE initialisation (DCGAN-tensorflow ``ops``): conv weights N(0, 0.02²) truncated at
    2σ, linear and transposed-conv weights N(0, 0.02²), biases 0, norm scales 1 and shifts 0."""
    for mod in module.modules():
        if isinstance(mod, nn.Conv2d):
            nn.init.trunc_normal_(mod.weight, 0.0, 0.02, -0.04, 0.04)
        elif isinstance(mod, (nn.Linear, nn.ConvTranspose2d)):
            nn.init.normal_(mod.weight, 0.0, 0.02)
        else:
            continue
        if mod.bias is not None:
            nn.init.zeros_(mod.bias)
    return module


class TeacherCNN(nn.Module):
    """Official G-PATE teacher discriminator (official-code.md §3), one teacher.

    concat label maps → conv5×5/2 to (c+K) ch, lrelu, concat maps → conv5×5/2 to (df+K) ch, norm, lrelu
    → flatten, concat y → Linear dfc, norm, lrelu, concat y → Linear 1 (a logit).  ``norm``
    (``gpate.teacher_norm``): ``batch`` as the official DCGAN branch, ``none`` as its WGAN branch, or
    ``layer`` (per-sample, see :class:`SampleNorm`).  Initialised as the official code (:func:`dcgan_init_`).
    """

    def __init__(self, num_classes: int, shape: list[int], df_dim: int = 32, dfc_dim: int = 256,
                 norm: str = "batch") -> None:
        super().__init__()
        c, size = shape[0], shape[1]
        k = num_classes
        self.k, self.norm = k, norm
        self.conv1 = nn.Conv2d(c + k, c + k, 5, 2, 2)
        self.conv2 = nn.Conv2d(c + 2 * k, df_dim + k, 5, 2, 2)
        self.bn2 = make_norm(norm, df_dim + k)
        s4 = (size + 3) // 4
        self.fc1 = nn.Linear((df_dim + k) * s4 * s4 + k, dfc_dim)
        self.bn3 = make_norm(norm, dfc_dim)
        self.fc2 = nn.Linear(dfc_dim + k, 1)
        self.norm_eps = 1e-5
        #: stacked_forward's convolutions in channels-last layout (same function).  Off: on a 2-core CPU it
        #: measured 0.94-1.06x of NCHW for a whole iteration (bench/gpate_ensemble.py --layout); untested on GPUs
        self.channels_last = False
        dcgan_init_(self)

    def _norm(self, layer: nn.Module | None, h: torch.Tensor) -> torch.Tensor:
        return h if layer is None else layer(h)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        y1h = F.one_hot(y, self.k).to(x.dtype)
        h = torch.cat([x, label_maps(y1h, x.shape[2], x.shape[3])], 1)
        h = F.leaky_relu(self.conv1(h), 0.2)
        h = torch.cat([h, label_maps(y1h, h.shape[2], h.shape[3])], 1)
        h = F.leaky_relu(self._norm(self.bn2, self.conv2(h)), 0.2)
        h = torch.cat([h.flatten(1), y1h], 1)
        h = F.leaky_relu(self._norm(self.bn3, self.fc1(h)), 0.2)
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
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        w1, w2 = p["conv1.weight"], p["conv2.weight"]
        c1 = w1.shape[1]  # conv1 output channels (= c + K)
        if shared_input:
            y1h_t = F.one_hot(y, k).to(x.dtype).unsqueeze(1).expand(-1, n, -1)  # (b, n, K)
            h = F.conv2d(x.contiguous(memory_format=fmt), w1[:, :, :c].flatten(0, 1).contiguous(memory_format=fmt),
                         p["conv1.bias"].flatten(), stride=2, padding=2)
            y_flat = y
        else:
            y1h_t = F.one_hot(y, k).to(x.dtype).transpose(0, 1)  # (b, n, K)
            b = x.shape[1]
            h = F.conv2d(x.transpose(0, 1).reshape(b, n * c, *x.shape[3:]).contiguous(memory_format=fmt),
                         w1[:, :, :c].flatten(0, 1).contiguous(memory_format=fmt), p["conv1.bias"].flatten(),
                         stride=2, padding=2, groups=n)
            y_flat = y.transpose(0, 1)  # (b, n)
        h = h + _label_response(w1[:, :, c:], x.shape[-2], x.shape[-1], y_flat).contiguous(memory_format=fmt)
        h = F.leaky_relu(h, 0.2)
        h_in = h
        h = F.conv2d(h_in, w2[:, :, :c1].flatten(0, 1).contiguous(memory_format=fmt), p["conv2.bias"].flatten(),
                     stride=2, padding=2, groups=n)
        h = h + _label_response(w2[:, :, c1:], h_in.shape[-2], h_in.shape[-1], y_flat).contiguous(memory_format=fmt)
        h = F.leaky_relu(_stacked_norm_conv(h, n, self.norm, p.get("bn2.weight"), p.get("bn2.bias"),
                                            self.norm_eps), 0.2)
        b = h.shape[0]
        h = torch.cat([h.reshape(b, n, -1), y1h_t], 2).transpose(0, 1)  # (n, b, F): per-teacher flatten order
        h = _stacked_linear(h, p["fc1.weight"], p["fc1.bias"])
        h = F.leaky_relu(_stacked_norm_fc(h, self.norm, p.get("bn3.weight"), p.get("bn3.bias"), self.norm_eps), 0.2)
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


SAMPLE_STATS = ("batch", "running")


class GroupBatchNorm(nn.Module):
    """G's BatchNorm (parameters and buffers named as ``nn.BatchNorm1d/2d``), with batch statistics taken
    over each group of ``group`` consecutive samples.

    The official generator always uses batch statistics (``batch_norm(train=True)``), also when it
    samples, one batch of ``batch_size`` at a time.  ``group`` lets one call hold many such batches: the
    teachers' fakes (one batch per teacher) and the sampler's batches.  Running statistics are kept for
    ``sample_stats="running"`` and updated only where ``update`` is passed (G's own training step, on
    labels and z drawn without data), so nothing computed from a teacher's labels reaches the buffers.
    """

    def __init__(self, ch: int, momentum: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ch))
        self.bias = nn.Parameter(torch.zeros(ch))
        self.register_buffer("running_mean", torch.zeros(ch))
        self.register_buffer("running_var", torch.ones(ch))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))
        self.momentum, self.eps = momentum, eps

    def forward(self, h: torch.Tensor, group: int | None = None, running: bool = False,
                update: bool = False) -> torch.Tensor:
        if running:
            return F.batch_norm(h, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        g = group or h.shape[0]
        hv = h.view(h.shape[0] // g, g, *h.shape[1:])
        dims = (1,) + tuple(range(3, hv.dim()))
        mean = hv.mean(dim=dims, keepdim=True)
        var = hv.var(dim=dims, unbiased=False, keepdim=True)
        if update:
            with torch.no_grad():
                count = h.numel() // h.shape[1] // (h.shape[0] // g)
                # the running statistics stay in their own dtype (fp32) whatever autocast computed h in
                self.running_mean.lerp_(mean.mean(0).flatten().to(self.running_mean.dtype), self.momentum)
                self.running_var.lerp_((var.mean(0).flatten() * count / max(count - 1, 1)).to(self.running_var.dtype),
                                       self.momentum)
                self.num_batches_tracked += 1
        shape = [1, 1, -1] + [1] * (h.dim() - 2)
        out = (hv - mean) * torch.rsqrt(var + self.eps) * self.weight.view(shape) + self.bias.view(shape)
        return out.view_as(h)


def run_sequential(seq: nn.Sequential, h: torch.Tensor, **norm_kw) -> torch.Tensor:
    """``seq(h)``, passing ``norm_kw`` (group, running, update) to its :class:`GroupBatchNorm` layers."""
    for layer in seq:
        h = layer(h, **norm_kw) if isinstance(layer, GroupBatchNorm) else layer(h)
    return h


def norm_mode(gen: nn.Module, sample_stats: str, group: int | None, update_stats: bool) -> dict:
    """The :class:`GroupBatchNorm` arguments of a generator's forward: batch statistics over groups of
    ``group`` in training mode and when sampling with ``sample_stats="batch"``, running ones otherwise."""
    running = not gen.training and sample_stats == "running"
    return {"group": group, "running": running, "update": update_stats and not running}


class GPateGenerator(ReleasedGenerator):
    """Official G-PATE conditional generator; z ~ U(-1, 1); output in [0, 1] (sigmoid).

    [z, y] → Linear gfc, BN, ReLU, concat y → Linear (2·gf)(s/4)², BN, ReLU, reshape, concat maps
    → deconv5×5/2 to 2·gf ch, BN, ReLU, concat maps → deconv5×5/2 to c ch, sigmoid.
    ``class_prior`` (a DP estimate, or None for uniform) is only used when sampling labels for training.
    ``sample_stats``: ``batch`` samples as the official code, with the batch statistics of random
    groups of ``sample_group`` samples (G's training batch); ``running`` with running statistics.
    ``work_size`` (research option, not in the paper): G and the teachers work at this resolution and
    :meth:`generate` upsamples bilinearly to ``shape`` (a fixed post-processing).
    """

    def __init__(self, num_classes: int, shape: list[int], z_dim: int = 100, gf_dim: int = 64,
                 gfc_dim: int = 1024, class_prior: list[float] | None = None, sample_stats: str = "running",
                 sample_group: int = 0, work_size: int | None = None) -> None:
        super().__init__(num_classes=num_classes, shape=list(shape), z_dim=z_dim, gf_dim=gf_dim, gfc_dim=gfc_dim,
                         class_prior=class_prior, sample_stats=sample_stats, sample_group=sample_group,
                         work_size=work_size)
        if sample_stats not in SAMPLE_STATS:
            raise DpgenError(f"sample_stats must be one of {', '.join(SAMPLE_STATS)}, got {sample_stats!r}")
        c = shape[0]
        size = int(work_size or shape[1])
        k = num_classes
        self.k, self.z_dim, self.c = k, z_dim, c
        self.s2, self.s4 = (size + 1) // 2, (size + 3) // 4
        self.size, self.out_size = size, int(shape[1])
        self.sample_stats, self.sample_group = sample_stats, int(sample_group)
        self.ch = 2 * gf_dim
        self.fc1 = nn.Sequential(nn.Linear(z_dim + k, gfc_dim), GroupBatchNorm(gfc_dim), nn.ReLU(True))
        self.fc2 = nn.Sequential(nn.Linear(gfc_dim + k, self.ch * self.s4 ** 2), GroupBatchNorm(self.ch * self.s4 ** 2),
                                 nn.ReLU(True))
        self.up1 = nn.Sequential(nn.ConvTranspose2d(self.ch + k, self.ch, 5, 2, 2, output_padding=1),
                                 GroupBatchNorm(self.ch), nn.ReLU(True))
        self.up2 = nn.ConvTranspose2d(self.ch + k, c, 5, 2, 2, output_padding=1)

    def forward(self, z: torch.Tensor, labels: torch.Tensor, group: int | None = None,
                update_stats: bool = False) -> torch.Tensor:
        """Samples at the working resolution.  Batch statistics over groups of ``group`` samples (default:
        the whole batch) in training mode, and in eval mode with ``sample_stats="batch"``; running
        statistics in eval mode otherwise.  ``update_stats``: update the running statistics (G's step)."""
        kw = norm_mode(self, self.sample_stats, group, update_stats)
        y1h = F.one_hot(labels, self.k).to(z.dtype)
        h = run_sequential(self.fc1, torch.cat([z, y1h], 1), **kw)
        h = run_sequential(self.fc2, torch.cat([h, y1h], 1), **kw).view(-1, self.ch, self.s4, self.s4)
        h = run_sequential(self.up1, torch.cat([h, label_maps(y1h, self.s4, self.s4)], 1), **kw)[:, :, : self.s2, : self.s2]
        h = self.up2(torch.cat([h, label_maps(y1h, self.s2, self.s2)], 1))[:, :, : self.size, : self.size]
        return torch.sigmoid(h)

    def upsample(self, x: torch.Tensor) -> torch.Tensor:
        """Working resolution → the dataset's (identity unless ``work_size`` is set)."""
        if self.size == self.out_size:
            return x
        return F.interpolate(x, size=(self.out_size, self.out_size), mode="bilinear", align_corners=False)

    def generate(self, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        n, dev = len(labels), labels.device
        z = torch.rand(n, self.z_dim, device=dev, generator=generator) * 2 - 1
        g = self.sample_group
        if self.training or self.sample_stats == "running" or g <= 1:
            return self.upsample(self(z, labels))
        # official gen_data: whole batches of random composition; pad to a multiple of g and drop the extra
        pad = (-n) % g
        if pad:
            z = torch.cat([z, torch.rand(pad, self.z_dim, device=dev, generator=generator) * 2 - 1])
            labels = torch.cat([labels, torch.randint(0, self.k, (pad,), device=dev, generator=generator)])
        perm = torch.randperm(n + pad, device=dev, generator=generator)
        x = self(z[perm], labels[perm], group=g)
        return self.upsample(x[torch.argsort(perm)][:n])


def to_model_space(x: torch.Tensor) -> torch.Tensor:
    """Fixed, data-independent squashing of raw tabular features: sign(x)·log1p(|x|).

    Needs no statistics of the private data (standardising would), so it costs no privacy.
    """
    return torch.sign(x) * torch.log1p(x.abs())


def from_model_space(u: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`to_model_space`."""
    return torch.sign(u) * torch.expm1(u.abs())


class GPateTabularGenerator(ReleasedGenerator):
    """MLP generator for tabular data (PATE-GAN style); z ~ U(-1, 1); samples with running BN statistics.

    The network works in :func:`to_model_space`; :meth:`generate` returns the RAW feature scale
    of the dataset (the inverse transform), as the tabular evaluator expects.
    """

    clamp_output = False  # raw tabular features, not images in [0, 1]

    def __init__(self, num_classes: int, shape: list[int], z_dim: int = 32, hidden: int = 128,
                 class_prior: list[float] | None = None) -> None:
        super().__init__(num_classes=num_classes, shape=list(shape), z_dim=z_dim, hidden=hidden,
                         class_prior=class_prior)
        self.k, self.z_dim = num_classes, z_dim
        self.net = nn.Sequential(nn.Linear(z_dim + num_classes, hidden), GroupBatchNorm(hidden), nn.ReLU(True),
                                 nn.Linear(hidden, hidden), GroupBatchNorm(hidden), nn.ReLU(True),
                                 nn.Linear(hidden, shape[0]))

    def forward(self, z: torch.Tensor, labels: torch.Tensor, group: int | None = None,
                update_stats: bool = False) -> torch.Tensor:
        """Samples in model space (see :func:`to_model_space`); ``group``/``update_stats`` as :class:`GPateGenerator`."""
        h = torch.cat([z, F.one_hot(labels, self.k).to(z.dtype)], 1)
        return run_sequential(self.net, h, **norm_mode(self, "running", group, update_stats))

    def generate(self, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        z = torch.rand(len(labels), self.z_dim, device=labels.device, generator=generator) * 2 - 1
        return from_model_space(self(z, labels))
