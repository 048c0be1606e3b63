"""dpac sanitiser: per-sample clipping, noise scale, ledger entries, and that only it reaches G."""
from __future__ import annotations

import importlib
import math
from functools import partial

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from dpgen.data.base import ImageDataset, Split
from dpgen.ensemble import NetStack
from dpgen.gswgan.nets import ResNetGenerator, clf_forward, clf_init, disc_forward, disc_init
from dpgen.nets.spectral import sn_init
from dpgen.gswgan.sanitizer import Sanitizer
from dpgen.gswgan.train import generator_step
from dpgen.privacy import PrivacyLedger
from dpgen.privacy.randomness import secret_generator

from conftest import in_memory_run

SHAPE = [1, 28, 28]


def test_each_per_sample_gradient_is_clipped_before_noise():
    clip, b = 0.5, 6
    san = Sanitizer(clip, 0.0, secret_generator("cpu", seed=0))
    x = torch.randn(b, *SHAPE, requires_grad=True)
    scale = torch.arange(1, b + 1, dtype=torch.float32).view(-1, 1, 1, 1) * 10.0
    (san(x) * scale).sum().backward()  # raw per-sample gradient: scale_i * ones, norms 280*i >> clip
    assert (san.last_norms > clip).all(), "setup: every sample must need clipping"
    assert (san.last_clipped.flatten(1).norm(dim=1) <= clip * (1 + 1e-5)).all()
    # without noise the gradient reaching x is exactly mean of clipped rows
    expected = scale.expand_as(x) / san.last_norms.view(-1, 1, 1, 1) * clip / b
    torch.testing.assert_close(x.grad, expected)


def test_small_gradients_pass_unchanged_without_noise():
    san = Sanitizer(10.0, 0.0, secret_generator("cpu", seed=0))
    x = torch.randn(4, *SHAPE, requires_grad=True)
    (san(x) * 1e-3).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 1e-3 / 4))


def test_noise_std_is_two_c_z():
    clip, z = 1.5, 1.07
    san = Sanitizer(clip, z, secret_generator("cpu", seed=0))
    x = torch.randn(64, *SHAPE, requires_grad=True)
    (san(x) * 0.0).sum().backward()  # zero raw gradient: what reaches x is pure noise / B
    noise = x.grad * 64
    assert noise.std().item() == pytest.approx(2 * clip * z, rel=0.02)
    assert abs(noise.mean().item()) < 0.02 * 2 * clip * z
    assert san.noise_std == pytest.approx(2 * clip * z)


def test_several_partitions_each_row_clipped_summed_then_one_noise_draw_per_image():
    """Poisson sampling: M sampled partitions give M rows per image; each is clipped to C on its own, the M clipped
    rows are summed, ONE noise draw of std 2Cz is added per image (not M), and the release is ÷(expected M · B)."""
    clip, z, m, b = 0.5, 2.0, 3, 5
    g = torch.randn(m, b, *SHAPE) * 100.0  # every row far outside the ball
    san = Sanitizer(clip, 0.0, secret_generator("cpu", seed=0))
    out = san.sanitize_sum(g, scale=2.0)
    clipped = g.flatten(2) * (clip / g.flatten(2).norm(dim=2, keepdim=True))
    assert (san.last_clipped.flatten(1).norm(dim=1) <= clip * (1 + 1e-5)).all() and len(san.last_clipped) == m * b
    torch.testing.assert_close(san.last_signal.flatten(1), clipped.sum(0))
    torch.testing.assert_close(out, clipped.sum(0).view(b, *SHAPE) / (2.0 * b))
    noisy = Sanitizer(clip, z, secret_generator("cpu", seed=1))
    noisy.sanitize_sum(torch.zeros(m, 64, *SHAPE), scale=2.0)  # zero gradients: the release is the noise
    assert noisy.last_release.shape == (64, *SHAPE)
    assert noisy.last_release.std().item() == pytest.approx(2 * clip * z, rel=0.02), "one draw per image"
    empty = Sanitizer(clip, z, secret_generator("cpu", seed=1)).sanitize_sum(torch.zeros(0, 64, *SHAPE), scale=2.0)
    torch.testing.assert_close(empty * (2.0 * 64), noisy.last_release.view(64, *SHAPE))  # M = 0: the noise alone


def test_one_partitions_rows_move_the_release_by_at_most_2c_per_image():
    """The sensitivity the ledger charges (2C per image, 2C·√B for the B rows): replacing ONE member's rows by
    anything moves the noise-free release by at most 2C per image, whatever the other members' rows are."""
    clip, m, b = 0.5, 4, 6
    torch.manual_seed(0)
    for _ in range(20):
        g = torch.randn(m, b, *SHAPE) * torch.rand(m, b, 1, 1, 1) * 3
        h = g.clone()
        h[2] = torch.randn(b, *SHAPE) * torch.rand(b, 1, 1, 1) * 3  # another dataset: member 2's D differs
        san = Sanitizer(clip, 0.0, secret_generator("cpu", seed=0))
        a, c = san.sanitize_sum(g) * b, san.sanitize_sum(h) * b
        per_image = (a - c).flatten(1).norm(dim=1)
        assert (per_image <= 2 * clip * (1 + 1e-5)).all()
        assert (a - c).norm() <= 2 * clip * math.sqrt(b) * (1 + 1e-5)


