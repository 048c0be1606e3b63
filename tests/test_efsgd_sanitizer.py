"""efsgd error-feedback sanitiser: the e update, clipping of e, the DiceSGD noise scale, the
sanitised reconstruction path, and the ledger entries of a tiny run."""
from __future__ import annotations

import importlib
import math
from functools import partial

import pytest
import torch
from omegaconf import OmegaConf

from dpgen.ensemble import NetStack
from dpgen.gswgan.nets import clf_init, disc_init
from dpgen.nets.spectral import sn_init
from dpgen.efsgd.accounting import iteration_entries
from dpgen.efsgd.nets import NoiseInjectionGenerator
from dpgen.efsgd.sanitizer import ErrorFeedbackSanitizer, ef_noise_std
from dpgen.efsgd.train import encoder_input, generator_step
from dpgen.privacy import PrivacyLedger, calibrate_noise_multiplier
from dpgen.privacy.ledger import compute_epsilon
from dpgen.privacy.randomness import secret_generator

from conftest import in_memory_run
from test_dpac_sanitizer import TINY_HP as DPAC_TINY_HP

SHAPE = [1, 28, 28]


def _rows(*norms: float, d: int = 4) -> torch.Tensor:
    return torch.stack([torch.full((d,), n / math.sqrt(d)) for n in norms])  # rows with the given l2 norms


def _keyed(san: ErrorFeedbackSanitizer, rows: int, k: int = 0) -> ErrorFeedbackSanitizer:
    """Key the next update to partition k and distinct classes 0..rows-1 (one error state per row)."""
    san.key = (torch.tensor([k]), torch.arange(rows))
    return san


def test_error_update_and_clipping_of_e():
    c1, c2 = 1.0, 2.0
    san = ErrorFeedbackSanitizer(c1, 0.0, c2, generator=secret_generator("cpu", seed=0), parts=3, classes=2)
    g1 = _rows(5.0, 0.5)
    v1 = _keyed(san, 2, k=1).update(g1)
    torch.testing.assert_close(v1, _rows(1.0, 0.5))  # e starts at 0: v = clip(g, C1)
    torch.testing.assert_close(san.error[1], g1 - v1)  # e <- e + g - v: class 0 keeps 4.0, class 1 nothing
    assert san.error[[0, 2]].abs().sum() == 0, "only the sampled partition's states move"
    g2 = _rows(0.2, 0.2)
    v2 = _keyed(san, 2, k=1).update(g2)
    # e = (4.0, 0) is clipped to C2 = 2 before it is added back
    torch.testing.assert_close(san.last_error_clipped, _rows(2.0, 0.0))
    torch.testing.assert_close(v2, _rows(2.2, 0.2))
    torch.testing.assert_close(san.error[1], _rows(4.0, 0.0) + g2 - v2)  # (2.0, 0)
    assert (san.last_direction.norm(dim=1) <= c1 + c2 + 1e-6).all()
    v0 = _keyed(san, 2, k=0).update(torch.zeros(2, 4))  # another partition: its own (empty) states
    torch.testing.assert_close(v0, torch.zeros(2, 4))
    v3 = _keyed(san, 2, k=1).update(torch.zeros(2, 4))  # no new gradient: the remaining error is fed back
    torch.testing.assert_close(v3, _rows(2.0, 0.0))
    torch.testing.assert_close(san.error[1], torch.zeros(2, 4), atol=1e-6, rtol=0)


def test_rows_of_one_class_share_a_state_and_add_their_mean_residual():
    san = ErrorFeedbackSanitizer(1.0, 0.0, 10.0, generator=secret_generator("cpu", seed=0), parts=1, classes=3)
    san.key = (torch.tensor([0]), torch.tensor([2, 2, 0]))
    san.update(_rows(3.0, 5.0, 1.0))  # class 2: residuals 2 and 4 -> mean 3; class 0: none
    torch.testing.assert_close(san.error[0, 2], _rows(3.0)[0])
    assert san.error[0, [0, 1]].abs().sum() == 0
    san.key = (torch.tensor([0]), torch.tensor([2, 2, 1]))
    v = san.update(torch.zeros(3, 4))
    torch.testing.assert_close(v, _rows(3.0, 3.0, 0.0))  # both class-2 rows get clip(e[2]); class 1 has none
    torch.testing.assert_close(san.error[0, 2], torch.zeros(4), atol=1e-6, rtol=0)  # e - clip(e) + mean(-v_i) = 0


