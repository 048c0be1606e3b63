"""Confident-GNMax privacy costs (Papernot et al. 2018, "Scalable private learning with PATE").

Two analyses:

* data-INDEPENDENT (``privacy.accounting=sound``): every threshold check is a Gaussian with
  sensitivity 1 (one teacher changes the max count by at most 1) and noise σ1, i.e. noise
  multiplier σ1; every noisy argmax is a Gaussian on the vote histogram, whose ℓ2 sensitivity
  is √2 (one teacher moves its vote from one bin to another), i.e. noise multiplier σ2/√2.
  These are plain ledger entries; dp-accounting composes them.
* data-DEPENDENT (``privacy.accounting=paper``, what G-PATE's official code reports): Thm 6 of
  Papernot et al. 2018 (``rdp_gaussian``) applied to the threshold and argmax steps with the
  true vote counts, converted with Mironov's classic bound ε = rdp + log(1/δ)/(λ-1).  This ε is a
  function of the data and is released without smooth sensitivity, so it is NOT a DP guarantee.

All functions are vectorised over queries (rows) and orders (columns).
"""
from __future__ import annotations

import math

import numpy as np
from scipy import special, stats

#: The orders G-PATE's official code uses (1.1, 2, 3, ..., 199).
PAPER_ORDERS = np.concatenate([[1.1], np.arange(2, 200, dtype=np.float64)])

SQRT2 = math.sqrt(2.0)


def query_noise_multipliers(sigma1: float | None, sigma2: float) -> list[float]:
    """Ledger noise multipliers of ONE Confident-GNMax query: [threshold σ1/1, argmax σ2/√2].

    ``sigma1`` None: no threshold check (plain GNMax), only the argmax is released.
    """
    argmax = float(sigma2) / SQRT2
    return [argmax] if sigma1 is None else [float(sigma1), argmax]


def data_independent_rdp(sigma1: float | None, sigma2: float, orders: np.ndarray = PAPER_ORDERS) -> np.ndarray:
    """RDP of one query, λ/(2σ1²) + λ/σ2² (an upper bound on its data-dependent cost, Thm 6 takes the min)."""
    orders = np.asarray(orders, dtype=np.float64)
    out = orders / float(sigma2) ** 2
    return out if sigma1 is None else out + orders / (2.0 * float(sigma1) ** 2)


