"""An audit run's two files: ``audit.json`` (what was claimed, what the canaries showed) and ``audit/coins.npy``.

The coins go to ``audit/coins.npy`` only: no released file (generator.pt, privacy.json, metrics.json), log line
or tensorboard scalar holds them or anything computed from the canaries.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from dpgen.audit.bound import epsilon_lower_bound
from dpgen.audit.canaries import Canaries
from dpgen.io import atomic_write, atomic_write_json
from dpgen.privacy import PrivacyLedger

__all__ = ["attach", "run_tests", "write_report", "summary_line", "THREAT_MODEL"]

THREAT_MODEL = (
    "White box: a canary's score is a function of the mechanism's released noisy outputs at every step and of "
    "public values only, never of the secret sampling, partition draws or splits the accounting amplifies over; "
    "each canary adds at most what one record may add under the mechanism's sensitivity argument. epsilon_lb is "
    "a lower bound: a value near 0 proves nothing, a value above the claimed epsilon is a finding."
)


def attach(run, cfg: DictConfig) -> Canaries:
    """Give ``run`` the canaries of ``cfg.audit`` (coins from the run's secret stream ``audit.coins``)."""
    run.audit = Canaries(int(cfg.audit.canaries), run.secret_rng, run.device)
    return run.audit


def run_tests(canaries: Canaries, k_in: int, k_out: int, delta: float, confidence: float) -> list[dict]:
    """The audit's tests: the combined score and, when there are several channels, each channel's own score,
    each at confidence 1 − (1 − ``confidence``)/tests (Bonferroni), so that the largest ε_lb among them is a
    lower bound at ``confidence``. Returns one dict per test, the largest ε_lb first."""
    names = [None] + (list(canaries.channels) if len(canaries.channels) > 1 else [])
    each = 1.0 - (1.0 - confidence) / len(names)
    tests = []
    for name in names:
        g = canaries.guess(k_in, k_out, name)
        tests.append({"score": name or "combined", "guesses": {"in": g.k_in, "out": g.k_out, "total": g.guesses},
                      "correct": {"in": g.correct_in, "out": g.correct_out, "total": g.correct},
                      "confidence": each,
                      "epsilon_lower_bound": round(epsilon_lower_bound(canaries.m, g.guesses, g.correct, delta, each),
                                                   4)})
    return sorted(tests, key=lambda t: -t["epsilon_lower_bound"])


def write_report(canaries: Canaries, cfg: DictConfig, ledger: PrivacyLedger, n_records: int,
                 run_dir: str | Path) -> dict:
    """Guess, bound ε and write ``audit.json`` and ``audit/coins.npy`` into ``run_dir``; returns the report."""
    run_dir = Path(run_dir)
    a = cfg.audit
    delta, conf = float(ledger.delta), float(a.confidence)
    tests = run_tests(canaries, int(a.guesses_in), int(a.guesses_out), delta, conf)
    best = tests[0]
    eps_lb = best["epsilon_lower_bound"]
    claimed = float(ledger.report_epsilon()) if ledger.entries else 0.0
    included = canaries.num_included
    report = {
        "method": str(cfg.method.name),
        "dataset": str(cfg.dataset.name),
        "claimed": {"epsilon": claimed, "delta": delta, "accounting": ledger.accounting,
                    "sound_epsilon": float(ledger.epsilon()) if ledger.entries else 0.0,
                    "target_epsilon": ledger.target_epsilon,
                    "valid_dp_guarantee": ledger.valid_dp_guarantee},
        # the canaries are records of the audited run: N counts them (delta < 1/(N + m) was checked before)
        "records": {"real": int(n_records), "canaries_included": included, "total": int(n_records) + included},
        "canaries": canaries.m,
        # the test with the largest bound (of len(tests), Bonferroni-corrected: see run_tests)
        "score": best["score"],
        "guesses": best["guesses"],
        "correct": best["correct"],
        "epsilon_lower_bound": eps_lb,
        "confidence": conf,
        "max_epsilon_lower_bound": round(epsilon_lower_bound(canaries.m, best["guesses"]["total"],
                                                             best["guesses"]["total"], delta, best["confidence"]), 4),
        "finding": bool(eps_lb > claimed),
        "tests": tests,
        "insertion": [ch.describe() for ch in canaries.channels.values()],
        "coins": "audit/coins.npy",
        "threat_model": THREAT_MODEL,
    }
    coins = canaries.coins_host()
    atomic_write(run_dir / "audit" / "coins.npy", lambda fh: np.save(fh, coins, allow_pickle=False))
    atomic_write_json(report, run_dir / "audit.json")
    return report


def summary_line(report: dict) -> str:
    """``audit: dpgan eps=2 claimed, eps_lb=0.41 (95 %), 1000 canaries, 412/500 correct``."""
    eps = report["claimed"]["epsilon"]
    shown = "inf" if math.isinf(eps) else f"{eps:.3g}"
    line = (f"audit: {report['method']} eps={shown} claimed, eps_lb={report['epsilon_lower_bound']:.2f} "
            f"({100 * report['confidence']:g} %), {report['canaries']} canaries, "
            f"{report['correct']['total']}/{report['guesses']['total']} correct")
    if report.get("score", "combined") != "combined":
        line += f" (score: {report['score']})"
    return line + (" -- eps_lb ABOVE the claimed eps: a finding" if report["finding"] else "")