def test_a_basis_sanitiser_clips_and_noises_the_coefficients_and_releases_only_their_span():
    """dpac.grad_basis: each row's L DCT coefficients are clipped to C and get noise std 2Cz (the same Gaussian
    mechanism as the pixel release, so the same ledger); what reaches x is U·release / B, inside span(U)."""
    from dpgen.nets.dct import dct_basis

    clip, z, b, n_basis = 0.5, 1.3, 256, 49
    basis = dct_basis(tuple(SHAPE), n_basis)
    san = Sanitizer(clip, z, secret_generator("cpu", seed=0), basis)
    x = torch.randn(b, *SHAPE, requires_grad=True)
    raw = torch.randn(b, *SHAPE) * 5.0  # norms far above the clip, most energy outside the 49 atoms
    (san(x) * raw).sum().backward()
    coeff = raw.flatten(1) @ basis
    torch.testing.assert_close(san.last_norms, coeff.norm(dim=1))
    assert san.last_clipped.shape == (b, n_basis)
    assert (san.last_clipped.norm(dim=1) <= clip * (1 + 1e-5)).all(), "clipped in coefficient space"
    noise = san.last_release - san.last_clipped
    assert noise.std().item() == pytest.approx(2 * clip * z, rel=0.03), "noise std 2Cz per coefficient"
    torch.testing.assert_close(x.grad, (san.last_release @ basis.T).view_as(x) / b)
    inside = (x.grad.flatten(1) @ basis) @ basis.T
    torch.testing.assert_close(inside, x.grad.flatten(1), atol=1e-6, rtol=0)


def test_a_basis_sanitiser_without_noise_passes_the_projected_gradient():
    from dpgen.nets.dct import dct_basis

    basis = dct_basis(tuple(SHAPE), 100)
    san = Sanitizer(100.0, 0.0, secret_generator("cpu", seed=0), basis)
    x = torch.randn(3, *SHAPE, requires_grad=True)
    raw = torch.randn(3, *SHAPE)
    (san(x) * raw).sum().backward()
    expected = ((raw.flatten(1) @ basis) @ basis.T).view_as(x) / 3
    torch.testing.assert_close(x.grad, expected)


@pytest.mark.parametrize("with_classifier,joint", [(False, False), (True, False), (True, True)])
def test_generator_update_depends_on_data_only_through_the_sanitised_release(with_classifier, joint):
    torch.manual_seed(0)
    g_net = ResNetGenerator(10, SHAPE, z_dim=10, width=8)
    opt = torch.optim.SGD(g_net.parameters(), lr=0.0)
    gi = secret_generator("cpu", seed=1)
    disc = NetStack(partial(disc_init, 10, SHAPE, 4), sn_init, 3, gi, torch.device("cpu"))
    clf = NetStack(partial(clf_init, 10, SHAPE, 4), sn_init, 1, gi, torch.device("cpu")) if with_classifier else None
    san_d = Sanitizer(1e-3, 0.7, secret_generator("cpu", seed=2))
    san_c = None if joint else Sanitizer(1e-3, 0.7, secret_generator("cpu", seed=3))
    g = secret_generator("cpu", seed=4)
    state = g.get_state()
    generator_step(g_net, opt, disc, clf, 1, san_d, san_c, 0.8, 8, 10, g)
    grads = [p.grad.clone() for p in g_net.parameters()]
    # Recompute: G's gradient must be J^T · (released sanitised gradients / B), nothing else.
    g.set_state(state)
    g_net.eval()  # reuse the spectral-norm vectors of the step (train mode would run another power iteration)
    y = torch.randint(0, 10, (8,), generator=g)
    x = g_net(g_net.sample_z(8, g), y)
    release = san_d.last_release + (san_c.last_release if with_classifier and not joint else 0.0)
    ref = torch.autograd.grad(x, list(g_net.parameters()), grad_outputs=release / 8, allow_unused=True)
    for a, r in zip(grads, ref):
        torch.testing.assert_close(a, torch.zeros_like(a) if r is None else r, rtol=1e-4, atol=1e-7)
    assert (san_d.last_norms > 1e-3).all(), "setup: clipping must be active"
    assert san_d.calls == 1
    if joint:  # the one hook saw the gradient of the whole loss, 0.8·∂D + 0.2·∂C, per sample
        xd = x.detach().requires_grad_(True)
        (p, u), (pc, uc) = disc.member(1), clf.member(0)
        whole = -(0.8 * disc_forward(p, u, xd, y).sum() + 0.2 * clf_forward(pc, uc, xd, y).sum())
        (gx,) = torch.autograd.grad(whole, xd)
        torch.testing.assert_close(san_d.last_norms, gx.flatten(1).norm(dim=1), rtol=1e-4, atol=1e-7)
    else:
        assert san_c.calls == (1 if with_classifier else 0)