def _log1mexp(x: np.ndarray) -> np.ndarray:
    """log(1 - exp(x)) for x < 0, numerically stable."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(x < -math.log(2.0), np.log1p(-np.exp(x)), np.log(-np.expm1(x)))


def compute_logq_gaussian(counts: np.ndarray, sigma: float) -> np.ndarray:
    """log of the union bound on Pr[noisy argmax ≠ true argmax] (Papernot et al. 2018, Prop. 7).

    ``q ≤ Σ_{i≠i*} Pr[N(0, 2σ²) > n_{i*} - n_i]``, capped at ``1 - 1/B``. ``counts``: (Q, B).
    """
    counts = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    q_rows, n_bins = counts.shape
    top = counts.argmax(axis=1)
    gaps = counts[np.arange(q_rows), top][:, None] - counts
    logsf = stats.norm.logsf(gaps, scale=math.sqrt(2.0) * sigma)
    logsf[np.arange(q_rows), top] = -np.inf  # the winner does not compete with itself
    logq = special.logsumexp(logsf, axis=1)
    return np.minimum(logq, math.log(1.0 - 1.0 / n_bins))


def rdp_gaussian(logq: np.ndarray, sigma: float, orders: np.ndarray) -> np.ndarray:
    """Data-dependent RDP of GNMax (Papernot et al. 2018, Thm 6), shape (Q, L).

    With μ2 = σ√(-log q), μ1 = μ2 + 1, ε_i = μ_i/σ²: where the theorem's conditions hold
    (μ1 > λ, μ2 > 1, -log q > ε2 and q small enough for monotonicity) the cost is
    min(λ/σ², log((1-q)A^{λ-1} + qB^{λ-1})/(λ-1)) with A = (1-q)/(1-(q e^{ε2})^{(μ2-1)/μ2}) and
    B = e^{ε1}/q^{1/(μ1-1)}; elsewhere it is the data-independent λ/σ².
    """
    logq = np.atleast_1d(np.asarray(logq, dtype=np.float64))[:, None]
    orders = np.atleast_1d(np.asarray(orders, dtype=np.float64))[None, :]
    var = float(sigma) ** 2
    base = np.broadcast_to(orders / var, (logq.shape[0], orders.shape[1])).copy()
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mu2 = np.sqrt(var * -logq)
        mu1 = mu2 + 1.0
        eps1, eps2 = mu1 / var, mu2 / var
        log_a2 = (mu2 - 1.0) * eps2
        monotone = logq <= log_a2 - mu2 * (np.log1p(1.0 / (mu1 - 1.0)) + np.log1p(1.0 / (mu2 - 1.0)))
        applies = (mu1 > orders) & (mu2 > 1.0) & monotone & (-logq > eps2)
        log1q = _log1mexp(np.minimum(logq, -1e-300))
        log_a = (orders - 1.0) * (log1q - _log1mexp(np.minimum((logq + eps2) * (1.0 - 1.0 / mu2), -1e-300)))
        log_b = (orders - 1.0) * (eps1 - logq / (mu1 - 1.0))
        log_s = np.logaddexp(log1q + log_a, logq + log_b)
        dd = log_s / (orders - 1.0)
    out = np.where(applies & np.isfinite(dd), np.minimum(base, dd), base)
    return out


def compute_logpr_answered(threshold: float, sigma1: float, max_counts: np.ndarray) -> np.ndarray:
    """log Pr[round(max count) + N(0, σ1²) ≥ T] per query (the threshold check's pass probability)."""
    max_counts = np.asarray(max_counts, dtype=np.float64)
    return stats.norm.logsf(threshold - np.round(max_counts), scale=sigma1)


def rdp_threshold(logpr: np.ndarray, sigma1: float, orders: np.ndarray) -> np.ndarray:
    """Data-dependent RDP of the threshold check: Thm 6 on min(pr, 1-pr) with √2σ1.

    The check has sensitivity 1 where GNMax has √2, hence the √2 (so the data-independent
    fallback is λ/(2σ1²)).
    """
    logpr = np.asarray(logpr, dtype=np.float64)
    logq = np.minimum(logpr, _log1mexp(np.minimum(logpr, -1e-300)))
    return rdp_gaussian(logq, SQRT2 * float(sigma1), orders)


def data_dependent_rdp(counts: np.ndarray, answered: np.ndarray, threshold: float | None, sigma1: float | None,
                       sigma2: float, orders: np.ndarray = PAPER_ORDERS) -> np.ndarray:
    """Summed data-dependent RDP (over queries) of a batch of Confident-GNMax queries, shape (L,).

    Per query: threshold cost + [answered]·argmax cost, as in the official ``gnmax_thresh_aggregator``
    (``threshold`` None: no threshold check, every query answered).  A noiseless query (σ = 0, the
    ``eps=inf`` reference) has no finite cost: callers must not ask (ValueError).
    """
    if not sigma2 > 0 or (threshold is not None and not (sigma1 or 0) > 0):
        raise ValueError(f"data-dependent RDP needs positive noise, got sigma1={sigma1}, sigma2={sigma2}")
    counts = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    total = np.zeros(len(orders))
    if counts.shape[0] == 0:
        return total
    if threshold is not None:
        total = rdp_threshold(compute_logpr_answered(threshold, sigma1, counts.max(axis=1)), sigma1, orders).sum(axis=0)
    answered = np.asarray(answered, dtype=bool)
    if answered.any():
        total = total + rdp_gaussian(compute_logq_gaussian(counts[answered], sigma2), sigma2, orders).sum(axis=0)
    return total


def safe_iterations(rdp_cum: np.ndarray, per_iteration_bound: np.ndarray, delta: float, budget: float,
                    orders: np.ndarray = PAPER_ORDERS) -> int:
    """How many more iterations, each costing at most ``per_iteration_bound`` (RDP), certainly keep the
    classic ε ≤ ``budget``: max over λ of ⌊(budget - log(1/δ)/(λ-1) - rdp_cum(λ)) / bound(λ)⌋ (≥ 0).

    Lets training check the data-dependent ε only where it could cross the budget (no host sync per step).
    """
    slack = budget - math.log(1.0 / delta) / (np.asarray(orders) - 1.0) - np.asarray(rdp_cum)
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.floor(slack / np.asarray(per_iteration_bound))
    k = k[np.isfinite(k)]
    return int(max(0.0, k.max())) if k.size else 0


def classic_epsilon(rdp: np.ndarray, delta: float, orders: np.ndarray = PAPER_ORDERS) -> float:
    """Mironov 2017 Prop. 3 (G-PATE paper Thm 1): ε = min_λ rdp(λ) + log(1/δ)/(λ-1)."""
    rdp = np.asarray(rdp, dtype=np.float64)
    return float(np.min(rdp + math.log(1.0 / delta) / (np.asarray(orders) - 1.0)))
