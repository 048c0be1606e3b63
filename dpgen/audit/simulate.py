"""The f-DP bound on simulated mechanisms (no training): validity, power and tightness.

``python -m dpgen.audit.simulate [--seeds 20] [--validity 200]`` prints, for a bare Gaussian mechanism and a
Poisson-subsampled Gaussian composed T times (q = 0.1, T = 50), calibrated to ε = 1 and 4 at δ = 1e-5 (PLD), with
m = 1,000 and 10,000 canaries and the default guesses (:func:`dpgen.audit.sizes.default_guesses`):

* ``valid``: of ``--validity`` runs, how many reject the true noise scale at 95 % (at most 5 % may, up to
  binomial slack: those are the runs whose ε_lb could exceed the true ε);
* ``half``: of the same number of runs with half the noise, how many reject the claimed one (the power to see a
  mechanism with half its noise);
* ``ε_lb``: mean, min and max over ``--seeds`` runs, and the mean as a fraction of the true ε.

``--mechanism Q,STEPS,EPS [--sizes m:k,...] [--confidence c]`` does the same for one subsampled Gaussian, e.g. the
stage a run's canaries went through (its ``audit.json`` test's events), to tell a loose audit from a bound at its
limit.

Canaries are independent (as the audit's DP-SGD, G-PATE, DPAGG and sanitiser canaries are), each included by a
fair coin; a sampled canary shifts a release by 1 and the score is the log-likelihood ratio, as in
:mod:`dpgen.audit.canaries`. tests/test_audit_fdp.py runs a few of these cells.
"""
from __future__ import annotations

import argparse
import math
import sys

import numpy as np
from scipy import optimize

from dpgen.audit.fdp import CanaryEvent, NoiseFamily, critical_count, fdp_lower_bound
from dpgen.audit.sizes import default_guesses

__all__ = ["MECHANISMS", "calibrate", "simulate", "correct", "family", "one_mechanism", "main"]

DELTA = 1e-5
#: name → (sampling rate q, releases T)
MECHANISMS = {"gaussian": (1.0, 1), "subsampled": (0.1, 50)}


def calibrate(q: float, steps: int, eps: float, delta: float = DELTA) -> float:
    """The noise multiplier whose composed (subsampled) Gaussian has ``eps`` at ``delta`` (PLD)."""
    return optimize.brentq(lambda z: NoiseFamily([CanaryEvent(q, z, z, steps)], delta).epsilon(1.0) - eps,
                           0.2, 50.0, xtol=1e-4)


def family(q: float, steps: int, z: float, delta: float = DELTA) -> NoiseFamily:
    return NoiseFamily([CanaryEvent(q, z, z, steps)], delta)


