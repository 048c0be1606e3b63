"""The f-DP one-run lower bound on ε (Mahloujifar, Melis & Chaudhuri, "Auditing f-Differential Privacy in One
Run", ICML 2025; arXiv:2410.22235), tested against the mechanism's own trade-off curve.

Setting (as :mod:`dpgen.audit.bound`): m canaries, each included by an independent fair coin; after one run the
auditor makes k guesses (abstaining on the other m − k canaries) and c of them are right. The mechanism is
f-DP in every coin: for any test between "coin j = out" and "coin j = in" (every other coin fixed), type II error
≥ f(type I error), for a symmetric trade-off function f.

The theorem (MMC's main result, in its recursive numerical form): write f̄(α) = 1 − f(α) and f̄⁻¹ for its
inverse. Start with r = τ·c/m and h = τ·(k − c)/m and, for i = c − 1, …, 0:

    h' = max(h, f̄⁻¹(r)),   r ← r + i/(k − i) · (h' − h),   h ← h'.

If finally r + h > k/m, then P[at least c of the k guesses are right] ≤ τ for every f-DP mechanism, whatever
the mechanism does with the canaries (they may depend on each other) and however the guesses are made. Why:
for a canary I drawn uniformly and any event A of the other coins and the output, P[I guessed wrong ∧ A] ≥
f̄⁻¹(P[I guessed right ∧ A]) (f-DP in coin I, averaged by Jensen over the two coin values, I and the other
coins, f̄⁻¹ being convex); applied to A = "at least j − 1 of the other guesses are right" for j = c, c − 1, …
these inequalities force the expected numbers of right and wrong guesses (whose sum is k/m per canary) above
k/m when P[≥ c right] ≥ τ. :func:`rejects` runs the recursion; :func:`critical_count` gives the smallest c
it rejects, the test's critical value.

The hypothesis family (:class:`NoiseFamily`) is the run's own mechanism as the canaries see it: for each kind of
release they went through, Poisson-sampled at the ledger's rate, self-composed as often as it happened, with its
noise multiplier scaled by s (s = 1: what the ledger says). Its privacy profile δ_s(ε) comes from dp-accounting's
privacy loss distribution (pessimistic rounding, both neighbouring directions), and
f_s(α) = sup_ε max(0, 1 − δ_s(ε) − e^ε α, e^−ε (1 − δ_s(ε) − α)) (Dong, Roth & Su 2022, Prop. 2.12) on a finite
ε grid: a pessimistic profile and a finite grid only lower f_s, i.e. weaken the hypothesis, so the test stays
valid. :class:`TradeOff` holds f_s through f̄_s⁻¹ in closed form:

    f̄_s⁻¹(r) = max(0, max_ε max((r − δ_s(ε)) e^−ε, 1 − δ_s(ε) − e^ε (1 − r))).

ε_lb (:func:`fdp_lower_bound`): larger s is a stronger claim (more noise), so the rejected s form an upper
interval [s*, ∞); ε_lb = ε_s* at the run's δ by the ledger's multipliers at scale s* (the same PLD, at a finer
interval: within about 10⁻³ of the exact ε, the accuracy of dp-accounting's own PLD accountant). If the canaries'
mechanism is the ledger's at some noise scale s₀ (s₀ = 1 for a sound run; s₀ = 0.5 for a bug that halves the noise),
s₀ is rejected with probability at most 1 − confidence, so ε_lb ≤ ε_s₀, the ledger's ε at the true noise scale, at
that confidence. It is a lower bound on ε under that model only: a mechanism whose trade-off curve has another shape
is outside the family (the Steinke–Nasr–Jagielski bound, :mod:`dpgen.audit.bound`, holds for every (ε, δ)-DP run).
Rejection is monotone in s in every case tests/test_audit_fdp.py tried; the search assumes it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np
from scipy import stats

__all__ = ["TradeOff", "rejects", "critical_count", "CanaryEvent", "NoiseFamily", "fdp_lower_bound",
           "EPS_GRID"]

#: the ε grid of a privacy profile: fine where audits live, coarse beyond (any grid keeps the test valid)
EPS_GRID = np.concatenate([np.arange(0.0, 12.0, 0.02), np.arange(12.0, 60.0, 0.25)])
#: PLD discretisation of the privacy loss (dp-accounting's value_discretization_interval): coarse for the search's
#: curves, fine for the ε reported
PLD_INTERVAL = 2e-3
PLD_INTERVAL_FINE = 5e-4
#: the search over the noise scale s stops where ε_s exceeds this (reported as "at least") or falls below 1e-3
EPS_CAP = 30.0


class TradeOff:
    """A symmetric trade-off curve f through f̄⁻¹ (module docstring), from a privacy profile δ(ε) on ``eps``
    (ε ≥ 0, δ for the worse of the two neighbouring directions)."""

    def __init__(self, eps: np.ndarray, delta: np.ndarray) -> None:
        eps, delta = np.asarray(eps, dtype=np.float64), np.clip(np.asarray(delta, dtype=np.float64), 0.0, 1.0)
        if eps.shape != delta.shape or eps.ndim != 1 or not len(eps) or (eps < 0).any():
            raise ValueError("a privacy profile needs matching 1-D arrays of eps >= 0 and delta")
        self.eps, self.delta = eps, delta
        self._exp, self._exp_neg = np.exp(eps), np.exp(-eps)

    @classmethod
    def from_pld(cls, pld, eps: np.ndarray = EPS_GRID) -> "TradeOff":
        """From a dp-accounting PrivacyLossDistribution (``get_delta_for_epsilon`` is the max over both
        directions)."""
        return cls(eps, np.asarray(pld.get_delta_for_epsilon(eps), dtype=np.float64))

    @classmethod
    def gaussian(cls, mu: float, eps: np.ndarray = EPS_GRID) -> "TradeOff":
        """μ-GDP (Dong, Roth & Su 2022, Cor. 2.13: δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2))."""
        mu = float(mu)
        if mu <= 0:
            return cls(eps, np.zeros_like(eps))
        d = stats.norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
        return cls(eps, np.maximum(d, 0.0))

    def fbar_inv(self, r: float) -> float:
        """The least P_out[B] of any event B with P_in[B] = r (and vice versa): f̄⁻¹(r)."""
        if r <= 0.0:
            return 0.0
        r = min(float(r), 1.0)
        a = (r - self.delta) * self._exp_neg
        b = 1.0 - self.delta - self._exp * (1.0 - r)
        return float(min(1.0, max(0.0, a.max(), b.max())))


def _check(m: int, k: int, c: int, alpha: float) -> None:
    if not 0 <= c <= k <= m or m < 1:
        raise ValueError(f"need 0 <= correct ({c}) <= guesses ({k}) <= canaries ({m}), m >= 1")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"the level must be in (0, 1), got {alpha}")


def rejects(curve: TradeOff, m: int, k: int, c: int, alpha: float) -> bool:
    """True when MMC's recursion shows P[≥ c of k guesses right] ≤ ``alpha`` for every ``curve``-DP mechanism
    (module docstring), i.e. c right guesses reject the hypothesis at level ``alpha``."""
    _check(m, k, c, alpha)
    if c == 0:
        return False
    target = k / m
    r, h = alpha * c / m, alpha * (k - c) / m
    if r + h > target:  # only when alpha > 1: kept for completeness
        return True
    for i in range(c - 1, -1, -1):
        h_new = max(h, curve.fbar_inv(r))
        if h_new == h:  # r and h are fixed points from here on
            break
        r, h = min(r + i / (k - i) * (h_new - h), 1.0), h_new
        if r + h > target:
            return True
    return r + h > target


def critical_count(curve: TradeOff, m: int, k: int, alpha: float) -> int:
    """The smallest number of right guesses that :func:`rejects` (k + 1 if none does). Rejecting whenever the
    right guesses reach it is a level-``alpha`` test, since P[≥ that many right] ≤ alpha."""
    if not rejects(curve, m, k, k, alpha):
        return k + 1
    lo, hi = 0, k  # rejects(hi); the count is monotone in every case tested
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if rejects(curve, m, k, mid, alpha):
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class CanaryEvent:
    """One kind of release the canaries went through, ``count`` times: Poisson-sampled at ``sampling_rate``
    (1: every canary in every release), with noise multipliers as the canaries see it (noise std ÷ the shift of
    one included canary, all releases of one sampling event combined: (Σ z⁻²)^−1/2) and as the ledger
    records it (noise std ÷ a record's sensitivity, the event's every release)."""

    sampling_rate: float
    canary_multiplier: float
    ledger_multiplier: float
    count: int

    def __post_init__(self) -> None:
        if not 0.0 < self.sampling_rate <= 1.0 or self.count < 1:
            raise ValueError(f"bad canary event {self}")
        if not (self.canary_multiplier > 0 and self.ledger_multiplier > 0):
            raise ValueError(f"a canary event needs positive multipliers (eps=inf runs use a reference), got {self}")


def _pld(events: tuple[tuple[float, float, int], ...], interval: float = PLD_INTERVAL):
    """The PLD of the composition of (q, multiplier, count) events (add/remove-one, both directions), rounded
    pessimistically by connect-the-dots (dp-accounting's optimistic rounding, privacy buckets, is far off for
    long compositions of small losses: 0.31 for an ε of 0.91 at interval 2e-3 and 600 steps)."""
    from dp_accounting.pld import privacy_loss_distribution as pldm

    unsampled = [(z, n) for q, z, n in events if q >= 1.0]
    total = None
    if unsampled:  # unsampled Gaussians compose exactly: one Gaussian of multiplier (Σ n/z²)^-1/2
        z = math.fsum(n / z ** 2 for z, n in unsampled) ** -0.5
        total = pldm.from_gaussian_mechanism(z, sensitivity=1.0, value_discretization_interval=interval)
    for q, z, n in events:
        if q >= 1.0:
            continue
        one = pldm.from_gaussian_mechanism(z, sensitivity=1.0, sampling_prob=q, value_discretization_interval=interval)
        one = one.self_compose(n) if n > 1 else one
        total = one if total is None else total.compose(one)
    return total


@lru_cache(maxsize=256)
def _curve(events: tuple[tuple[float, float, int], ...]) -> TradeOff:
    return TradeOff.from_pld(_pld(events))


@lru_cache(maxsize=256)
def _epsilon(events: tuple[tuple[float, float, int], ...], delta: float, interval: float) -> float:
    return max(0.0, float(_pld(events, interval).get_epsilon_for_delta(delta)))


class NoiseFamily:
    """The hypotheses f_s, s > 0: the canaries' events with every noise multiplier × s (module docstring)."""

    def __init__(self, events: Sequence[CanaryEvent], delta: float) -> None:
        if not events:
            raise ValueError("a noise family needs at least one canary event")
        self.events, self.delta = tuple(events), float(delta)

    def _scaled(self, s: float, which: str) -> tuple[tuple[float, float, int], ...]:
        key = "canary_multiplier" if which == "canary" else "ledger_multiplier"
        return tuple((e.sampling_rate, round(getattr(e, key) * s, 12), int(e.count)) for e in self.events)

    def curve(self, s: float) -> TradeOff:
        """f_s as the canaries see the mechanism at noise scale s (pessimistic PLD)."""
        return _curve(self._scaled(s, "canary"))

    def epsilon(self, s: float, fine: bool = True) -> float:
        """ε at the family's δ of the ledger's multipliers × s (``fine``: at :data:`PLD_INTERVAL_FINE`, within about
        10⁻³ of the exact value; else at the search's coarser interval)."""
        return _epsilon(self._scaled(s, "ledger"), self.delta, PLD_INTERVAL_FINE if fine else PLD_INTERVAL)