def test_without_error_feedback_it_is_dpacs_clip():
    san = ErrorFeedbackSanitizer(1.0, 0.0, 3.0, error_feedback=False, generator=secret_generator("cpu", seed=0))
    for _ in range(2):
        torch.testing.assert_close(_keyed(san, 2).update(_rows(5.0, 0.5)), _rows(1.0, 0.5))
    assert san.error is None


def test_error_clip_below_c1_is_rejected():
    """C2 < C1 only under DiceSGD's rule (its noise formula assumes C2 >= C1); the sensitivity rule's noise
    2(C1 + C2)z covers any C2 > 0, so a small C2 makes error feedback almost free (std -> 2·C1·z)."""
    with pytest.raises(ValueError, match="C2"):
        ErrorFeedbackSanitizer(1.0, 1.0, 0.5, generator=secret_generator("cpu", seed=0), rule="dicesgd")
    with pytest.raises(ValueError, match="C2"):
        ErrorFeedbackSanitizer(1.0, 1.0, 0.0, generator=secret_generator("cpu", seed=0))
    small = ErrorFeedbackSanitizer(1.0, 1.0, 0.05, generator=secret_generator("cpu", seed=0))
    assert small.noise_std == pytest.approx(2 * (1.0 + 0.05) * 1.0) and small.sensitivity == pytest.approx(2.1)


@pytest.mark.parametrize("rule", ["sensitivity", "dicesgd"])
@pytest.mark.parametrize("ef", [True, False])
def test_noise_std_follows_the_rule(ef, rule):
    c1, c2, z, b = 0.5, 1.5, 1.3, 64
    san = ErrorFeedbackSanitizer(c1, z, c2, ef, generator=secret_generator("cpu", seed=0), parts=2, classes=b,
                                 rule=rule)
    x = torch.randn(b, *SHAPE, requires_grad=True)
    (san(x, torch.tensor([1]), torch.arange(b)) * 0.0).sum().backward()  # zero gradient and error: pure noise / B
    noise = x.grad * b
    if not ef:
        expected = 2 * c1 * z  # dpac's sanitiser
    elif rule == "sensitivity":
        expected = 2 * (c1 + c2) * z  # a row moves by at most 2(C1 + C2)
    else:
        expected = 2 * c1 * z * math.sqrt(1 + 2 * c2 / c1)  # DiceSGD
    assert san.noise_std == pytest.approx(expected) == ef_noise_std(c1, c2, z, ef, rule)
    assert noise.std().item() == pytest.approx(expected, rel=0.02)
    assert abs(noise.mean().item()) < 0.02 * expected
    assert san.sensitivity == pytest.approx(2 * (c1 + c2) if ef else 2 * c1)
    assert san.accounted_multiplier == pytest.approx(expected / san.sensitivity)
    assert san.accounted_multiplier <= z * (1 + 1e-12), "the ledger never gets more noise than z"


def test_weight_scales_the_sanitised_release_only():
    san = ErrorFeedbackSanitizer(1.0, 0.0, 1.0, weight=0.25, generator=secret_generator("cpu", seed=0), classes=3)
    x = torch.randn(3, 4, requires_grad=True)
    (san(x, torch.tensor([0]), torch.arange(3)) * 100.0).sum().backward()  # raw rows of norm 200 >> C1
    torch.testing.assert_close(x.grad, san.last_direction * 0.25 / 3)
    assert (san.last_clipped.norm(dim=1) <= 1.0 + 1e-6).all()


