"""The f-DP one-run bound (dpgen/audit/fdp.py; Mahloujifar, Melis & Chaudhuri, ICML 2025) without training.

* the trade-off curve: the closed form of μ-GDP and the PLD of a Gaussian give the same f̄⁻¹ (the PLD's never
  above it: a pessimistic profile only weakens the hypothesis);
* the recursion: with no privacy loss at all (μ = 0) the guesses are fair coins, and its critical count is no
  smaller than the binomial's; rejection is monotone in the count and in the noise scale;
* validity by simulation: canaries of a bare Gaussian mechanism and of a Poisson-subsampled Gaussian composed T
  times (numpy, no training; scores are the log-likelihood ratio, as the audit's), many seeds: the true noise
  scale is rejected in at most (1 − confidence) of them, up to binomial slack, so ε_lb ≤ the true ε;
* power: the same mechanisms with half their noise are rejected at the claimed noise in most seeds;
* tightness: ε_lb against the true ε at ε = 1 and 4 (docs/auditing.md has the table of
  ``python -m dpgen.audit.simulate``, whose functions these tests use).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpgen.audit.fdp import CanaryEvent, NoiseFamily, TradeOff, critical_count, fdp_lower_bound, rejects
from dpgen.audit.simulate import MECHANISMS, calibrate, correct, family, simulate
from dpgen.audit.sizes import default_guesses

DELTA = 1e-5


# ---- the trade-off curve and the recursion ----------------------------------------------------------------

@pytest.mark.parametrize("mu", [0.3, 1.0, 2.5])
def test_gaussian_curve_matches_gdp_and_the_pld_is_never_above_it(mu):
    """f̄⁻¹(r) = Φ(Φ⁻¹(r) − μ) for μ-GDP (Dong, Roth & Su 2022); the profile of dp-accounting's (pessimistic) PLD
    of a Gaussian of multiplier 1/μ reproduces it from below."""
    exact = TradeOff.gaussian(mu)
    pld = NoiseFamily([CanaryEvent(1.0, 1.0 / mu, 1.0 / mu, 1)], DELTA).curve(1.0)
    for r in (1e-4, 0.01, 0.1, 0.3, 0.5, 0.8, 0.99):
        truth = stats.norm.cdf(stats.norm.ppf(r) - mu)
        assert exact.fbar_inv(r) == pytest.approx(truth, rel=2e-3, abs=1e-7)
        assert pld.fbar_inv(r) <= truth + 1e-9
        assert pld.fbar_inv(r) == pytest.approx(truth, rel=5e-3, abs=1e-6)


@pytest.mark.parametrize("k", [10, 50, 200])
def test_without_privacy_loss_the_critical_count_is_no_smaller_than_the_binomials(k):
    """μ = 0: the output says nothing about the coins, every guess is a fair coin, C ~ Binomial(k, 1/2): a valid
    test may not reject at a count whose binomial tail exceeds its level."""
    curve = TradeOff.gaussian(0.0)
    assert curve.fbar_inv(0.3) == pytest.approx(0.3)
    c = critical_count(curve, 1000, k, 0.05)
    assert stats.binom.sf(c - 1, k, 0.5) <= 0.05


def test_rejection_is_monotone_in_the_count_and_the_noise_scale():
    fam = NoiseFamily([CanaryEvent(0.1, 1.5, 1.5, 20)], DELTA)
    m, k = 2000, 200
    crit = [critical_count(fam.curve(s), m, k, 0.05) for s in (0.5, 0.7, 1.0, 1.4, 2.0, 3.0)]
    assert crit == sorted(crit, reverse=True), crit  # more noise claimed: fewer right guesses reject it
    curve = fam.curve(1.0)
    flags = [rejects(curve, m, k, c, 0.05) for c in range(0, k + 1, 5)]
    assert flags == sorted(flags), "a count that rejects must keep rejecting when more guesses are right"
    # the search's bracket: the reported scale is rejected, a slightly weaker one is not
    res = fdp_lower_bound(fam, m, k, crit[2] + 10, 0.95)
    s = res["noise_scale"]
    c = crit[2] + 10
    assert rejects(fam.curve(s), m, k, c, 0.05) and not rejects(fam.curve(s / 1.01), m, k, c, 0.05)
    assert res["epsilon_lower_bound"] == pytest.approx(fam.epsilon(s), rel=1e-9)
    assert res["epsilon_lower_bound"] > res["stage_epsilon"]  # the claimed scale (s = 1) was rejected


def test_nothing_right_shows_nothing():
    fam = NoiseFamily([CanaryEvent(1.0, 2.0, 2.0, 1)], DELTA)
    assert fdp_lower_bound(fam, 1000, 100, 50, 0.95)["epsilon_lower_bound"] == 0.0


# ---- simulated mechanisms (dpgen.audit.simulate) -------------------------------------------------------------

@pytest.mark.parametrize("mechanism,eps", [("gaussian", 1.0), ("gaussian", 4.0), ("subsampled", 4.0),
                                           pytest.param("subsampled", 1.0, marks=pytest.mark.slow)])
def test_the_bound_is_valid_over_many_seeds_and_catches_half_the_noise(mechanism, eps):
    """200 runs of m = 1000 canaries, k± = 100 (the default): the true hypothesis (s = 1) is rejected in at most
    5 % of them plus binomial slack (so ε_lb ≤ the true ε at 95 %); with half the noise the claimed one is rejected
    in most runs at ε = 4 (true ε then ≈ 10) and in some at ε = 1. (slow: subsampled at ε = 1, covered by the
    other three.)"""
    q, steps = MECHANISMS[mechanism]
    z = calibrate(q, steps, eps)
    fam = family(q, steps, z)
    m, n, alpha = 1000, 200, 0.05
    k = default_guesses(m)
    crit = critical_count(fam.curve(1.0), m, 2 * k, alpha)
    rng = np.random.default_rng(int(eps * 10) + len(mechanism))
    false = sum(correct(*simulate(rng, m, q, steps, z), k) >= crit for _ in range(n))
    assert false <= alpha * n + 3 * math.sqrt(n * alpha * (1 - alpha)), (false, crit)
    caught = sum(correct(*simulate(rng, m, q, steps, z, scale=0.5), k) >= crit for _ in range(50))
    assert caught >= (40 if eps >= 4 else 5), caught


TIGHT = [  # (mechanism, ε, m, the least mean ε_lb / ε over 5 runs), what dpgen.audit.simulate measures, less slack
    ("gaussian", 4.0, 1000, 0.5),
    pytest.param("gaussian", 1.0, 10000, 0.45, marks=pytest.mark.slow),
    pytest.param("gaussian", 4.0, 10000, 0.6, marks=pytest.mark.slow),
    pytest.param("subsampled", 4.0, 10000, 0.42, marks=pytest.mark.slow),
    pytest.param("subsampled", 4.0, 1000, 0.3, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("mechanism,eps,m,floor", TIGHT)
def test_the_bound_is_tight(mechanism, eps, m, floor):
    """Mean ε_lb (95 %) of 5 runs at the default guesses against the true ε. The issue's aim, ≥ 0.5·ε at m = 1000
    for ε = 1 and 4, is met for the Gaussian at ε = 4 only; docs/auditing.md has the whole table (20 runs a
    cell). (slow: all but the first, which covers the mechanics.)"""
    q, steps = MECHANISMS[mechanism]
    z = calibrate(q, steps, eps)
    fam = family(q, steps, z)
    rng = np.random.default_rng(7)
    k = default_guesses(m)
    got = [fdp_lower_bound(fam, m, 2 * k, correct(*simulate(rng, m, q, steps, z), k), 0.95)["epsilon_lower_bound"]
           for _ in range(5)]
    assert max(got) <= eps * 1.2, got  # no run shows much more than there is
    assert np.mean(got) >= floor * eps, got


def test_the_simulation_cli_prints_its_table(capsys):
    from dpgen.audit import simulate as sim

    sim.MECHANISMS, saved = {"gaussian": (1.0, 1)}, sim.MECHANISMS
    try:
        assert sim.main(["--seeds", "1", "--validity", "2"]) == 0
    finally:
        sim.MECHANISMS = saved
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| mechanism") and len(out) == 2 + 4


def test_the_simulation_of_one_mechanism_prints_a_row_per_size(capsys):
    """--mechanism: one subsampled Gaussian calibrated to the given ε, a row per m:k± with the bound's mean."""
    from dpgen.audit import simulate as sim

    assert sim.main(["--mechanism", "0.1,50,4", "--sizes", "1000:100,1000:50", "--seeds", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| m | k±") and len(out) == 2 + 2
    cells = [line.split("|") for line in out[2:]]
    assert [c[1].strip() for c in cells] == ["1000", "1000"] and [c[2].strip() for c in cells] == ["100", "50"]
    for c in cells:
        mean = float(c[3].split("±")[0])
        assert 0.5 <= mean <= 4.0 * 1.2, out  # the simulation table: 1.67 mean at m = 1000, 100 guesses
