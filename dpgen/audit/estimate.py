"""A Gaussian-DP reading of the canaries' scores: an asymptotic ESTIMATE of ε, never a bound.

In the Gaussian limit (many compositions, "Let's Ask Gauss"; Dong, Roth & Su 2022, Thm. 3.5) the scores of
included and excluded canaries are two Gaussians of equal variance whose distance in standard deviations is the
μ of μ-GDP. :func:`gaussian_estimate` reads μ̂ = (mean_in − mean_out) / pooled sd off the scores, with a normal
lower limit at the confidence (the standard error of a standardised mean difference), and converts both to ε at
δ by the μ-GDP profile. The figure is an estimate: the scores of a composed subsampled Gaussian are not exactly
Gaussian at finite T and m, and nothing bounds how far the limit is off. audit.json reports it beside the bounds;
it is never printed as ε_lb nor used for the finding.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import optimize, stats

__all__ = ["gdp_epsilon", "gaussian_estimate"]


def gdp_epsilon(mu: float, delta: float) -> float:
    """ε of μ-GDP at δ: the root of Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) = δ (0 when μ-GDP already gives δ at ε=0)."""
    mu = float(mu)
    if mu <= 0:
        return 0.0

    def excess(e: float) -> float:
        return stats.norm.cdf(-e / mu + mu / 2) - math.exp(e) * stats.norm.cdf(-e / mu - mu / 2) - delta

    if excess(0.0) <= 0:
        return 0.0
    hi = 1.0
    while excess(hi) > 0:
        hi *= 2.0
        if hi > 1e4:
            return math.inf
    return float(optimize.brentq(excess, 0.0, hi, xtol=1e-6))


def gaussian_estimate(scores: np.ndarray, coins: np.ndarray, delta: float, confidence: float) -> dict:
    """μ̂ and its ε (``epsilon``), and the normal lower limit at ``confidence`` (``mu_lower``,
    ``epsilon_lower``), from the scores of included (coin 1) and excluded canaries."""
    scores, coins = np.asarray(scores, dtype=np.float64), np.asarray(coins).astype(bool)
    a, b = scores[coins], scores[~coins]
    if len(a) < 2 or len(b) < 2:
        return {"mu": None, "epsilon": None, "mu_lower": None, "epsilon_lower": None}
    pooled = math.sqrt(((len(a) - 1) * a.var(ddof=1) + (len(b) - 1) * b.var(ddof=1)) / (len(a) + len(b) - 2))
    mu = float((a.mean() - b.mean()) / pooled) if pooled > 0 else (math.inf if a.mean() > b.mean() else 0.0)
    if not math.isfinite(mu):
        return {"mu": mu, "epsilon": math.inf, "mu_lower": mu, "epsilon_lower": math.inf}
    se = math.sqrt(1 / len(a) + 1 / len(b) + mu * mu / (2 * (len(a) + len(b))))
    low = mu - stats.norm.ppf(confidence) * se
    return {"mu": round(mu, 4), "epsilon": round(gdp_epsilon(mu, delta), 4), "mu_lower": round(low, 4),
            "epsilon_lower": round(gdp_epsilon(low, delta), 4)}