def test_reconstruction_gradient_is_sanitised_and_is_all_that_reaches_g():
    torch.manual_seed(0)
    b, c1, c2 = 8, 1e-3, 2e-3
    g_net = NoiseInjectionGenerator(10, SHAPE, z_dim=10, width=8, noise_injection=True, sigma_noise=0.1)
    opt = torch.optim.SGD(g_net.parameters(), lr=0.0)
    gi = secret_generator("cpu", seed=1)
    disc = NetStack(partial(disc_init, 10, SHAPE, 4), sn_init, 3, gi, torch.device("cpu"))
    clf = NetStack(partial(clf_init, 10, SHAPE, 4), sn_init, 1, gi, torch.device("cpu"))
    san = {k: ErrorFeedbackSanitizer(c1, 0.7, c2, True, w, secret_generator("cpu", seed=2 + i), parts=3, classes=10)
           for i, (k, w) in enumerate([("d", 1.0), ("c", 0.25), ("e", 1.0)])}
    for s in san.values():
        s.error = torch.randn(3, 10, *SHAPE)  # non-trivial error states, so clip(e, C2) is active too
    xr = torch.rand(b, *SHAPE)
    code = encoder_input(torch.randn(b, 10), torch.arange(b) % 10, 10, True, 1.0, 0.5, secret_generator("cpu", seed=9))
    g = secret_generator("cpu", seed=4)
    state = g.get_state()
    generator_step(g_net, opt, disc, clf, torch.tensor([1]), san, b, 10, g, (code, xr.unsqueeze(0),
                                                                             torch.arange(b) % 10))
    grads = [p.grad.clone() for p in g_net.parameters()]
    e = san["e"]
    assert e.calls == 1 and (e.last_norms > c1).all(), "setup: the reconstruction gradient must need clipping"
    assert (e.last_clipped.flatten(1).norm(dim=1) <= c1 * (1 + 1e-5)).all()
    assert (e.last_error_clipped.flatten(1).norm(dim=1) <= c2 * (1 + 1e-5)).all()
    assert (e.last_direction.flatten(1).norm(dim=1) <= (c1 + c2) * (1 + 1e-5)).all(), "bounded before noise"
    # G's gradient is J^T of the weighted sanitised releases / B on both forward passes, nothing else
    g.set_state(state)
    g_net.eval()
    y = torch.randint(0, 10, (b,), generator=g)
    u_in = torch.cat([g_net.input_code(g_net.sample_z(b, g), y), code])
    out = g_net.forward_input(u_in, g)
    params = list(g_net.parameters())
    rel_x = (san["d"].last_release + 0.25 * san["c"].last_release) / b
    ref = torch.autograd.grad(out, params, grad_outputs=torch.cat([rel_x, e.last_release / b]), allow_unused=True)
    for a, r in zip(grads, ref):
        r = torch.zeros_like(a) if r is None else r
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("prior", [False, True], ids=["joint", "joint_prior"])
def test_joint_release_is_the_one_sanitised_weighted_sum_and_all_that_reaches_g(prior):
    """``efsgd.sanitize=joint``: ONE error-feedback hook sees the per-sample gradient of −D − λ_c·C (the weights
    before the clipping) and G's gradient is Jᵀ of that release (and of the reconstruction path's) / B, nothing
    else; the C sanitiser is never called. With ``encoder.code=prior`` G's reconstruction input is public: it does
    not move when the real batch and its labels change, and a row without a same-class record sends no gradient."""
    from dpgen.efsgd.train import prior_recon_batch

    torch.manual_seed(0)
    b, c1, c2, lam = 8, 1e-3, 2e-4, 0.25  # C2 < C1: allowed under the sound rule
    g_net = NoiseInjectionGenerator(10, SHAPE, z_dim=10, width=8, noise_injection=True, sigma_noise=0.1)
    opt = torch.optim.SGD(g_net.parameters(), lr=0.0)
    gi = secret_generator("cpu", seed=1)
    disc = NetStack(partial(disc_init, 10, SHAPE, 4), sn_init, 3, gi, torch.device("cpu"))
    clf = NetStack(partial(clf_init, 10, SHAPE, 4), sn_init, 1, gi, torch.device("cpu"))
    san = {k: ErrorFeedbackSanitizer(c1, 0.7, c2, True, w, secret_generator("cpu", seed=2 + i), parts=3, classes=10)
           for i, (k, w) in enumerate([("d", 1.0), ("c", lam), ("e", 1.0)])}
    for s in san.values():
        s.error = torch.randn(3, 10, *SHAPE)
    xr, yr = torch.rand(b, *SHAPE), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    recon = None
    if prior:
        pub = torch.Generator().manual_seed(5)
        recon = prior_recon_batch(g_net, xr.unsqueeze(0), yr.unsqueeze(0), 10, pub)
        pub.manual_seed(5)
        other = prior_recon_batch(g_net, torch.rand(1, b, *SHAPE), (yr.unsqueeze(0) + 5) % 10, 10, pub)
        torch.testing.assert_close(recon[0], other[0], rtol=0, atol=0)  # the code: public, data-independent
        torch.testing.assert_close(recon[2], other[2], rtol=0, atol=0)  # its labels (key the error states)
        match = recon[2].unsqueeze(1) == yr.unsqueeze(0)
        assert torch.equal(recon[3][0], match.any(1).float())
        assert all((recon[1][0, i] == xr[yr == recon[2][i]]).all(1).all(1).all(1).any()
                   for i in range(b) if recon[3][0, i])
        assert 0 < recon[3].sum() < b, "setup: some rows matched, some not"
    g = secret_generator("cpu", seed=4)
    state = g.get_state()
    generator_step(g_net, opt, disc, clf, torch.tensor([1]), san, b, 10, g, recon, joint=True)
    grads = [p.grad.clone() for p in g_net.parameters()]
    d = san["d"]
    assert d.calls == 1 and san["c"].calls == 0 and (d.last_norms > c1).all(), "one hook, clipping active"
    assert (d.last_direction.flatten(1).norm(dim=1) <= (c1 + c2) * (1 + 1e-5)).all(), "bounded before noise"
    g.set_state(state)
    g_net.eval()
    y = torch.randint(0, 10, (b,), generator=g)
    u_in = g_net.input_code(g_net.sample_z(b, g), y)
    if prior:
        u_in = torch.cat([u_in, recon[0]])
    out = g_net.forward_input(u_in, g)
    params = list(g_net.parameters())
    x = out[:b].detach().requires_grad_(True)
    (p, u), (pc, uc) = disc.member(1), clf.member(0)
    from dpgen.gswgan.nets import clf_forward, disc_forward
    whole = -(disc_forward(p, u, x, y).sum() + lam * clf_forward(pc, uc, x, y).sum())
    (gx,) = torch.autograd.grad(whole, x)
    torch.testing.assert_close(d.last_norms, gx.flatten(1).norm(dim=1), rtol=1e-4, atol=1e-7)
    rel = [d.last_release / b] + ([san["e"].last_release / b] if prior else [])
    ref = torch.autograd.grad(out, params, grad_outputs=torch.cat(rel), allow_unused=True)
    for a, r in zip(grads, ref):
        torch.testing.assert_close(a, torch.zeros_like(a) if r is None else r, rtol=1e-4, atol=1e-7)
    if prior:  # unmatched rows: zero gradient before the sanitiser (it then adds only noise)
        mask = recon[3][0]
        assert (san["e"].last_norms[mask == 0] == 0).all() and (san["e"].last_norms[mask == 1] > 0).all()


