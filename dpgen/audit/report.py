"""An audit run's two files: ``audit.json`` (what was claimed, what the canaries showed) and ``audit/coins.npy``.

Two lower bounds on ε are computed from the same guesses (:data:`BOUNDS`), and ``audit.bound`` picks the one the
summary line prints and the finding uses; audit.json holds both, and a Gaussian-limit estimate beside them:

* ``fdp`` (default, :mod:`dpgen.audit.fdp`): Mahloujifar, Melis & Chaudhuri's f-DP one-run test against the
  mechanism's own trade-off curve at a scaled noise: a lower bound on the ledger's ε at the true noise scale;
* ``sn`` (:mod:`dpgen.audit.bound`): Steinke, Nasr & Jagielski's bound for any (ε, δ)-DP run, the conservative
  reference;
* ``estimates.gauss`` (:mod:`dpgen.audit.estimate`): μ-GDP read off the scores' means, asymptotic, never a bound.

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
from dpgen.audit.estimate import gaussian_estimate
from dpgen.audit.fdp import NoiseFamily, fdp_lower_bound
from dpgen.audit.sizes import BOUNDS, audit_sizes
from dpgen.io import atomic_write, atomic_write_json
from dpgen.privacy import PrivacyLedger

__all__ = ["BOUNDS", "attach", "run_tests", "split_confidence", "write_report", "summary_line", "THREAT_MODEL"]

THREAT_MODEL = (
    "White box: a canary's score is a function of the mechanism's released noisy outputs at every step and of "
    "public values only, never of the secret sampling, partition draws or splits the accounting amplifies over; "
    "each canary adds at most what one record may add under the mechanism's sensitivity argument. epsilon_lb is "
    "a lower bound: a value near 0 proves nothing, a value above the claimed epsilon is a finding. The fdp bound "
    "is a lower bound on the ledger's epsilon at the noise scale the canaries show (the mechanism's own trade-off "
    "curve); the sn bound holds for any (epsilon, delta)-DP run."
)


def attach(run, cfg: DictConfig) -> Canaries:
    """Give ``run`` the canaries of ``cfg.audit`` (coins from the run's secret stream ``audit.coins``)."""
    m, _, _ = audit_sizes(cfg)
    run.audit = Canaries(m, run.secret_rng, run.device)
    return run.audit


def _test_names(canaries: Canaries) -> list[str | None]:
    return [None] + (list(canaries.channels) if len(canaries.channels) > 1 else [])


def split_confidence(channels: int, confidence: float) -> list[float]:
    """The confidence of each test: the combined score's first, then each of ``channels`` channels' own (none when
    there is one channel: its own score is the combined one). Weighted Bonferroni: the error probabilities
    1 − confidence of the tests sum to 1 − ``confidence``; the combined score, the most powerful test of a run
    whose mechanisms are all as the ledger says, takes half, the channels' own tests share the other half (they
    guard against one mechanism without its noise, which shows by far: ε_lb ~5 in the mutants)."""
    alpha = 1.0 - float(confidence)
    if channels <= 1:
        return [float(confidence)]
    return [1.0 - alpha / 2.0] + [1.0 - alpha / (2.0 * channels)] * int(channels)


def run_tests(canaries: Canaries, k_in: int, k_out: int, delta: float, confidence: float,
              bound: str = "sn") -> list[dict]:
    """One bound's tests: the combined score and, when there are several channels, each channel's own score,
    at the confidences of :func:`split_confidence` (weighted Bonferroni), so that the largest ε_lb among them is a
    lower bound at ``confidence``. Returns one dict per test, the largest ε_lb first."""
    if bound not in BOUNDS:
        raise ValueError(f"bound must be one of {BOUNDS}, got {bound!r}")
    names = _test_names(canaries)
    levels = split_confidence(len(names) - 1, confidence)
    tests = []
    for name, each in zip(names, levels):
        g = canaries.guess(k_in, k_out, name)
        test = {"score": name or "combined", "guesses": {"in": g.k_in, "out": g.k_out, "total": g.guesses},
                "correct": {"in": g.correct_in, "out": g.correct_out, "total": g.correct}, "confidence": each}
        if bound == "sn":
            test["epsilon_lower_bound"] = round(epsilon_lower_bound(canaries.m, g.guesses, g.correct, delta, each), 4)
        else:
            family = NoiseFamily(canaries.events(name), delta)
            res = fdp_lower_bound(family, canaries.m, g.guesses, g.correct, each)
            test.update({"epsilon_lower_bound": round(res["epsilon_lower_bound"], 4),
                         "noise_scale": None if res["noise_scale"] is None else round(res["noise_scale"], 4),
                         "at_cap": res["at_cap"], "critical_count": res["critical_count"],
                         "stage_epsilon": round(res["stage_epsilon"], 4),
                         "events": [e.__dict__ for e in family.events]})
        tests.append(test)
    return sorted(tests, key=lambda t: -t["epsilon_lower_bound"])


def _max_bound(canaries: Canaries, bound: str, best: dict, delta: float) -> float:
    """What the best test's guesses show when all are right."""
    k = best["guesses"]["total"]
    if bound == "sn":
        return epsilon_lower_bound(canaries.m, k, k, delta, best["confidence"])
    name = None if best["score"] == "combined" else best["score"]
    res = fdp_lower_bound(NoiseFamily(canaries.events(name), delta), canaries.m, k, k, best["confidence"])
    return res["epsilon_lower_bound"]


def write_report(canaries: Canaries, cfg: DictConfig, ledger: PrivacyLedger, n_records: int,
                 run_dir: str | Path) -> dict:
    """Guess, bound ε and write ``audit.json`` and ``audit/coins.npy`` into ``run_dir``; returns the report."""
    run_dir = Path(run_dir)
    a = cfg.audit
    _, k_in, k_out = audit_sizes(cfg)
    delta, conf, chosen = float(ledger.delta), float(a.confidence), str(a.bound)
    bounds = {}
    for name in BOUNDS:
        tests = run_tests(canaries, k_in, k_out, delta, conf, name)
        bounds[name] = {"epsilon_lower_bound": tests[0]["epsilon_lower_bound"], "score": tests[0]["score"],
                        "tests": tests}
    best = bounds[chosen]["tests"][0]
    eps_lb = best["epsilon_lower_bound"]
    claimed = float(ledger.report_epsilon()) if ledger.entries else 0.0
    included = canaries.num_included
    coins = canaries.coins_host()
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
        "bound": chosen,
        # the chosen bound's test with the largest bound (of len(tests), Bonferroni-corrected: see run_tests)
        "score": best["score"],
        "guesses": best["guesses"],
        "correct": best["correct"],
        "epsilon_lower_bound": eps_lb,
        "confidence": conf,
        "max_epsilon_lower_bound": round(_max_bound(canaries, chosen, best, delta), 4),
        "finding": bool(eps_lb > claimed),
        # the ledger's epsilon (PLD, at delta) of the releases the canaries went through: what fdp can reach
        "stage_epsilon": next(t["stage_epsilon"] for t in bounds["fdp"]["tests"] if t["score"] == "combined"),
        "bounds": bounds,
        "estimates": {"gauss": {**gaussian_estimate(canaries.scores_host(), coins, delta, conf),
                                "note": "asymptotic (Gaussian limit) estimate, not a bound"}},
        "tests": bounds[chosen]["tests"],
        "insertion": [ch.describe() for ch in canaries.channels.values()],
        "coins": "audit/coins.npy",
        "threat_model": THREAT_MODEL,
    }
    atomic_write(run_dir / "audit" / "coins.npy", lambda fh: np.save(fh, coins, allow_pickle=False))
    atomic_write_json(report, run_dir / "audit.json")
    return report


def summary_line(report: dict) -> str:
    """``audit: dpgan eps=2 claimed, eps_lb=0.41 (fdp, 95 %), 10000 canaries, 412/1000 correct``."""
    eps = report["claimed"]["epsilon"]
    shown = "inf" if math.isinf(eps) else f"{eps:.3g}"
    line = (f"audit: {report['method']} eps={shown} claimed, eps_lb={report['epsilon_lower_bound']:.2f} "
            f"({report.get('bound', 'sn')}, {100 * report['confidence']:g} %), {report['canaries']} canaries, "
            f"{report['correct']['total']}/{report['guesses']['total']} correct")
    if report.get("score", "combined") != "combined":
        line += f" (score: {report['score']})"
    return line + (" -- eps_lb ABOVE the claimed eps: a finding" if report["finding"] else "")