def _toy_data(n: int = 120) -> ImageDataset:
    rng = np.random.default_rng(0)
    split = Split(rng.integers(0, 256, (n, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, n).astype(np.int64))
    return ImageDataset("toy", split, split, [str(i) for i in range(10)])


TINY_HP = {"num_discriminators": 4, "iters": 4, "batch_size": 6, "critic_iters": 1, "pretrain_iters": 2,
           "pretrain_chunk": 4, "gp_weight": 10.0, "drift": 1e-3, "lr": 1e-4, "betas": [0.5, 0.9], "ema": 0.9,
           "z_dim": 10, "g_width": 8, "d_width": 4, "clip": 1.0, "noise_multiplier": None, "beta": 0.8,
           "sanitize": "per_path", "classifier": {"enabled": True, "start": 2, "n_fake": 1, "n_real": 1, "fake_batch": 10, "reinit": True,
                          "order": "sequential", "loss": "wgan", "lr": None}}


def run_tiny(tmp_path, accounting="sound", target=8.0, **over):
    from dpgen.dpac import train

    hp = OmegaConf.merge(OmegaConf.create(TINY_HP), OmegaConf.create(over))
    ledger = PrivacyLedger(delta=1e-5, target_epsilon=target, accounting=accounting)
    run = in_memory_run(tmp_path, ledger)
    gen = train(hp, _toy_data(), ledger, run)
    return gen, ledger


def spy_sanitizers(monkeypatch) -> list:
    """Every Sanitizer that dpgen.gswgan.train or dpgen.dpac.method builds from now on, in order of construction."""
    tr = importlib.import_module("dpgen.gswgan.train")  # the package attribute `train` is the function
    made = []

    class Spy(tr.Sanitizer):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    monkeypatch.setattr(tr, "Sanitizer", Spy)
    monkeypatch.setattr(importlib.import_module("dpgen.dpac.method"), "Sanitizer", Spy)
    return made


def test_ledger_entries_match_the_releases(tmp_path, monkeypatch):
    made = spy_sanitizers(monkeypatch)
    gen, ledger = run_tiny(tmp_path)
    san_d, san_c = made
    assert (san_d.calls, san_c.calls) == (4, 2), "D path every iteration, C path from t_c=2"
    zp = san_d.noise_multiplier / math.sqrt(6)
    assert [(e.name, e.sampling, e.count, len(e.noise_multipliers)) for e in ledger.entries] == [
        ("dpac.generator", "poisson", 2, 1), ("dpac.generator", "poisson", 2, 2)]
    for e in ledger.entries:
        assert e.sampling_rate == pytest.approx(1 / 4)
        assert e.noise_multipliers == pytest.approx([zp] * len(e.noise_multipliers))
    # the per-sample noise std the sanitiser used is the ledger's multiplier x sqrt(B) x sensitivity 2C
    assert san_d.noise_std == pytest.approx(ledger.entries[0].noise_multipliers[0] * math.sqrt(6) * 2 * 1.0)
    assert ledger.epsilon() <= 8.0 and ledger.epsilon() == pytest.approx(8.0, rel=0.01), "z calibrated to target"
    assert any("never released" in n for n in ledger.notes)
    x, _ = gen.sample(10)
    assert x.shape == (10, 1, 28, 28) and 0 <= x.min() and x.max() <= 1


def test_joint_sanitiser_releases_one_path_and_the_ledger_charges_one(tmp_path, monkeypatch):
    """dpac.sanitize=joint (Eq. 9): one sanitiser, called once per iteration also once C is on; one Gaussian per
    iteration in the ledger, so z is calibrated for one path (smaller than per_path's at the same ε)."""
    made = spy_sanitizers(monkeypatch)
    _, ledger = run_tiny(tmp_path / "joint", sanitize="joint")
    (san,) = made
    assert san.calls == 4, "one release per iteration, C's path included"
    assert [(e.count, len(e.noise_multipliers)) for e in ledger.entries] == [(4, 1)]
    assert san.noise_std == pytest.approx(ledger.entries[0].noise_multipliers[0] * math.sqrt(6) * 2 * 1.0)
    assert ledger.epsilon() == pytest.approx(8.0, rel=0.01)
    made.clear()
    _, per_path = run_tiny(tmp_path / "per_path", sanitize="per_path")
    assert san.noise_multiplier < made[0].noise_multiplier, "two charged paths need more noise per path"


def test_budget_guard_stops_a_run_with_too_little_noise(tmp_path):
    from dpgen.gswgan.accounting import iteration_entries
    from dpgen.privacy.ledger import compute_epsilon

    gen, ledger = run_tiny(tmp_path, noise_multiplier=4.0, target=3.0, iters=50)
    total = sum(e.count for e in ledger.entries)

    def eps(n: int) -> float:  # K=4, B=6, classifier from t_c=2: the loop's own entries
        return compute_epsilon(iteration_entries(4.0, 4, 6, n, 2), 1e-5)

    assert 2 < total < 50 and ledger.epsilon() <= 3.0
    assert eps(total) <= 3.0 < eps(total + 1), "stops at the largest allowed iteration"