def test_encoder_code_is_clipped_and_noised():
    mu = torch.randn(16, 10) * 50
    u = encoder_input(mu, torch.arange(16) % 10, 10, True, 1.0, 0.0, secret_generator("cpu", seed=0))
    assert (u.norm(dim=1) <= 1.0 + 1e-5).all()
    raw = encoder_input(mu, torch.arange(16) % 10, 10, False, 1.0, 3.0, secret_generator("cpu", seed=0))
    torch.testing.assert_close(raw[:, :10], mu)


# ---- ledger -------------------------------------------------------------------------------

# dpac's tiny settings without β (EFSGD weights its paths with lambda_c / gamma_recon instead), plus EFSGD's keys
TINY_HP = {**{k: v for k, v in DPAC_TINY_HP.items() if k != "beta"},
           "error_feedback": True, "C2": 2.0, "noise_injection": True, "sigma_noise": 0.1, "recon": True,
           "gamma_recon": 1.0, "lambda_c": 0.25,
           "encoder": {"width": 4, "steps": 1, "kl_weight": 1e-3, "code": "prior", "code_clip": 1.0}}


def run_tiny(tmp_path, accounting="sound", target=8.0, **over):
    from test_dpac_sanitizer import _toy_data

    from dpgen.efsgd import train

    hp = OmegaConf.merge(OmegaConf.create(TINY_HP), OmegaConf.create(over))
    ledger = PrivacyLedger(delta=1e-5, target_epsilon=target, accounting=accounting)
    run = in_memory_run(tmp_path, ledger)
    return train(hp, _toy_data(), ledger, run), ledger, run


