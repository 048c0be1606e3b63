"""``eps=inf``: the privacy-off reference. Same code, noise multiplier 0 everywhere, clipping kept, never
reported as private; every method honours it."""
from __future__ import annotations

import json
import math

import pytest
import torch

from dpgen.errors import DpgenError
from dpgen.privacy import (PRIVACY_OFF_NOTE, LedgerEntry, PrivacyLedger, calibrate_noise_multiplier,
                           calibrate_steps, compute_epsilon, gaussian_sum_query, parse_epsilon)
from dpgen.privacy.randomness import secret_generator

from tiny import METHODS, train_in_memory


@pytest.mark.parametrize("text,value", [("inf", math.inf), (".inf", math.inf), ("Infinity", math.inf),
                                        (math.inf, math.inf), ("10", 10.0), (1, 1.0), ("1e-1", 0.1)])
def test_parse_epsilon_accepts_numbers_and_inf(text, value):
    assert parse_epsilon(text) == value


@pytest.mark.parametrize("bad", ["abc", "", 0, -1, "-inf", "nan", float("nan"), True, None, [1]])
def test_parse_epsilon_rejects_the_rest_in_one_line(bad):
    with pytest.raises(DpgenError, match=r"^eps \(target epsilon\) must be a positive number or inf, got"):
        parse_epsilon(bad)


def test_noiseless_entries_have_infinite_epsilon():
    assert compute_epsilon([LedgerEntry("a", [0.0], "poisson", 0.01, count=3)], 1e-5) == math.inf
    # one noiseless release on a shared batch voids the others' noise
    mixed = LedgerEntry("b", [1.0, 0.0], "poisson", 0.01)
    assert mixed.effective_noise_multiplier == 0.0 and compute_epsilon([mixed], 1e-5) == math.inf
    assert compute_epsilon([LedgerEntry("c", [2.0], "poisson", 0.01)], 1e-5) < math.inf


def test_calibration_and_guard_under_infinite_target():
    assert calibrate_noise_multiplier(math.inf, 1e-5, lambda z: [LedgerEntry("x", [z], "poisson", 0.1, 100)]) == 0.0
    assert calibrate_steps(math.inf, 1e-5, lambda c: [LedgerEntry("x", [1.0], "poisson", 0.1, c)], max_steps=77) == 77
    ledger = PrivacyLedger(1e-5, target_epsilon=math.inf)
    assert ledger.privacy_off
    guard = ledger.budget_guard("x", [0.0], "poisson", 0.1, max_count=5)
    for _ in range(5):
        guard.step()
    assert not guard.allows(), "with no budget only the configured step count binds"
    unbounded = ledger.budget_guard("y", [0.0], "poisson", 0.1)
    assert unbounded.remaining >= 10**6


def test_privacy_json_of_a_noiseless_run_says_infinity_and_not_private():
    ledger = PrivacyLedger(1e-5, target_epsilon=math.inf)
    gaussian_sum_query(torch.ones(3, 2), sensitivity=1.0, noise_multiplier=0.0, record=ledger, name="q",
                       generator=secret_generator("cpu", seed=0))
    js = json.loads(json.dumps(ledger.to_json()))  # what atomic_write_json writes, read back
    assert js["epsilon"] == math.inf and js["sound_epsilon"] == math.inf and js["target_epsilon"] == math.inf
    assert js["valid_dp_guarantee"] is False and PRIVACY_OFF_NOTE in js["notes"]
    assert '"epsilon": Infinity' in json.dumps(ledger.to_json())
    assert PrivacyLedger.from_json(js).epsilon() == math.inf


def test_a_paper_analysis_is_not_asked_for_a_noiseless_run():
    ledger = PrivacyLedger(1e-5, target_epsilon=math.inf, accounting="paper")
    ledger.paper_epsilon = lambda entries, delta: 1.0
    ledger.record("x", [0.0], "poisson", 0.1)
    assert ledger.report_epsilon() == math.inf and not ledger.valid_dp_guarantee


def test_a_finite_target_is_not_privacy_off():
    ledger = PrivacyLedger(1e-5, target_epsilon=10.0)
    assert not ledger.privacy_off
    ledger.record("x", [1.0], "poisson", 0.1)
    assert ledger.valid_dp_guarantee


@pytest.mark.parametrize("method", METHODS)
def test_every_method_runs_noiseless_under_eps_inf(method, tmp_path):
    """A few tiny steps of each method at eps=inf: every release is recorded with noise multiplier 0 (and the
    run is reported as not private), and the configured step count, not a budget, ends training."""
    _, ledger, _ = train_in_memory(method, tmp_path, eps="inf")
    assert ledger.privacy_off and ledger.entries
    for e in ledger.entries:
        assert all(z == 0.0 for z in e.noise_multipliers), f"{method}: {e.name} still adds noise {e.noise_multipliers}"
    js = ledger.to_json()
    assert js["epsilon"] == math.inf and js["valid_dp_guarantee"] is False and PRIVACY_OFF_NOTE in js["notes"]
    _, private, _ = train_in_memory(method, tmp_path / "private", eps=10)
    steps = {e.name: e.count for e in private.entries}
    noiseless = {e.name: e.count for e in ledger.entries}
    assert set(noiseless) == set(steps), f"{method}: eps=inf must run the private run's mechanisms"
    assert sum(noiseless.values()) >= sum(steps.values()), f"{method}: eps=inf stopped before the configured steps"
