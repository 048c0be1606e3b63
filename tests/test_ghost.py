"""Ghost norms and book-keeping (dpgen/privacy/ghost.py, ``grad_backend=ghost``): the per-record norms and the clipped
sum of today's per-record gradients (torch.func's vmap(grad)), on every layer type the DP-trained networks use.

Each layer type is checked under every way of computing its norms (ghost norm, materialised from the patches,
grouped convolution, dpgen's CPU kernel), with one row per record (dpgan) and with K rows averaged before clipping
(feta), against torch.func's per-record gradients: the norms and Σ_i c_i g_i within fp32's tolerance. Then the whole
networks (dpgan's discriminator, feta's UNet), feta's micro-batch step (padded rows included), dpgan's DP-SGD step against
opacus' hooks (an audit's canary rows included), bf16 (every DP quantity fp32), and the refusals; the kernel is
built here, called where the rule says, bit-identical over threads, and off with ``DPGEN_GHOST_KERNEL=0``.
"""
from __future__ import annotations

import copy
import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F
from opacus import GradSampleModule
from torch import nn

import dpgen.privacy.ghost as ghost
from dpgen.feta.dpsgd import MicroStep, clip_factors, clipped_grad_sum_func
from dpgen.nets.dcgan import ProjectionDiscriminator
from dpgen.nets.edm import EDMDenoiser, edm_draws, edm_loss_at
from dpgen.nets.unet import UNet
from dpgen.privacy import ghost_kernel
from dpgen.privacy.ghost import FUSED, GHOST, GROUPED, PATCHES, GhostClipper, plain_strategy, prefer_ghost, strategy
from dpgen.privacy.per_sample import per_record_grads
from dpgen.privacy.randomness import secret_generator

RTOL = 1e-5  # fp32
HOWS = (GHOST, PATCHES, GROUPED, FUSED)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _force(how: str):
    return lambda *_: how