@pytest.mark.parametrize("recon,code", [(True, "prior"), (False, "prior"), (True, "private")])
def test_ledger_entries_cover_every_sanitised_path(tmp_path, monkeypatch, recon, code):
    """Every sanitised path is in the ledger: the reconstruction gradient with a public prior code (Poisson
    partitions, sound accounting), and also the released code with a private one (the paper's one uniform
    partition per iteration, which runs only under paper accounting; the sound entries are still recorded)."""
    tr = importlib.import_module("dpgen.efsgd.train")
    made = []
    orig = tr.ErrorFeedbackSanitizer

    class Spy(orig):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    monkeypatch.setattr(tr, "ErrorFeedbackSanitizer", Spy)
    # a fixed secret stream: with OS entropy, a draw whose Poisson partitions leave D's error state at zero
    # failed the last assertion now and then
    from dpgen.privacy import randomness
    monkeypatch.setattr(randomness, "secrets", type("FixedSecrets", (), {"randbits": staticmethod(lambda k: 20261130)}))
    private = code == "private"
    extra = {"sampling": "uniform"} if private else {}
    gen, ledger, run = run_tiny(tmp_path, accounting="paper" if private else "sound", recon=recon, clip=0.01,
                                C2=0.02, encoder={"code": code}, **extra)  # small C1: clipping is active
    san_d, san_c, san_e = made
    assert (san_d.calls, san_c.calls, san_e.calls) == (4, 2, 4 if recon else 0)
    # D (+ code + recon gradient) for t < t_c = 2, then + C
    paths = ([3, 4] if private else [2, 3]) if recon else [1, 2]
    assert [(e.name, e.sampling, e.count, len(e.noise_multipliers)) for e in ledger.entries] == [
        ("efsgd.generator", "poisson", 2, paths[0]), ("efsgd.generator", "poisson", 2, paths[1])]
    if private:  # paper accounting: DiceSGD's noise, recorded at what the sensitivity argument allows
        assert all(e.sampling_rate == pytest.approx(1 / 4) for e in ledger.entries)
        return
    zp = san_d.noise_multiplier / math.sqrt(6)
    for e in ledger.entries:
        assert e.sampling_rate == pytest.approx(1 / 4)
        assert e.noise_multipliers == pytest.approx([zp] * len(e.noise_multipliers))
    # the sanitisers' noise: ledger multiplier x sqrt(B) x the row sensitivity 2*(C1 + C2)
    assert san_e.noise_std == pytest.approx(zp * math.sqrt(6) * 2 * (0.01 + 0.02))
    assert ledger.epsilon() <= 8.0 and ledger.epsilon() == pytest.approx(8.0, rel=0.01)
    assert any("DiceSGD" in n for n in ledger.notes) and any("never released" in n for n in ledger.notes)
    ckpt = torch.load(run.checkpoint_path, weights_only=True)
    errors = ckpt["state"]["errors"]
    # one error state per partition (K=4) and class (10), checkpointed
    assert errors["d"]["error"].shape == (4, 10, *SHAPE) and errors["d"]["error"].abs().sum() > 0
    assert (errors["e"]["error"] is not None) == recon


