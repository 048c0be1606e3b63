"""DP-FETA privacy mechanics: central-image queries, DP-SGD with noise multiplicity, the ledger."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from opacus import GradSampleModule

from dpgen.feta.central import (class_histograms, mode_from_histogram, noisy_class_histograms,
                                noisy_class_means, query_central)
from dpgen.feta.dpsgd import clipped_grad_sum, set_noisy_grads
from dpgen.privacy import LedgerEntry, PrivacyLedger
from dpgen.privacy.ledger import compute_epsilon
from dpgen.privacy.randomness import secret_generator

from conftest import in_memory_run

TINY = 1e-9  # a noise multiplier small enough to read the noise-free query


def _data(n: int = 300, k: int = 3, seed: int = 0):
    g = secret_generator("cpu", seed=seed)
    x = torch.rand(n, 1, 6, 6, generator=g)
    y = torch.cat([torch.zeros(200, dtype=torch.long), torch.randint(1, k, (n - 200,), generator=g)])
    return x, y


def test_mean_query_divides_by_expected_batch_and_has_sensitivity_c_over_b_star():
    x, y = _data()
    clip, b_star = 2.0, 100.0  # class 0 has 200 records: dividing by the actual count would halve the mean
    ledger = PrivacyLedger(1e-5)
    out = noisy_class_means(x, y, 3, clip=clip, expected_batch=b_star, sigma=TINY, q=0.5, ledger=ledger,
                            generator=secret_generator("cpu", seed=0))
    ref = torch.stack([torch.stack([xi * min(1.0, clip / xi.norm().item()) for xi in x[y == c]]).sum(0) for c in range(3)])
    torch.testing.assert_close(out, ref / b_star, rtol=1e-5, atol=1e-6)
    # add one record with a large norm: only its class slot moves, by exactly C_c / B*_c
    extra = torch.full((1, 1, 6, 6), 5.0)
    out2 = noisy_class_means(torch.cat([x, extra]), torch.cat([y, torch.tensor([1])]), 3, clip=clip,
                             expected_batch=b_star, sigma=TINY, q=0.5, ledger=ledger,
                             generator=secret_generator("cpu", seed=0))
    diff = (out2 - out).flatten(1).norm(dim=1)
    assert diff[1].item() == pytest.approx(clip / b_star, rel=1e-4)
    assert diff[0].item() < 1e-6 and diff[2].item() < 1e-6
    assert diff.norm().item() <= clip / b_star * (1 + 1e-4), "the K-slot release has the sensitivity of one slot"
    # one ledger entry per round, with the Poisson rate
    assert [(e.name, e.sampling, e.sampling_rate, e.count) for e in ledger.entries] == [("feta.central_mean", "poisson", 0.5, 2)]


def test_mean_query_noise_std_is_sigma_c_times_c_over_b_star():
    x = torch.zeros(10, 1, 32, 32)
    y = torch.zeros(10, dtype=torch.long)
    sigma, clip, b_star = 3.0, 32.0, 400.0
    out = noisy_class_means(x, y, 4, clip=clip, expected_batch=b_star, sigma=sigma, q=0.1, ledger=PrivacyLedger(1e-5),
                            generator=secret_generator("cpu", seed=1))
    assert out.std().item() == pytest.approx(sigma * clip / b_star, rel=0.05)


def test_mode_histogram_sensitivity_is_sqrt_whc_and_noise_matches():
    x, y = _data()
    h = class_histograms(x, y, 3, bins=4)
    assert h.shape == (3, 1, 6, 6, 4) and h.sum().item() == 300 * 36
    h2 = class_histograms(torch.cat([x, torch.rand(1, 1, 6, 6)]), torch.cat([y, torch.tensor([2])]), 3, bins=4)
    assert (h2 - h).norm().item() == pytest.approx(math.sqrt(36))  # Theorem 3.3: sqrt(W H C)
    ledger = PrivacyLedger(1e-5)
    zeros = torch.zeros(50, 1, 20, 20)
    noisy = noisy_class_histograms(zeros, torch.zeros(50, dtype=torch.long), 3, bins=2, sigma=2.0, q=0.1, ledger=ledger,
                                   generator=secret_generator("cpu", seed=0))
    noise = noisy[1:]  # classes without records: pure noise
    assert noise.std().item() == pytest.approx(2.0 * math.sqrt(400), rel=0.05)
    assert ledger.entries[0].name == "feta.central_mode" and ledger.entries[0].noise_multipliers == [2.0]


def test_mode_is_bin_midpoint():
    hist = torch.tensor([[5.0, 1.0], [0.0, 3.0]])
    torch.testing.assert_close(mode_from_histogram(hist, 2), torch.tensor([0.25, 0.75]))  # Eq. 7 with max=1
    x = torch.tensor([0.1, 0.9, 0.9, 0.95]).reshape(4, 1, 1, 1)
    h = class_histograms(x, torch.zeros(4, dtype=torch.long), 1, bins=4)
    assert mode_from_histogram(h, 4).item() == pytest.approx(0.875)


def test_query_central_rounds_labels_and_ledger():
    x, y = _data(n=400)
    ledger = PrivacyLedger(1e-5)
    imgs, labels = query_central("mean", x, y, 3, num_images=7, q=0.25, sigma=5.0, ledger=ledger,
                                 generator=secret_generator("cpu", seed=0))
    assert imgs.shape == (7, 1, 6, 6) and imgs.min() >= 0 and imgs.max() <= 1
    assert labels.tolist() == [0, 1, 2, 0, 1, 2, 0]
    e = ledger.entries
    assert len(e) == 1 and e[0].count == 3 and e[0].sampling_rate == 0.25 and e[0].noise_multipliers == [5.0]


def test_central_cost_matches_official_history():
    """DP-FETA MNIST/F-MNIST: privacy_history [[5, 0.1, 5]] costs eps = 0.1883 at delta=1e-5 (accounting.md §4)."""
    eps = compute_epsilon([LedgerEntry("feta.central_mean", [5.0], "poisson", 0.1, count=5)], 1e-5)
    assert eps == pytest.approx(0.1883, abs=2e-4)


class _Coef(torch.nn.Module):
    """Per-row loss c_k * w·x with c_k depending on the noise draw k (rows i*K+k)."""

    def __init__(self, coefs):
        super().__init__()
        self.coefs = torch.tensor(coefs)

    def __call__(self, gsm):
        def loss_fn(xr, yr):
            c = self.coefs.repeat(xr.shape[0] // len(self.coefs))
            return c * gsm(xr).squeeze(1)
        return loss_fn


def test_noise_multiplicity_averages_before_clipping():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 1, bias=False)
    gsm = GradSampleModule(lin, loss_reduction="sum")
    x = torch.tensor([[3.0, 0.0, 4.0], [0.0, 10.0, 0.0], [0.1, 0.1, 0.1]])
    y = torch.zeros(3, dtype=torch.long)
    clip = 1.0
    sums, _ = clipped_grad_sum(gsm, _Coef([3.0, -1.0])(gsm), x, y, multiplicity=2, clip=clip, micro_batch=2)
    # per-draw gradients 3x and -x: their mean is x, clipped to norm C; clip-then-average would give ~0 for big rows
    ref = sum(xi * min(1.0, clip / xi.norm().item()) for xi in x)
    torch.testing.assert_close(sums[0].flatten(), ref, rtol=1e-5, atol=1e-6)
    wrong = sum((3 * xi * min(1.0, clip / (3 * xi).norm().item()) - xi * min(1.0, clip / xi.norm().item())) / 2 for xi in x)
    assert (sums[0].flatten() - wrong).norm() > 0.5
    assert all(p.grad_sample is None and p.grad is None for p in gsm.parameters())


def test_dpsgd_clip_bounds_each_record_and_noise_std_is_sigma_c_over_b():
    torch.manual_seed(0)
    gsm = GradSampleModule(torch.nn.Linear(4, 1, bias=False), loss_reduction="sum")
    xi = torch.tensor([[10.0, 0.0, 0.0, 0.0]])
    sums, _ = clipped_grad_sum(gsm, _Coef([1.0])(gsm), xi, torch.zeros(1, dtype=torch.long), 1, clip=0.5, micro_batch=1)
    assert sums[0].norm().item() == pytest.approx(0.5, rel=1e-5)
    p = torch.nn.Parameter(torch.zeros(200, 100))
    set_noisy_grads([p], [torch.zeros(200, 100)], sigma=2.0, clip=1.5, expected_batch=30.0,
                    generator=secret_generator("cpu", seed=0))
    assert p.grad.std().item() == pytest.approx(2.0 * 1.5 / 30.0, rel=0.03)
    assert abs(p.grad.mean().item()) < 0.01


def _hp(**over):
    base = dict(central="mean", num_central=6, central_batch=60, central_sigma=5.0, central_clip=None, bins=None,
                warmup_iters=2, warmup_batch=8, warmup_lr=3e-4, aug_ops=2, aug_magnitude=3, iters=3, batch_size=20,
                multiplicity=2, micro_batch=8, clip=1.0, noise_multiplier=None, lr=3e-4, ema=0.9, label_dropout=0.1,
                unet=dict(nf=4, ch_mult="1,1", num_res_blocks=1, attn_res=[4], dropout=0.0),
                sampler=dict(name="ddim", steps=2))
    base.update(over)
    return OmegaConf.create(base)


@pytest.mark.parametrize("central", ["mean", "mode", "none"])
def test_ledger_is_central_queries_plus_dpsgd_and_meets_target(tmp_path, central):
    from dpgen.data.base import ImageDataset, Split
    from dpgen.feta import train

    rng = np.random.default_rng(0)
    split = Split(rng.integers(0, 256, (300, 1, 8, 8), dtype=np.uint8), rng.integers(0, 3, 300).astype(np.int64))
    data = ImageDataset("toy", split, split, ["a", "b", "c"])
    ledger = PrivacyLedger(delta=1e-5, target_epsilon=3.0)
    run = in_memory_run(tmp_path, ledger)
    gen = train(_hp(central=central), data, ledger, run)
    got = [(e.name, e.sampling, round(e.sampling_rate, 6), e.count) for e in ledger.entries]
    dpsgd = ("feta.dpsgd", "poisson", round(20 / 300, 6), 3)
    if central == "none":
        assert got == [dpsgd]
    else:
        assert got == [(f"feta.central_{central}", "poisson", 0.2, 2), dpsgd]
        assert ledger.entries[0].noise_multipliers == [5.0]
    # the DP-SGD sigma was calibrated against the central entries: eps(all) hits the target from below
    eps = compute_epsilon(ledger.entries, 1e-5)
    assert eps <= 3.0 and eps == pytest.approx(3.0, rel=0.01)
    assert gen.sample(3, seed=0)[0].shape == (3, 1, 8, 8)


def _tiny_denoiser(seed: int = 0):
    from dpgen.feta.generator import FetaGenerator

    torch.manual_seed(seed)
    unet = dict(nf=4, ch_mult=[1, 1], num_res_blocks=1, attn_res=[4], dropout=0.0)
    return FetaGenerator(3, [1, 8, 8], unet, dict(name="ddim", steps=2)).net


def test_torch_func_backend_matches_opacus_hooks():
    # Both backends draw the K diffusion draws of a micro-batch in the same order from the same stream, so
    # with the same seed they must return the same Σ_i clip(mean_k ∇ℓ_ik, C), clipping active for some rows.
    from dpgen.feta.dpsgd import clipped_grad_sum_func
    from dpgen.nets.edm import edm_loss

    den = _tiny_denoiser()
    x = torch.rand(5, 1, 8, 8, generator=secret_generator("cpu", seed=1)) * 2 - 1
    y = torch.tensor([0, 1, 2, 1, 3])  # 3 = the null class of classifier-free guidance
    func_sums, func_loss = clipped_grad_sum_func(den, x, y, 3, 0.05, 2, secret_generator("cpu", seed=7))
    gsm = GradSampleModule(den, loss_reduction="sum")
    g = secret_generator("cpu", seed=7)
    hook_sums, hook_loss = clipped_grad_sum(gsm, lambda xr, yr: edm_loss(gsm, xr, yr, g), x, y, 3, 0.05, 2)
    gsm.remove_hooks()
    assert len(func_sums) == len(hook_sums)
    for a, b in zip(func_sums, hook_sums):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert float(func_loss) == pytest.approx(float(hook_loss), rel=1e-5)
    total = torch.sqrt(sum(a.pow(2).sum() for a in func_sums))
    assert 0 < total <= 5 * 0.05 + 1e-6  # five records, each of norm <= C


def test_torch_func_backend_clips_each_record_to_c():
    from dpgen.feta.dpsgd import clipped_grad_sum_func

    den = _tiny_denoiser()
    x = torch.rand(1, 1, 8, 8, generator=secret_generator("cpu", seed=2)) * 2 - 1
    for clip in (1e-4, 1e-3):
        sums, _ = clipped_grad_sum_func(den, x, torch.tensor([1]), 2, clip, 4, secret_generator("cpu", seed=3))
        assert torch.sqrt(sum(s.pow(2).sum() for s in sums)).item() == pytest.approx(clip, rel=1e-4)
    assert all(p.grad is None for p in den.parameters())  # nothing leaks into .grad outside the noisy step
