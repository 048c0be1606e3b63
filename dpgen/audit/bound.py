"""The one-run lower bound on ε (Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training Run",
NeurIPS 2023; arXiv:2305.08846).

Setting: m canaries, each included by an independent fair coin S_i ∈ {−1, +1}; after one run the auditor
guesses T_i ∈ {−1, 0, +1} (0 = abstain), r guesses in all, and W of them are correct. If the mechanism
is (ε, δ)-DP in every coin, their main theorem bounds the tail of W by the binomial of ε-randomised response
(each guess right with probability p(ε) = e^ε / (1 + e^ε)) plus a δ term:

    P[W ≥ v]  ≤  f(v) + 2mδ · max_{1 ≤ i ≤ m} (f(v − i) − f(v)) / i,     f(v) = P[Binomial(r, p(ε)) ≥ v].

f(v − i) − f(v) = P[v − i ≤ Binomial < v] and f(u) = 1 for u ≤ 0, so i > v only lowers the ratio and the
maximum is over 1 ≤ i ≤ v (the paper's own p-value routine takes it there too). With δ = 0 the bound is the
binomial tail alone: "W is stochastically dominated by Binomial(r, p(ε))".

The right-hand side is the p-value of the hypothesis "the run is (ε, δ)-DP" given v correct guesses
(:func:`p_value`). The audit reports ε_lb (:func:`epsilon_lower_bound`): the smallest ε whose p-value reaches
1 − confidence. Every ε below it is rejected at that confidence, and since (ε, δ)-DP implies (ε', δ)-DP for
every ε' > ε, "ε_lb > the true ε" requires the test at the true ε itself to reject, which happens with
probability at most 1 − confidence: a single test, so ε_lb is a valid (1 − confidence)-level lower bound
whether or not the p-value is monotone in ε (it is, in every case we computed).
"""
from __future__ import annotations

import math

import numpy as np
from scipy import optimize, stats

__all__ = ["guess_accuracy", "p_value", "epsilon_lower_bound", "max_epsilon_lower_bound"]

#: ε beyond which the search stops: no m ≤ 10^6 canaries can certify more (p(ε)^r ≥ 0.5^... for r ≤ m)
EPS_CAP = 50.0


def guess_accuracy(eps: float) -> float:
    """p(ε) = e^ε / (1 + e^ε): the accuracy of ε-randomised response, the best an ε-DP guess can do."""
    return 1.0 / (1.0 + math.exp(-float(eps)))


def _check(m: int, r: int, v: int, delta: float) -> None:
    if not (isinstance(m, (int, np.integer)) and isinstance(r, (int, np.integer)) and isinstance(v, (int, np.integer))):
        raise TypeError(f"m, r and v must be integers, got {m!r}, {r!r}, {v!r}")
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= correct ({v}) <= guesses ({r}) <= canaries ({m})")
    if not 0.0 <= float(delta) <= 1.0:
        raise ValueError(f"delta must be in [0, 1], got {delta}")


def p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """The bound on P[W ≥ v] for an (ε, δ)-DP run with m canaries and r guesses (module docstring), capped at 1."""
    _check(m, r, v, delta)
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if v == 0:
        return 1.0
    p = guess_accuracy(eps)
    tail = float(stats.binom.sf(v - 1, r, p))  # f(v) = P[B >= v]
    if delta == 0.0:
        return min(1.0, tail)
    # P[v - i <= B < v] for i = 1..v: the cumulative sum of pmf(v-1), pmf(v-2), ..., pmf(0)
    below = np.cumsum(stats.binom.pmf(np.arange(v - 1, -1, -1), r, p))
    worst = float(np.max(below / np.arange(1, v + 1)))
    return min(1.0, tail + 2.0 * m * float(delta) * worst)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = 0.95) -> float:
    """ε_lb: the smallest ε ≥ 0 at which v correct guesses of r (m canaries) stop being implausible at the given
    confidence, i.e. p_value(ε) ≥ 1 − confidence; 0 when they are plausible at ε = 0 (nothing shown).

    The first crossing is found on a grid of step 0.01 and refined by Brent's method (to 1e-6)."""
    _check(m, r, v, delta)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    alpha = 1.0 - float(confidence)

    def excess(e: float) -> float:
        return p_value(m, r, v, e, delta) - alpha

    if excess(0.0) >= 0:
        return 0.0
    lo = 0.0
    for hi in np.arange(0.01, EPS_CAP + 1e-9, 0.01):
        if excess(float(hi)) >= 0:
            return float(optimize.brentq(excess, lo, float(hi), xtol=1e-6))
        lo = float(hi)
    return EPS_CAP


def max_epsilon_lower_bound(m: int, r: int, delta: float, confidence: float = 0.95) -> float:
    """The largest ε_lb any run can show with m canaries and r guesses: all r guesses correct."""
    return epsilon_lower_bound(m, r, r, delta, confidence)