class Head(nn.Module):
    """A network of one layer under test: ``body(x)`` then a fixed nonlinear readout of every output, one loss per row."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return (torch.tanh(out) * torch.linspace(-1, 2, out.shape[-1])).flatten(1).sum(1)


class Twice(nn.Module):
    """A convolution called twice in one forward (shared weights: a record's positions span both calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) + self.conv(torch.flip(x, (-1,)) * 0.5)


class Frozen(nn.Module):
    """A trained Linear after a frozen convolution: the frozen layer's parameters get nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, stride=2).requires_grad_(False)
        self.fc = nn.Linear(4 * 3 * 3, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).flatten(1))


def _frozen_bias(conv: nn.Conv2d) -> nn.Conv2d:
    """A convolution whose weight is trained and whose bias is not."""
    conv.bias.requires_grad_(False)
    return conv


#: name -> (layer, input builder of ``rows`` rows): every layer type and option the methods' networks use
LAYERS = {
    "linear": (lambda: nn.Linear(6, 4), lambda g, n: torch.randn(n, 6, generator=g)),
    "linear-positions": (lambda: nn.Linear(6, 4, bias=False), lambda g, n: torch.randn(n, 5, 6, generator=g)),
    "conv3x3": (lambda: nn.Conv2d(2, 3, 3, padding=1), lambda g, n: torch.randn(n, 2, 6, 6, generator=g)),
    "conv-stride2": (lambda: nn.Conv2d(2, 5, 3, stride=2, padding=1), lambda g, n: torch.randn(n, 2, 7, 7, generator=g)),
    "conv1x1": (lambda: nn.Conv2d(4, 6, 1), lambda g, n: torch.randn(n, 4, 3, 3, generator=g)),
    # the kernel's blocks: 27 patch values (4 blocks of 6 and 3 single ones), 80 outputs (a vector of 64 and one of
    # 16); 9 values and 40 outputs (48 columns, 8 of them zero); no padding, exactly 16 outputs
    "conv-wide": (lambda: nn.Conv2d(3, 80, 3, stride=2, padding=1), lambda g, n: torch.randn(n, 3, 7, 7, generator=g)),
    "conv-40": (lambda: nn.Conv2d(1, 40, 3, padding=1), lambda g, n: torch.randn(n, 1, 5, 6, generator=g)),
    "conv-16-nopad": (lambda: nn.Conv2d(2, 16, 3), lambda g, n: torch.randn(n, 2, 6, 5, generator=g)),
    "conv-bias-frozen": (lambda: _frozen_bias(nn.Conv2d(2, 3, 3, padding=1)),
                         lambda g, n: torch.randn(n, 2, 5, 5, generator=g)),
    "conv-dilated-rect": (lambda: nn.Conv2d(2, 3, (3, 2), padding=(2, 1), dilation=2, bias=False),
                          lambda g, n: torch.randn(n, 2, 6, 5, generator=g)),
    "embedding": (lambda: nn.Embedding(5, 4), lambda g, n: torch.randint(0, 5, (n, 3), generator=g)),
    "embedding-padding": (lambda: nn.Embedding(5, 4, padding_idx=1), lambda g, n: torch.randint(0, 5, (n, 3), generator=g)),
    "groupnorm": (lambda: nn.GroupNorm(2, 4), lambda g, n: torch.randn(n, 4, 3, 3, generator=g) * 3 + 1),
    "twice": (Twice, lambda g, n: torch.randn(n, 2, 5, 5, generator=g)),
    "frozen": (Frozen, lambda g, n: torch.randn(n, 2, 7, 7, generator=g)),
}


def _reference(net: nn.Module, x: torch.Tensor, k: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """torch.func's per-record gradients and losses, a record's loss the mean of its k rows."""
    records = x.reshape(-1, k, *x.shape[1:])
    return per_record_grads(net, lambda call, rows: call(rows).mean(), (records,))


def _check(net: nn.Module, x: torch.Tensor, k: int, rule=strategy, rtol: float = RTOL) -> None:
    grads, losses = _reference(net, x, k)
    rec = GhostClipper(net, rule).record(lambda: net(x).reshape(-1, k).mean(1))
    ref_norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads))
    assert rec.norms.shape == ref_norms.shape and rec.norms.dtype == torch.float32
    assert _rel(rec.norms, ref_norms) < rtol
    assert _rel(rec.losses, losses) < rtol
    c = torch.rand(len(ref_norms), generator=torch.Generator().manual_seed(5))
    for got, g in zip(rec.clipped_sum(c), grads):
        assert got.dtype == torch.float32 and _rel(got, torch.einsum("i,i...->...", c, g)) < rtol


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("layer", list(LAYERS))
def test_every_layer_type_gives_torch_funcs_norms_and_clipped_sum(layer, how, k):
    torch.manual_seed(0)
    build, inputs = LAYERS[layer]
    _check(Head(build()), inputs(torch.Generator().manual_seed(1), 4 * k), k, _force(how))


@pytest.mark.parametrize("k", [1, 3])
def test_dpgan_discriminator_and_feta_unet_under_the_default_rule(k):
    torch.manual_seed(0)
    d = ProjectionDiscriminator(10, [1, 28, 28], width=8)
    g = torch.Generator().manual_seed(2)
    x, y = torch.rand(6 * k, 1, 28, 28, generator=g), torch.randint(0, 10, (6 * k,), generator=g)
    t = (torch.rand(6 * k, generator=g) < 0.5).float()
    grads, _ = per_record_grads(d, lambda call, x, y, t: F.binary_cross_entropy_with_logits(call(x, y), t).mean(),
                                tuple(v.reshape(6, k, *v.shape[1:]) for v in (x, y, t)))
    rec = GhostClipper(d).record(
        lambda: F.binary_cross_entropy_with_logits(d(x, y), t, reduction="none").reshape(6, k).mean(1))
    assert _rel(rec.norms, torch.sqrt(sum(v.flatten(1).pow(2).sum(1) for v in grads))) < RTOL
    # the UNet: GroupNorm, attention's 1x1 convolutions, the time and label embeddings' Linear and Embedding layers
    den = EDMDenoiser(UNet(1, 8, 3, nf=4, ch_mult=[1, 2], num_res_blocks=1, attn_res=[4]))
    m = 3
    xr = torch.rand(m * k, 1, 8, 8, generator=g) * 2 - 1
    yr = torch.randint(0, 4, (m * k,), generator=g)  # 3: the null class
    sr, nr = edm_draws(xr, g)
    batch = tuple(v.reshape(m, k, *v.shape[1:]) for v in (xr, yr, sr, nr))
    grads, losses = per_record_grads(den, lambda call, *r: edm_loss_at(call, *r).mean(), batch)
    rec = GhostClipper(den).record(lambda: edm_loss_at(den, xr, yr, sr, nr).reshape(m, k).mean(1))
    assert _rel(rec.norms, torch.sqrt(sum(v.flatten(1).pow(2).sum(1) for v in grads))) < RTOL
    c = clip_factors(rec.norms, 0.01)
    assert float(c.max()) < 1, "the clip binds"
    for got, v in zip(rec.clipped_sum(c), grads):
        assert _rel(got, torch.einsum("i,i...->...", c, v)) < RTOL


def test_the_rule_counts_a_records_k_rows():
    """Without the kernel, dpgan's last convolution (64 -> 64, 3x3, 16 output positions) takes the ghost norm with
    one row per record, and the materialised gradient when a record's 32 rows make 512 positions (feta's K = 32).
    The default rule gives every convolution to the kernel (the plain choice where it cannot run)."""
    conv = nn.Conv2d(64, 64, 3, 2, 1)
    assert plain_strategy(conv, 1, 16, 576, 64) == GHOST and prefer_ghost(16, 576, 64)
    assert plain_strategy(conv, 32, 16, 576, 64) == PATCHES and not prefer_ghost(512, 576, 64)
    assert plain_strategy(nn.Conv2d(8, 8, 3, padding=1), 1, 784, 72, 8) == GROUPED
    # dpgan's 32 -> 64 convolution (49 output positions): the patches, not a grouped convolution
    assert plain_strategy(nn.Conv2d(32, 64, 3, 2, 1), 1, 49, 288, 64) == PATCHES
    assert strategy(nn.Linear(32, 16), 1, 1, 32, 16) == GHOST and strategy(nn.Linear(32, 16), 32, 1, 32, 16) == PATCHES
    assert strategy(conv, 1, 16, 576, 64) == FUSED and strategy(nn.Conv2d(8, 8, 1), 32, 784, 8, 8) == FUSED


# ---- dpgen's CPU kernel ----------------------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler here")
def test_the_kernel_is_built_where_a_compiler_is(tmp_path, monkeypatch):
    """Where a C++ compiler is, the kernel builds from its source into an empty cache (else every FUSED test above
    would test the plain path only), and a second process-wide state finds the library there without building."""
    monkeypatch.setenv("DPGEN_CACHE", str(tmp_path))
    monkeypatch.setattr(ghost_kernel, "_state", {})
    assert ghost_kernel.available(), "dpgen/privacy/ghost_kernel.cpp did not build: see the dpgen log line"
    (lib,) = (tmp_path / "kernels").glob("ghost_*.so")
    assert [p.name for p in (tmp_path / "kernels").iterdir()] == [lib.name], "no temporary file left behind"
    built = lib.stat().st_mtime_ns
    monkeypatch.setattr(ghost_kernel, "_state", {})
    assert ghost_kernel.available() and lib.stat().st_mtime_ns == built


def _spy_kernel(monkeypatch) -> list:
    calls = []
    real = ghost_kernel.conv_record_grads
    monkeypatch.setattr(ghost_kernel, "conv_record_grads", lambda *a, **k: (calls.append(a[0].shape), real(*a, **k)))
    return calls


def test_the_default_rule_runs_the_kernel_and_dpgans_step_matches_the_plain_path(monkeypatch):
    if not ghost_kernel.available():
        pytest.skip("no kernel here (test_the_kernel_is_built_where_a_compiler_is says why)")
    calls = _spy_kernel(monkeypatch)
    torch.manual_seed(0)
    d = ProjectionDiscriminator(10, [1, 28, 28], width=16)
    x, y = torch.rand(12, 1, 28, 28), torch.randint(0, 10, (12,))
    rec = GhostClipper(d).record(lambda: d(x, y))
    assert len(calls) == 3, "each of D's three convolutions by the kernel"
    plain = GhostClipper(d, plain_strategy).record(lambda: d(x, y))
    assert len(calls) == 3, "plain_strategy never calls it"
    assert _rel(rec.norms, plain.norms) < RTOL
    c = clip_factors(rec.norms, 0.1)
    for a, b in zip(rec.clipped_sum(c), plain.clipped_sum(c)):
        assert _rel(a, b) < RTOL


def test_the_kernel_is_bit_identical_over_threads():
    if not ghost_kernel.available():
        pytest.skip("no kernel here")
    torch.manual_seed(0)
    net = Head(nn.Conv2d(3, 48, 3, stride=2, padding=1))
    x = torch.randn(2 * 9, 3, 9, 9)
    threads = torch.get_num_threads()
    out = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            rec = GhostClipper(net, _force(FUSED)).record(lambda: net(x).reshape(9, 2).mean(1))
            out.append((rec.sq_norms, rec.clipped_sum(torch.linspace(0.1, 1, 9))))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(out[0][0], out[1][0]) and all(torch.equal(a, b) for a, b in zip(out[0][1], out[1][1]))


def test_dpgen_ghost_kernel_0_keeps_the_clipper_off_the_kernel(monkeypatch, caplog):
    calls = _spy_kernel(monkeypatch)
    monkeypatch.setenv(ghost_kernel.ENV, "0")
    monkeypatch.setattr(ghost_kernel, "_state", {})
    with caplog.at_level("INFO", logger="dpgen"):
        assert not ghost_kernel.available() and not ghost_kernel.available()
    assert [r.getMessage() for r in caplog.records] == [
        "grad_backend=ghost: DPGEN_GHOST_KERNEL=0, the convolutions take the PyTorch path"]
    torch.manual_seed(0)
    d = ProjectionDiscriminator(10, [1, 28, 28], width=8)
    x, y = torch.rand(4, 1, 28, 28), torch.randint(0, 10, (4,))
    _check(Head(d.features), x, 1)
    GhostClipper(d).record(lambda: d(x, y))
    assert calls == []


def test_the_kernel_refuses_what_it_cannot_read():
    if not ghost_kernel.available():
        pytest.skip("no kernel here")
    x, gz = torch.randn(4, 2, 6, 6), torch.randn(4, 16, 6, 6)
    grads, sq = torch.zeros(4, 18, 16), torch.zeros(4)
    ghost_kernel.conv_record_grads(x, gz, grads, sq, 1, (3, 3), (1, 1), (1, 1), (1, 1))
    with pytest.raises(ValueError, match="contiguous"):
        ghost_kernel.conv_record_grads(x.transpose(2, 3), gz, grads, sq, 1, (3, 3), (1, 1), (1, 1), (1, 1))
    with pytest.raises(ValueError, match="does not match"):
        ghost_kernel.conv_record_grads(x, gz, grads, sq, 1, (3, 3), (1, 1), (0, 0), (1, 1))
    with pytest.raises(ValueError, match="bad shapes"):
        ghost_kernel.conv_record_grads(x, gz, grads, sq, 2, (3, 3), (1, 1), (1, 1), (1, 1))
    bias, bias_sq = torch.zeros(4, 16), torch.zeros(4)
    ghost_kernel.conv_record_grads(x, gz, grads, sq, 1, (3, 3), (1, 1), (1, 1), (1, 1), bias, bias_sq)
    assert torch.allclose(bias, gz.sum((2, 3)), atol=1e-5) and torch.allclose(bias_sq, bias.square().sum(1))
    with pytest.raises(ValueError, match="come together"):
        ghost_kernel.conv_record_grads(x, gz, grads, sq, 1, (3, 3), (1, 1), (1, 1), (1, 1), bias)
    with pytest.raises(ValueError, match="bad shapes"):
        ghost_kernel.conv_record_grads(x, gz, grads, sq, 1, (3, 3), (1, 1), (1, 1), (1, 1), torch.zeros(4, 8), bias_sq)


def test_no_weight_gradient_is_computed_and_nothing_reaches_grad():
    torch.manual_seed(0)
    net = Head(nn.Conv2d(2, 3, 3))
    calls = []
    real = torch.ops.aten.convolution_backward.default

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is real:
                calls.append(tuple(args[-1]))
            return func(*args, **(kwargs or {}))

    x = torch.randn(4, 2, 5, 5)
    with Spy():
        rec = GhostClipper(net, _force(GHOST)).record(lambda: net(x))
    assert calls == [], "the backward stops at the layer's output: no weight-gradient product"
    rec.clipped_sum(torch.ones(4))
    assert all(p.grad is None for p in net.parameters())


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("how", HOWS)
def test_a_clippers_reused_buffers_carry_nothing_from_one_batch_to_the_next(how, k):
    """Batch after batch through one clipper (its padded inputs, patches and per-record gradients in buffers kept
    between batches): the norms and clipped sums of a fresh clipper, bit for bit, also when the batch shrinks;
    the buffers are the same tensors from the second batch on (no new memory per step)."""
    torch.manual_seed(0)
    d = ProjectionDiscriminator(10, [1, 28, 28], width=8)
    g = torch.Generator().manual_seed(4)
    clipper = GhostClipper(d, _force(how))
    kept = None
    for records in (6, 6, 4):
        x, y = torch.rand(records * k, 1, 28, 28, generator=g), torch.randint(0, 10, (records * k,), generator=g)
        c = torch.rand(records, generator=g)
        rec = clipper.record(lambda: d(x, y).reshape(records, k).mean(1))
        fresh = GhostClipper(d, _force(how)).record(lambda: d(x, y).reshape(records, k).mean(1))
        assert torch.equal(rec.sq_norms, fresh.sq_norms)
        assert all(torch.equal(a, b) for a, b in zip(rec.clipped_sum(c), fresh.clipped_sum(c)))
        if kept is None:
            kept = dict(clipper._scratch)
        elif records == 6:
            assert clipper._scratch.keys() == kept.keys() and all(clipper._scratch[n] is b for n, b in kept.items())
    assert kept or how == GROUPED, "the convolutions use buffers (a grouped convolution allocates its own)"


def test_clipped_sum_refuses_a_batch_whose_buffers_a_later_batch_reused():
    d = ProjectionDiscriminator(10, [1, 28, 28], width=8)
    x, y = torch.rand(4, 1, 28, 28), torch.randint(0, 10, (4,))
    clipper = GhostClipper(d)
    first = clipper.record(lambda: d(x, y))
    clipper.record(lambda: d(x, y)).clipped_sum(torch.ones(4))
    with pytest.raises(RuntimeError, match="after the next batch was recorded"):
        first.clipped_sum(torch.ones(4))


@pytest.mark.parametrize("how", HOWS)
def test_no_autograd_graph_runs_through_the_norms_or_the_clipped_sum(how):
    """The reductions run without autograd: a graph through them would keep every layer's patches and Gram inputs
    alive as long as the norms, and as long as the gradients the clipped sum is written into (about half the
    reduction's peak memory for feta's paper UNet at K = 32, docs/performance.md)."""
    torch.manual_seed(0)
    d = ProjectionDiscriminator(10, [1, 28, 28], width=8)
    x, y = torch.rand(6, 1, 28, 28), torch.randint(0, 10, (6,))
    factor = torch.rand(6, requires_grad=True)  # a factor that carries a graph must not pass it on either
    rec = GhostClipper(d, _force(how)).record(lambda: d(x, y))
    assert not rec.sq_norms.requires_grad and not rec.norms.requires_grad
    assert all(not part.sq.requires_grad for _, part in rec.parts)
    assert all(not s.requires_grad for s in rec.clipped_sum(factor))


def test_unsupported_layers_and_inplace_outputs_are_refused():
    with pytest.raises(ValueError, match=r"layer 1 \(BatchNorm2d\).*no ghost-norm rule"):
        GhostClipper(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)))
    with pytest.raises(ValueError, match="ConvTranspose2d"):
        GhostClipper(nn.ConvTranspose2d(1, 2, 3))
    with pytest.raises(ValueError, match="Conv2d"):
        GhostClipper(nn.Conv2d(2, 2, 3, groups=2))
    GhostClipper(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2).requires_grad_(False)))  # frozen: fine
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.LeakyReLU(0.2, inplace=True))
    with pytest.raises(RuntimeError, match="modified in place"):
        GhostClipper(net).record(lambda: net(torch.randn(2, 1, 5, 5)).flatten(1).sum(1))


def test_bf16_keeps_every_dp_quantity_fp32():
    torch.manual_seed(0)
    d = ProjectionDiscriminator(10, [1, 28, 28], width=8)
    g = torch.Generator().manual_seed(3)
    x, y, t = torch.rand(8, 1, 28, 28, generator=g), torch.randint(0, 10, (8,), generator=g), torch.ones(8)

    def losses():
        return F.binary_cross_entropy_with_logits(d(x, y), t, reduction="none")

    clipper = GhostClipper(d)
    ref = GhostClipper(d).record(losses)  # its own clipper: a clipper's next record() reuses its buffers
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rec = clipper.record(losses)
        sums = rec.clipped_sum(clip_factors(rec.norms, 0.1))
    assert rec.norms.dtype == torch.float32 and all(s.dtype == torch.float32 for s in sums)
    assert _rel(rec.norms, ref.norms) < 3e-2, "bf16's forward and backward: within bf16's tolerance"
    for s, r in zip(sums, ref.clipped_sum(clip_factors(ref.norms, 0.1))):
        assert _rel(s, r) < 5e-2


# ---- feta / dpdm: the micro-batch step ------------------------------------------------------------------------

def _unet(seed: int = 0) -> EDMDenoiser:
    torch.manual_seed(seed)
    return EDMDenoiser(UNet(1, 8, 3, nf=4, ch_mult=[1, 2], num_res_blocks=1, attn_res=[4]))


@pytest.mark.parametrize("k", [1, 3])
def test_feta_ghost_step_equals_torch_func(k):
    """The whole clipped sum of a Poisson batch in micro-batches (the last one a remainder), the same draws."""
    net = _unet()
    x = torch.rand(7, 1, 8, 8, generator=torch.Generator().manual_seed(1)) * 2 - 1
    y = torch.tensor([0, 1, 2, 3, 1, 0, 2])
    out = {}
    for backend in ("torch_func", "ghost"):
        step = MicroStep(net, 0.02, grad_backend=backend)
        out[backend] = clipped_grad_sum_func(net, x, y, k, 0.02, 3, secret_generator("cpu", seed=4), step=step)
    (s_f, l_f), (s_g, l_g) = out["torch_func"], out["ghost"]
    for a, b in zip(s_g, s_f):
        assert a.dtype == torch.float32 and _rel(a, b) < RTOL
    assert _rel(l_g, l_f) < RTOL
    assert float(torch.sqrt(sum(a.pow(2).sum() for a in s_g))) <= 7 * 0.02 * (1 + 1e-5)


def test_feta_ghost_padded_rows_add_exactly_zero():
    net, m, k = _unet(), 5, 2
    g = torch.Generator().manual_seed(0)
    x = torch.rand(m * k, 1, 8, 8, generator=g) * 2 - 1
    sigma, noise = edm_draws(x, g)
    batch = (x.reshape(m, k, 1, 8, 8), torch.randint(0, 3, (m, k), generator=g), sigma.reshape(m, k),
             noise.reshape(m, k, 1, 8, 8))
    (s0, l0), (s1, l1) = (MicroStep(net, 0.01, pad=pad, grad_backend="ghost")(batch, 16) for pad in (False, True))
    for a, b in zip(s1, s0):
        assert _rel(a, b) < RTOL
    assert _rel(l1, l0) < RTOL
    sums, loss = MicroStep(net, 0.01, grad_backend="ghost").fn(torch.zeros(m), *batch)
    assert all(bool((s == 0).all()) for s in sums) and float(loss) == 0.0


def test_feta_step_clip_must_be_the_stated_clip():
    net = _unet()
    with pytest.raises(ValueError, match="clips at 0.02, not at clip=0.2"):
        clipped_grad_sum_func(net, torch.zeros(2, 1, 8, 8), torch.zeros(2, dtype=torch.long), 1, 0.2, 2,
                              secret_generator("cpu", seed=1), step=MicroStep(net, 0.02, grad_backend="ghost"))


# ---- dpgan: the DP-SGD optimizer ------------------------------------------------------------------------------

class _Canaries:
    """The part of dpgen.audit.hooks.DpsgdCanaries the optimizer uses: two canaries' Dirac rows (on reserved
    coordinates 1 and 3) clipped by the optimizer's factors."""

    def __init__(self, m: int, clip: float) -> None:
        self.coordinates = nn.Parameter(torch.zeros(m))
        self.clip, self.released = clip, []

    def clipped_sum(self, factors) -> torch.Tensor:
        value = torch.full((2,), 1000.0 * self.clip)
        return torch.zeros_like(self.coordinates.detach()).index_add_(0, torch.tensor([1, 3]), factors(value) * value)

    def observe_release(self) -> None:
        self.released.append(self.coordinates.grad.detach().clone())


