"""Tests for dpgen.privacy.calibrate (oracles: /work/shared/reference/accounting.md Sec. 4)."""

from __future__ import annotations

import time

import pytest

from dpgen.errors import DpgenError
from dpgen.privacy import LedgerEntry, calibrate_noise_multiplier, calibrate_steps, compute_epsilon

Q = 256 / 60000
STEPS = 14063  # 60 epochs
DELTA = 1e-5


def _sgd(q, steps):
    return lambda z: [LedgerEntry("dpsgd", [z], "poisson", q, count=steps)]


def _eps(z, q=Q, steps=STEPS, accountant="rdp", base=()):
    return compute_epsilon(list(base) + _sgd(q, steps)(z), DELTA, accountant=accountant)


def test_calibration_oracle_mnist_rdp():
    # eps=3, delta=1e-5, q=256/60000, 60 epochs: dp_accounting 1.0140, opacus 1.015625.
    z = calibrate_noise_multiplier(3.0, DELTA, _sgd(Q, STEPS))
    assert z == pytest.approx(1.014, abs=0.005)
    assert _eps(z) <= 3.0  # conservative side
    assert _eps(z - 2e-3) > 3.0  # and within 2*tol of the crossing


def test_calibration_matches_opacus_get_noise_multiplier():
    # opacus get_noise_multiplier(8, 1e-5, q=0.04, 90 epochs) = 1.416015625 (accountants_test.py);
    # opacus stops within epsilon_tolerance=0.01 of the target, so agreement to 5e-3 in sigma.
    z = calibrate_noise_multiplier(8.0, DELTA, _sgd(0.04, 2250))
    assert z == pytest.approx(1.416015625, abs=5e-3)
    assert _eps(z, 0.04, 2250) <= 8.0


def test_calibration_pld_is_tighter_and_conservative():
    z_rdp = calibrate_noise_multiplier(3.0, DELTA, _sgd(Q, STEPS))
    z_pld = calibrate_noise_multiplier(3.0, DELTA, _sgd(Q, STEPS), accountant="pld")
    assert z_pld < z_rdp - 0.02  # measured 0.969 vs 1.014
    assert _eps(z_pld, accountant="pld") <= 3.0
    assert _eps(z_pld - 2e-3, accountant="pld") > 3.0


def test_calibration_with_history_base():
    # DP-FETA: central-image queries are prepended to the DP-SGD history before calibrating.
    base = [LedgerEntry("feta.central", [5.0], "poisson", 0.1, count=5)]
    z0 = calibrate_noise_multiplier(1.0, DELTA, _sgd(Q, 2000))
    z1 = calibrate_noise_multiplier(1.0, DELTA, _sgd(Q, 2000), base=base)
    assert z1 > z0 + 2e-3  # measured 1.1293 vs 1.1245 (tol 1e-3 each)
    assert _eps(z0, steps=2000, base=base) > 1.0  # ignoring the history would overspend
    assert _eps(z1, steps=2000, base=base) <= 1.0
    assert _eps(z1 - 2e-3, steps=2000, base=base) > 1.0
    assert _eps(z1, steps=2000) < 1.0  # without the history it would be over-noised


def test_calibration_tolerance_and_bounds():
    z = calibrate_noise_multiplier(3.0, DELTA, _sgd(Q, STEPS), tol=1e-5)
    assert _eps(z) <= 3.0 and _eps(z - 2e-5) > 3.0
    # lo already meets the target -> lo
    assert calibrate_noise_multiplier(100.0, DELTA, _sgd(Q, 10), lo=0.5) == 0.5
    # base alone exceeds the target: impossible
    base = [LedgerEntry("spent", [0.5], "poisson", 0.1, count=1000)]
    with pytest.raises(DpgenError, match="cannot reach"):
        calibrate_noise_multiplier(1.0, DELTA, _sgd(Q, 10), base=base)
    with pytest.raises(DpgenError):
        calibrate_noise_multiplier(0.0, DELTA, _sgd(Q, 10))
    with pytest.raises(DpgenError):
        calibrate_noise_multiplier(1.0, DELTA, _sgd(Q, 10), lo=2.0, hi=1.0)


def test_calibration_is_fast_for_20000_steps():
    q = 1e-3 + 1.234567e-9  # unusual q: nothing cached from other tests
    t0 = time.perf_counter()
    z = calibrate_noise_multiplier(2.0, DELTA, _sgd(q, 20000))
    elapsed = time.perf_counter() - t0
    assert _eps(z, q, 20000) <= 2.0
    assert elapsed < 5.0, f"calibration took {elapsed:.2f}s"  # measured ~0.6 s on 2 cores


def test_calibrate_steps_largest_count():
    n = calibrate_steps(3.0, DELTA, lambda c: [LedgerEntry("dpsgd", [1.1], "poisson", Q, count=c)])
    assert _eps(1.1, steps=n) <= 3.0 < _eps(1.1, steps=n + 1)
    assert 14063 < n < 30000  # the TF tutorial's 14063 steps cost only 2.6


def test_calibrate_steps_edge_cases():
    make = lambda c: [LedgerEntry("dpsgd", [1.1], "poisson", Q, count=c)]  # noqa: E731
    assert calibrate_steps(3.0, DELTA, make, max_steps=500) == 500
    assert calibrate_steps(3.0, DELTA, make, max_steps=0) == 0
    spent = [LedgerEntry("spent", [0.5], "poisson", 0.1, count=1000)]
    assert calibrate_steps(3.0, DELTA, make, base=spent) == 0
    # single huge-noise step always fits, so the cap is returned
    big = lambda c: [LedgerEntry("x", [1000.0], "none", count=c)]  # noqa: E731
    assert calibrate_steps(1.0, DELTA, big, max_steps=1234) == 1234


def test_calibrate_steps_pld():
    make = lambda c: [LedgerEntry("dpsgd", [2.0], "poisson", 0.01, count=c)]  # noqa: E731
    n = calibrate_steps(0.5, DELTA, make, accountant="pld")
    assert compute_epsilon(make(n), DELTA, "pld") <= 0.5 < compute_epsilon(make(n + 1), DELTA, "pld")
    assert n > calibrate_steps(0.5, DELTA, make)  # PLD is tighter than RDP here