def simulate(rng: np.random.Generator, m: int, q: float, steps: int, z: float,
             scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """m canaries with fair coins through ``steps`` releases of a Gaussian of multiplier z·``scale`` (shift 1),
    each holding an included canary with probability q; returns the coins and the audit's score (the
    log-likelihood ratio at multiplier z)."""
    coins = rng.integers(0, 2, m).astype(bool)
    if q >= 1.0:
        x = coins[:, None] + rng.normal(size=(m, steps)) * z * scale
        return coins, x.sum(1)
    score = np.zeros(m)
    for _ in range(steps):
        x = ((rng.random(m) < q) & coins) + rng.normal(size=m) * z * scale
        score += np.logaddexp(math.log1p(-q), math.log(q) + (x - 0.5) / z ** 2)
    return coins, score


def correct(coins: np.ndarray, score: np.ndarray, k: int) -> int:
    """Right guesses of "in" for the k highest and "out" for the k lowest scores."""
    order = np.argsort(score, kind="stable")
    return int(coins[order[len(order) - k:]].sum() + (~coins[order[:k]]).sum())


def cell(mechanism: str, eps: float, m: int, seeds: int, validity: int, rng: np.random.Generator) -> dict:
    q, steps = MECHANISMS[mechanism]
    z = calibrate(q, steps, eps)
    fam, k = family(q, steps, z), default_guesses(m)
    out = {"mechanism": mechanism, "eps": eps, "m": m, "k": k}
    if validity:
        crit = critical_count(fam.curve(1.0), m, 2 * k, 0.05)
        out["valid"] = sum(correct(*simulate(rng, m, q, steps, z), k) >= crit for _ in range(validity))
        out["half"] = sum(correct(*simulate(rng, m, q, steps, z, 0.5), k) >= crit for _ in range(validity))
    got = [fdp_lower_bound(fam, m, 2 * k, correct(*simulate(rng, m, q, steps, z), k), 0.95)["epsilon_lower_bound"]
           for _ in range(seeds)]
    out.update(mean=float(np.mean(got)), min=float(np.min(got)), max=float(np.max(got)))
    return out


def one_mechanism(q: float, steps: int, eps: float, sizes: list[tuple[int, int]], seeds: int, confidence: float,
                  rng: np.random.Generator) -> list[dict]:
    """ε_lb over ``seeds`` runs of one subsampled Gaussian (rate q, ``steps`` releases, calibrated to ``eps``) for
    each (m, k±) of ``sizes``, at ``confidence``: what the bound can show of a run's stage with those parameters."""
    z = calibrate(q, steps, eps)
    fam = family(q, steps, z)
    rows = []
    for m, k in sizes:
        got = [fdp_lower_bound(fam, m, 2 * k, correct(*simulate(rng, m, q, steps, z), k), confidence)
               ["epsilon_lower_bound"] for _ in range(seeds)]
        rows.append({"m": m, "k": k, "z": z, "mean": float(np.mean(got)), "sd": float(np.std(got, ddof=1)),
                     "min": float(np.min(got)), "max": float(np.max(got))})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20, help="runs per cell for the tightness columns")
    ap.add_argument("--validity", type=int, default=200, help="runs per cell for the validity and power columns")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mechanism", metavar="Q,STEPS,EPS", help="one subsampled Gaussian instead of the table: rate, "
                    "releases and ε (at δ = 1e-5), e.g. a run's stage from its audit.json")
    ap.add_argument("--sizes", default="10000:200", help="with --mechanism: m:k± pairs, comma-separated")
    ap.add_argument("--confidence", type=float, default=0.95, help="with --mechanism: the bound's confidence")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    if args.mechanism:
        q, steps, eps = args.mechanism.split(",")
        sizes = [tuple(int(v) for v in pair.split(":")) for pair in args.sizes.split(",")]
        print(f"| m | k± | ε_lb mean ± sd ({args.seeds} runs, {100 * args.confidence:g} %) | min / max | mean / ε |")
        print("|---|---|---|---|---|")
        for r in one_mechanism(float(q), int(steps), float(eps), sizes, args.seeds, args.confidence, rng):
            print(f"| {r['m']} | {r['k']} | {r['mean']:.2f} ± {r['sd']:.2f} | {r['min']:.2f} / {r['max']:.2f} "
                  f"| {r['mean'] / float(eps):.2f} |", flush=True)
        return 0
    print(f"| mechanism | ε | m | k± | valid (of {args.validity}) | half noise caught (of {args.validity}) "
          f"| ε_lb mean / min / max ({args.seeds} runs) | mean / ε |")
    print("|---|---|---|---|---|---|---|---|")
    for mechanism in MECHANISMS:
        for eps in (1.0, 4.0):
            for m in (1000, 10000):
                c = cell(mechanism, eps, m, args.seeds, args.validity if m == 1000 else 0, rng)
                v = f"{c['valid']}" if "valid" in c else "-"
                h = f"{c['half']}" if "half" in c else "-"
                print(f"| {mechanism} | {eps:g} | {m} | {c['k']} | {v} | {h} | {c['mean']:.2f} / {c['min']:.2f} / "
                      f"{c['max']:.2f} | {c['mean'] / eps:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