@pytest.mark.parametrize("canaries", [False, True])
def test_dpgan_ghost_step_equals_opacus_hooks(canaries):
    """discriminator_step with ghost norms against opacus' hooks: the same clipped sum, noise from the same secret
    stream, Adam's step; an audit's canary rows clipped and released alike."""
    import importlib

    tr = importlib.import_module("dpgen.dpgan.train")
    warnings.filterwarnings("ignore", message="Full backward hook")
    torch.manual_seed(0)
    d = ProjectionDiscriminator(10, [1, 28, 28], width=8)
    g = torch.Generator().manual_seed(1)
    x, y = torch.rand(21, 1, 28, 28, generator=g), torch.randint(0, 10, (21,), generator=g)
    nets, opts, cans = [GradSampleModule(copy.deepcopy(d), loss_reduction="sum"), copy.deepcopy(d)], [], []
    for net in nets:
        cans.append(_Canaries(5, 0.05) if canaries else None)
        opts.append(tr.DPSGDOptimizer(torch.optim.Adam(net.parameters(), lr=1e-3), noise_multiplier=0.5,
                                      max_grad_norm=0.05, expected_batch_size=10, loss_reduction="sum",
                                      generator=secret_generator("cpu", seed=3), canaries=cans[-1]))
    loss_h = tr.discriminator_step(nets[0], opts[0], x[:11], y[:11], x[11:], y[11:])
    loss_g = tr.discriminator_step(None, opts[1], x[:11], y[:11], x[11:], y[11:], ghost=GhostClipper(nets[1]))
    assert _rel(loss_g, loss_h) < RTOL
    for ph, pg in zip(nets[0]._module.parameters(), nets[1].parameters()):
        assert _rel(pg.grad, ph.grad) < RTOL and _rel(pg.detach(), ph.detach()) < RTOL
    if canaries:
        (rel_h,), (rel_g,) = cans[0].released, cans[1].released
        assert _rel(rel_g, rel_h) < RTOL and opts[1].real_rows == 21


