"""The ε a run shows while it trains (issue 14 §4): cheap at every log step, exact where it matters.

The PLD accountant takes ~1 s per ε; refreshing it every log_every steps idles a GPU. Run shows the RDP ε
from cached curves instead (an upper bound the PLD value only tightens); budget guards and the final
report keep the ledger's own accountant.
"""
from __future__ import annotations

import logging
import math

import pytest

from dpgen.core.run import progress_epsilon
from dpgen.privacy import PrivacyLedger, compute_epsilon

from conftest import in_memory_run

Q, Z = 256 / 60000, 1.0


def _ledger(accountant: str, steps: int = 3000) -> PrivacyLedger:
    ledger = PrivacyLedger(1e-5, target_epsilon=10.0, accountant=accountant)
    ledger.record("dpsgd", [Z], "poisson", Q, count=steps)
    return ledger


@pytest.fixture
def no_pld(monkeypatch):
    """Any use of the PLD accountant fails the test."""
    import dpgen.privacy.accountants.pld as pld_mod

    class Forbidden:
        def __init__(self, *a, **k):
            raise AssertionError("the PLD accountant was called")

    monkeypatch.setattr(pld_mod.dp_pld, "PLDAccountant", Forbidden)


def test_rdp_ledger_shows_its_exact_epsilon():
    ledger = _ledger("rdp")
    assert progress_epsilon(ledger) == ("epsilon", ledger.report_epsilon())
    assert progress_epsilon(PrivacyLedger(1e-5, 1.0)) == ("epsilon", 0.0)


def test_paper_accounting_shows_the_paper_epsilon():
    ledger = _ledger("rdp")
    ledger.paper_epsilon = lambda entries, delta: 0.123
    assert progress_epsilon(ledger) == ("epsilon", 0.123)


def test_pld_ledger_shows_the_rdp_bound_without_calling_pld(no_pld):
    ledger = _ledger("pld")
    name, value = progress_epsilon(ledger)
    assert name == "epsilon_rdp"
    assert value == compute_epsilon(ledger.entries, ledger.delta, accountant="rdp")
    ledger.record("dpsgd", [Z], "poisson", Q)  # one more step raises it: it is refreshed, not frozen
    assert progress_epsilon(ledger)[1] > value


def test_the_rdp_bound_is_above_the_exact_pld_epsilon():
    exact = _ledger("pld").epsilon()
    bound = progress_epsilon(_ledger("pld"))[1]
    assert exact <= bound < 1.5 * exact, (exact, bound)


def test_privacy_off_shows_infinity(no_pld):
    ledger = PrivacyLedger(1e-5, target_epsilon=math.inf, accountant="pld")
    ledger.record("dpsgd", [0.0], "poisson", Q, count=5)
    assert progress_epsilon(ledger) == ("epsilon_rdp", math.inf)


def test_log_steps_of_a_pld_run_never_call_pld(tmp_path, no_pld, caplog):
    ledger = _ledger("pld")
    run = in_memory_run(tmp_path, ledger, log_every=2, checkpoint_every=10**6)
    run.start(6, "toy")
    with caplog.at_level(logging.INFO, logger="dpgen"):
        for step in range(1, 7):
            ledger.record("dpsgd", [Z], "poisson", Q)
            run.step_done(step, {"loss": 0.5}, lambda: {})
    run.close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert len(lines) == 3 and all("epsilon_rdp=" in line for line in lines)


def test_the_final_log_line_and_budget_guard_keep_the_exact_pld_epsilon(tmp_path, caplog, monkeypatch):
    import dpgen.privacy.budget as budget

    asked = []

    def spy(*args, accountant, **kwargs):
        asked.append(accountant)
        return 1234

    monkeypatch.setattr(budget, "calibrate_steps", spy)
    ledger = PrivacyLedger(1e-5, target_epsilon=10.0, accountant="pld")
    ledger.record("release", [5.0], count=50)  # unsampled: PLD composes it in closed form, fast
    guard = ledger.budget_guard("release", [5.0])
    assert asked == ["pld"] and guard.remaining == 1234  # the guard asks the ledger's exact accountant
    run = in_memory_run(tmp_path, ledger)
    with caplog.at_level(logging.INFO, logger="dpgen"):
        run.finish(1, {})
    run.close()
    assert f"epsilon={ledger.epsilon():.4f} (pld accountant)" in caplog.text