def test_iteration_entries_and_calibration():
    es = iteration_entries(2.0, 10, 4, 10, 3, True, True, start=1)
    assert [(e.count, len(e.noise_multipliers)) for e in es] == [(2, 3), (7, 4)]
    assert [len(e.noise_multipliers) for e in iteration_entries(2.0, 10, 4, 10, None, True, False)] == [2]
    z = calibrate_noise_multiplier(10.0, 1e-5, lambda v: iteration_entries(v, 1000, 32, 20000, 6000, True, True))
    eps = compute_epsilon(iteration_entries(z, 1000, 32, 20000, 6000, True, True), 1e-5)
    assert eps <= 10.0 and eps == pytest.approx(10.0, rel=0.01)


def test_paper_epsilon_reuses_the_gswgan_analysis_for_efsgd_entries():
    import math

    from dpgen.efsgd.accounting import ENTRY, paper_epsilon_fn
    from dpgen.privacy import LedgerEntry

    entries = [LedgerEntry(ENTRY, [1.07 / math.sqrt(32)], "poisson", 1 / 1000, count=20000)]
    assert paper_epsilon_fn(32)(entries, 1e-5) == pytest.approx(9.9926, abs=0.01)  # accounting.md §4 oracle
    assert paper_epsilon_fn(32)([LedgerEntry("other", [1.0], "poisson", 0.001, count=10)], 1e-5) == 0.0


def test_prior_code_nearest_targets_are_same_class_records_closest_to_g():
    """``efsgd.encoder.match=nearest``: each (partition, row) target is the same-class record of that partition's
    batch nearest to G's current image of the row's public code; G's state (spectral-norm vectors) is untouched,
    and the public stream advances the same whatever the batches and however many partitions were sampled."""
    from dpgen.efsgd.train import prior_recon_batch

    torch.manual_seed(0)
    g_net = NoiseInjectionGenerator(10, SHAPE, z_dim=10, width=8, noise_injection=True, sigma_noise=0.1)
    before = {k: v.clone() for k, v in g_net.state_dict().items()}
    xr, yr = torch.rand(3, 12, *SHAPE), torch.randint(0, 3, (3, 12))
    pub = torch.Generator().manual_seed(5)
    u, targets, y, mask = prior_recon_batch(g_net, xr, yr, 3, pub, "nearest")
    state = pub.get_state()
    assert all(torch.equal(before[k], v) for k, v in g_net.state_dict().items()), "G's state must not move"
    g_net.eval()
    xg = g_net.forward_input(u, torch.Generator().manual_seed(5).set_state(
        _state_after_code(g_net, xr.shape[1], 3))).detach().flatten(1)
    for j in range(3):
        for i in range(len(y)):
            same = (yr[j] == y[i]).nonzero().squeeze(1)
            assert bool(mask[j, i]) == (len(same) > 0)
            if len(same):
                d = ((xr[j, same].flatten(1) - xg[i]) ** 2).sum(1)
                assert torch.equal(targets[j, i], xr[j, same[d.argmin()]])
    for m in (0, 1):  # another number of sampled partitions, other records: the public stream ends in the same state
        other = torch.Generator().manual_seed(5)
        prior_recon_batch(g_net, torch.rand(m, 12, *SHAPE), torch.randint(0, 3, (m, 12)), 3, other, "nearest")
        assert torch.equal(other.get_state(), state)


def _state_after_code(g_net, b: int, ncls: int) -> torch.Tensor:
    """The public stream's state after prior_recon_batch drew the rows' labels and codes (before G's noise)."""
    g = torch.Generator().manual_seed(5)
    torch.randint(0, ncls, (b,), generator=g)
    g_net.sample_z(b, g, torch.device("cpu"))
    return g.get_state()
