"""Tests for dpgen.privacy.mechanisms: clipping, Gaussian sum query, recording."""

from __future__ import annotations

import pytest
import torch

from dpgen.privacy import EventBuilder, LedgerEntry, PrivacyLedger, clip_rows, gaussian_sum_query
from dpgen.privacy.randomness import secret_generator


def _gen(seed: int) -> torch.Generator:
    return secret_generator("cpu", seed=seed)


def test_clip_rows_bounds_norms_and_keeps_small_rows():
    g = _gen(0)
    x = torch.randn(64, 3, 4, 4, generator=g) * torch.logspace(-2, 2, 64).reshape(64, 1, 1, 1)
    c = 1.5
    y = clip_rows(x, c)
    norms_x = x.reshape(64, -1).norm(dim=1)
    norms_y = y.reshape(64, -1).norm(dim=1)
    assert (norms_y <= c * (1 + 1e-6)).all()  # float32 rounding tolerance
    small = norms_x <= c
    assert small.any() and (~small).any()
    assert torch.equal(y[small], x[small])  # untouched
    assert torch.allclose(norms_y[~small], torch.full_like(norms_y[~small], c), rtol=1e-6)  # projected onto the sphere
    # direction preserved
    cos = torch.nn.functional.cosine_similarity(x.reshape(64, -1), y.reshape(64, -1), dim=1)
    assert torch.allclose(cos, torch.ones(64), atol=1e-6)
    # zero rows stay zero (no NaN)
    z = clip_rows(torch.zeros(3, 5), 1.0)
    assert torch.equal(z, torch.zeros(3, 5))
    with pytest.raises(ValueError):
        clip_rows(x, 0.0)


def test_gaussian_noise_std_matches():
    led = PrivacyLedger(1e-5)
    n_coords = 200_000
    values = torch.randn(5, n_coords, generator=_gen(1))
    z, sens = 1.7, 0.6
    out = gaussian_sum_query(values, sensitivity=sens, noise_multiplier=z, record=led, name="q", generator=_gen(2))
    noise = out - values.sum(0)
    # std estimate from 2e5 samples has relative s.e. ~ 1/sqrt(2*2e5) = 0.16%; tolerance 1%
    assert noise.std().item() == pytest.approx(z * sens, rel=0.01)
    assert abs(noise.mean().item()) < 5 * z * sens / n_coords ** 0.5
    # seeded: identical generator -> identical release
    out2 = gaussian_sum_query(values, sensitivity=sens, noise_multiplier=z, record=led, name="q", generator=_gen(2))
    assert torch.equal(out, out2)


def test_sensitivity_bound_on_neighbouring_inputs():
    # add/remove-one neighbours: D' = D plus one row.  With clipping to C and identical noise
    # draws, the releases differ exactly by the clipped extra row, whose norm is <= C.
    g = _gen(3)
    d = torch.randn(50, 20, generator=g) * 10.0
    extra = torch.randn(1, 20, generator=g) * 10.0
    c = 1.0
    led = PrivacyLedger(1e-5)
    for seed in range(5):
        a = gaussian_sum_query(d, sensitivity=c, noise_multiplier=1.0, record=led, name="s", clip_norm=c, generator=_gen(seed))
        b = gaussian_sum_query(torch.cat([d, extra]), sensitivity=c, noise_multiplier=1.0, record=led, name="s",
                               clip_norm=c, generator=_gen(seed))
        assert (b - a).norm().item() <= c * (1 + 1e-5)
    # without clipping the same neighbours differ by far more than C (the data really needs clipping)
    assert extra.norm().item() > 10 * c
    with pytest.raises(ValueError, match="clip_norm"):
        gaussian_sum_query(d, sensitivity=0.5, noise_multiplier=1.0, record=led, clip_norm=1.0, generator=_gen(0))


def test_query_records_in_ledger():
    led = PrivacyLedger(1e-5)
    x = torch.ones(8, 3)
    gaussian_sum_query(x, sensitivity=1.0, noise_multiplier=2.0, record=led, name="stats",
                       sampling="poisson", sampling_rate=0.1, clip_norm=1.0, generator=_gen(0))
    gaussian_sum_query(x, sensitivity=1.0, noise_multiplier=2.0, record=led, name="stats",
                       sampling="poisson", sampling_rate=0.1, clip_norm=1.0, generator=_gen(0))
    assert led.entries == [LedgerEntry("stats", [2.0], "poisson", 0.1, count=2, mechanism="gaussian")]
    ref = PrivacyLedger(1e-5)
    ref.record("stats", [2.0], "poisson", 0.1, count=2)
    assert led.epsilon() == ref.epsilon() > 0
    # integer histograms are accepted and released as floats
    out = gaussian_sum_query(torch.ones(4, 2, dtype=torch.long), sensitivity=1.0, noise_multiplier=1.0, record=led,
                             generator=_gen(0))
    assert out.dtype.is_floating_point and led.entries[-1].name == "gaussian_sum_query"


def test_sampled_event_composes_two_queries_into_one_entry():
    led = PrivacyLedger(1e-5)
    x = torch.randn(16, 10, generator=_gen(4))
    z1, z2, q = 1.0, 2.0, 0.01
    for _ in range(100):
        with led.sampled_event("two_stats", "poisson", q) as ev:
            assert isinstance(ev, EventBuilder)
            gaussian_sum_query(x, sensitivity=1.0, noise_multiplier=z1, record=ev, clip_norm=1.0, generator=_gen(0))
            gaussian_sum_query(x, sensitivity=1.0, noise_multiplier=z2, record=ev, clip_norm=1.0, generator=_gen(0))
    assert len(led.entries) == 1
    e = led.entries[0]
    assert e.noise_multipliers == [z1, z2] and e.count == 100 and e.sampling_rate == q
    sigma_eff = (z1 ** -2 + z2 ** -2) ** -0.5
    single = PrivacyLedger(1e-5)
    single.record("eff", [sigma_eff], "poisson", q, count=100)
    assert led.epsilon() == pytest.approx(single.epsilon(), rel=1e-12)
    separate = PrivacyLedger(1e-5)
    separate.record("a", [z1], "poisson", q, count=100)
    separate.record("b", [z2], "poisson", q, count=100)
    assert led.epsilon() > separate.epsilon() * 1.01


def test_event_builder_sampling_mismatch():
    led = PrivacyLedger(1e-5)
    with led.sampled_event("s", "poisson", 0.1) as ev:
        with pytest.raises(ValueError):
            gaussian_sum_query(torch.ones(2, 2), sensitivity=1.0, noise_multiplier=1.0, record=ev,
                               sampling="poisson", sampling_rate=0.2, generator=_gen(0))
        gaussian_sum_query(torch.ones(2, 2), sensitivity=1.0, noise_multiplier=1.0, record=ev,
                           sampling="poisson", sampling_rate=0.1, generator=_gen(0))
    assert led.entries[0].noise_multipliers == [1.0]
    with pytest.raises(TypeError):
        gaussian_sum_query(torch.ones(2, 2), sensitivity=1.0, noise_multiplier=1.0, record=None,  # type: ignore[arg-type]
                           generator=_gen(0))
    with pytest.raises(ValueError):
        gaussian_sum_query(torch.ones(2, 2), sensitivity=1.0, noise_multiplier=-1.0, record=led, generator=_gen(0))