def test_dpgan_ghost_clips_every_sample_to_c():
    """σ = 0: the released sum is the clipped sum; with every sample far above C, each adds exactly C·direction,
    so the sum's norm is at most (rows)·C, and a single sample's is C."""
    import importlib

    tr = importlib.import_module("dpgen.dpgan.train")
    torch.manual_seed(0)
    d = ProjectionDiscriminator(10, [1, 28, 28], width=8)
    opt = tr.DPSGDOptimizer(torch.optim.SGD(d.parameters(), lr=0.0), noise_multiplier=0.0, max_grad_norm=1e-4,
                            expected_batch_size=1, loss_reduction="sum", generator=secret_generator("cpu", seed=3))
    x = torch.rand(1, 1, 28, 28)
    tr.discriminator_step(None, opt, x, torch.tensor([3]), x[:0], torch.tensor([], dtype=torch.long),
                          ghost=GhostClipper(d))
    assert float(torch.sqrt(sum(p.grad.pow(2).sum() for p in d.parameters()))) == pytest.approx(1e-4, rel=1e-5)


def test_strategy_for_decides_the_materialised_convolutions_only():
    """``feta.ghost_conv``: the forced path replaces the grouped/patches choice of every k×k convolution without the
    kernel; the kernel where it runs, the ghost-norm choice, 1×1 convolutions and linear layers are unchanged."""
    assert ghost.strategy_for("auto") is strategy
    with pytest.raises(ValueError, match="must be one of auto, patches, grouped"):
        ghost.strategy_for("unfold")
    conv, one, lin = nn.Conv2d(64, 64, 3), nn.Conv2d(64, 256, 1), nn.Linear(512, 512)
    for conv_path, other in ((PATCHES, GROUPED), (GROUPED, PATCHES)):
        rule = ghost.strategy_for(conv_path)
        assert rule(conv, 32, 784, 576, 64) == FUSED
        assert plain_strategy(conv, 32, 784, 576, 64) in (PATCHES, GROUPED)
        assert rule.plain(conv, 32, 784, 576, 64) == conv_path
        assert rule.plain(nn.Conv2d(64, 256, 3), 1, 784, 576, 256) == conv_path
        assert rule.plain(one, 1, 784, 64, 256) == PATCHES
        assert rule(lin, 32, 1, 512, 512) == plain_strategy(lin, 32, 1, 512, 512) == GHOST
        assert rule.plain(nn.Conv2d(512, 512, 3), 1, 4, 4608, 512) == GHOST


@pytest.mark.parametrize("conv_path", ["patches", "grouped"])
def test_feta_ghost_step_with_a_forced_conv_path_equals_torch_func(conv_path, monkeypatch):
    """Without the kernel (as on a GPU), each ``feta.ghost_conv`` computes torch.func's clipped sum."""
    monkeypatch.setattr(ghost_kernel, "available", lambda: False)
    net, k = _unet(), 3
    x = torch.rand(7, 1, 8, 8, generator=torch.Generator().manual_seed(5)) * 2 - 1
    y = torch.tensor([0, 1, 2, 3, 1, 0, 2])
    out = {}
    for name, step in (("func", MicroStep(net, 0.02)),
                       ("ghost", MicroStep(net, 0.02, grad_backend="ghost", ghost_conv=conv_path))):
        out[name] = clipped_grad_sum_func(net, x, y, k, 0.02, 3, secret_generator("cpu", seed=4), step=step)
    for a, b in zip(out["ghost"][0], out["func"][0]):
        assert _rel(a, b) < RTOL