def _snap(s: float, step: float = 2e-3) -> float:
    """s rounded to the geometric grid exp(step·ℤ)."""
    return math.exp(round(math.log(s) / step) * step)


def fdp_lower_bound(family: NoiseFamily, m: int, k: int, correct: int, confidence: float,
                    rel_tol: float = 1e-2) -> dict:
    """ε_lb of the f-DP test: the ε (ledger, at the family's δ) of the weakest rejected noise scale s*.

    Returns ``epsilon_lower_bound``, ``noise_scale`` (s*, None when nothing is rejected), ``at_cap`` (even the
    scale whose ε is :data:`EPS_CAP` is rejected: ε_lb is at least the figure), ``stage_epsilon`` (ε at s = 1:
    the ledger's ε of the releases the canaries saw) and ``critical_count`` at s*."""
    _check(m, k, correct, 1.0 - confidence)
    alpha = 1.0 - float(confidence)

    def rejected(s: float) -> bool:
        return rejects(family.curve(s), m, k, correct, alpha)

    out = {"stage_epsilon": family.epsilon(1.0)}
    lo = hi = 1.0
    if rejected(1.0):  # the ledger's own claim is rejected: search weaker claims (smaller s, larger ε)
        while rejected(lo):
            hi, lo = lo, lo / 2.0
            if family.epsilon(lo, fine=False) > EPS_CAP:
                return {**out, "epsilon_lower_bound": family.epsilon(hi), "noise_scale": hi, "at_cap": True,
                        "critical_count": critical_count(family.curve(hi), m, k, alpha)}
    else:
        while not rejected(hi):
            lo, hi = hi, hi * 2.0
            if family.epsilon(hi, fine=False) < 1e-3:
                return {**out, "epsilon_lower_bound": 0.0, "noise_scale": None, "at_cap": False,
                        "critical_count": None}
    while hi / lo > 1.0 + rel_tol:  # rejected(hi), not rejected(lo)
        mid = _snap(math.sqrt(lo * hi))  # on a fixed grid, so that searches share cached curves
        if mid <= lo or mid >= hi:
            break
        if rejected(mid):
            hi = mid
        else:
            lo = mid
    return {**out, "epsilon_lower_bound": family.epsilon(hi), "noise_scale": hi, "at_cap": False,
            "critical_count": critical_count(family.curve(hi), m, k, alpha)}
