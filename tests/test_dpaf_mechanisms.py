"""DPAF building blocks: SIN (Eq. 3), DPAGG sensitivity/noise (Eq. 4), GC, DP-SGD clipping/noise, Fig. 7."""
from __future__ import annotations

import math

import pytest
import torch
from opacus import GradSampleModule
from torch import nn

from dpgen.dpaf.mechanisms import CompressedDPOptimizer, compress_top, dpagg, schedule, split_group
from dpgen.dpaf.nets import DpafNet, resolve_layers, sin
from dpgen.errors import DpgenError
from dpgen.privacy.randomness import secret_generator


def test_sin_gives_each_map_norm_p_and_constant_maps_zero():
    torch.manual_seed(0)
    x = torch.randn(5, 7, 6, 6) * 3 + 2
    y = sin(x, eps=1e-8)
    norms = y.flatten(2).norm(dim=2)
    torch.testing.assert_close(norms, torch.full_like(norms, 6.0), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(y.mean(dim=(2, 3)), torch.zeros(5, 7), atol=1e-5, rtol=0)
    const = sin(torch.full((2, 3, 4, 4), 5.0))
    assert torch.isfinite(const).all() and const.abs().max() == 0


def test_dpagg_sensitivity_bound_holds_for_added_or_removed_sample():
    torch.manual_seed(1)
    net = DpafNet([1, 28, 28], [1, 1, 1], width=8, out_dim=1, num_classes_in=10)
    m, p, _ = net.feat_shape
    assert net.sensitivity == pytest.approx(math.sqrt(m) * p)
    worst = 0.0
    for trial in range(20):
        x = torch.rand(9, 1, 28, 28) * (trial + 1)
        y = torch.randint(0, 10, (9,))
        with torch.no_grad():
            f = net.features(x, y)
        full, without = f.sum(0), f[1:].sum(0)  # add/remove sample 0
        worst = max(worst, (full - without).norm().item() / net.sensitivity)
    assert worst <= 1 + 1e-5
    assert worst > 0.99, "SIN makes the bound tight"


def test_dpagg_noise_std_and_scale():
    # 64·32·32 = 65536 noise draws: the sample std is within ±0.3% (one standard error) of the true std, so a
    # 3% tolerance is ten standard errors wide yet far from a halved (or doubled) sigma
    sens = math.sqrt(64) * 32
    feats = torch.randn(3, 64, 32, 32, generator=secret_generator("cpu", seed=1))
    out = dpagg(feats, sensitivity=sens, noise_multiplier=2.0, scale=4.0, generator=secret_generator("cpu", seed=0))
    assert out.shape == (1, 64, 32, 32)
    noise = out * 4 - feats.sum(0, keepdim=True)
    assert noise.std().item() == pytest.approx(2.0 * sens, rel=0.03)
    assert abs(noise.mean().item()) < 0.03 * 2.0 * sens
    ones = dpagg(torch.ones(3, 2, 2, 2), 1.0, 1e-9, 3.0, secret_generator("cpu", seed=0))
    torch.testing.assert_close(ones, torch.ones(1, 2, 2, 2))


def test_gradient_compression_keeps_top_90_percent():
    g = torch.randn(4, 100)
    c = compress_top(g, 0.9)
    assert ((c != 0).sum(1) == 90).all()
    for row, crow in zip(g, c):
        kept = row.abs()[crow != 0]
        dropped = row.abs()[crow == 0]
        assert kept.min() >= dropped.max()
    torch.testing.assert_close(c[c != 0], g[c != 0])
    assert compress_top(g, 1.0) is g


def _dp_linear(sigma: float, clip: float, keep: float):
    torch.manual_seed(0)
    lin = nn.Linear(50, 20)
    gsm = GradSampleModule(lin, loss_reduction="sum")
    opt = CompressedDPOptimizer(torch.optim.SGD(lin.parameters(), lr=1.0), noise_multiplier=sigma,
                                max_grad_norm=clip, expected_batch_size=6, loss_reduction="sum",
                                generator=secret_generator("cpu", seed=0), keep=keep)
    return lin, gsm, opt


def test_dp_sgd_clips_compressed_per_sample_gradients():
    clip = 0.01
    lin, gsm, opt = _dp_linear(0.0, clip, 0.9)
    x = torch.randn(6, 50)
    before = torch.cat([p.detach().flatten().clone() for p in lin.parameters()])
    opt.zero_grad()
    lin(x).pow(2).sum().backward()
    # reference: per-sample gradients by hand, compressed then clipped
    ref = []
    for xi in x:
        l2 = nn.Linear(50, 20)
        l2.load_state_dict({k: v.detach() for k, v in zip(("weight", "bias"), lin.parameters())})
        l2(xi[None]).pow(2).sum().backward()
        ref.append(torch.cat([l2.weight.grad.flatten(), l2.bias.grad.flatten()]))
    ref = compress_top(torch.stack(ref), 0.9)
    ref = ref * (clip / ref.norm(dim=1, keepdim=True)).clamp(max=1)
    assert (ref.norm(dim=1) <= clip * (1 + 1e-4)).all()
    opt.step()
    after = torch.cat([p.detach().flatten() for p in lin.parameters()])
    torch.testing.assert_close(before - after, ref.sum(0), rtol=1e-3, atol=1e-6)


def test_dp_sgd_noise_std_is_sigma_times_clip():
    lin, gsm, opt = _dp_linear(3.0, 0.5, 0.9)
    opt.zero_grad()
    (lin(torch.randn(6, 50)).sum() * 0).backward()
    opt.pre_step()
    noise = torch.cat([p.grad.flatten() for p in lin.parameters()])
    assert noise.std().item() == pytest.approx(1.5, rel=0.1)


def test_asymmetric_schedule_matches_fig7():
    ups = {i: schedule(i, mu=8, n_critic=3) for i in range(1, 11)}
    assert all("conv3_fc" in u for u in ups.values())
    assert [i for i, u in ups.items() if "G" in u] == [3, 6, 9]
    assert [i for i, u in ups.items() if "conv2" in u] == [8]


def test_group_split_is_disjoint_and_complete():
    idx = torch.arange(0, 100, 3)
    subs = split_group(idx, 8, secret_generator("cpu", seed=0))
    assert len(subs) == 8
    allv = torch.cat(subs)
    assert sorted(allv.tolist()) == idx.tolist()


def test_layer_split_defaults_and_validation():
    assert resolve_layers(None, 64) == [2, 2, 1] and resolve_layers(None, 128) == [3, 1, 0]
    with pytest.raises(DpgenError):
        resolve_layers([1, 0, 1], 28)
    with pytest.raises(DpgenError):
        resolve_layers([3, 3, 3], 28)
