"""Privacy accounting of GS-WGAN / DPAC generator iterations.

Per generator iteration every partition joins independently with probability q = m/K (``dpac.sampling=poisson``,
m = ``partitions_per_iter``; the paper draws exactly one, q = 1/K). Only the sampled partitions are touched (their
D_j's critic steps, C_j's real steps, the sanitised gradients, summed over the sampled partitions per generated
image). For one record this is a q-subsampled mechanism whose released output is the set of sanitised
per-sample gradients: B samples × P paths (P = 1 for D only, 2 once C is on), each noised with std 2Cz, to
which the record's partition adds one row clipped to C per sample and path. Changing the record can move all
of those rows, so the joint ℓ2 sensitivity is 2C·sqrt(P·B) and the iteration is ONE Gaussian with noise
multiplier z/sqrt(P·B); the ledger records it as P Gaussians z/sqrt(B) inside one Poisson-sampled event
(σ_eff = z/sqrt(P·B)). Why that holds with hidden discriminator state (and why the paper's uniform draw does
not have this argument): docs/privacy.md, "Sampling partitions".

``paper`` mode reproduces GS-WGAN's ``privacy_analysis.py`` (autodp): B·T compositions of a
Gaussian with multiplier z subsampled WITHOUT replacement at 1/K (Wang, Balle & Kasiviswanathan
2019), REPLACE_ONE, Mironov's RDP→DP conversion: 9.9926 for z=1.07, K=1000, T=20000, B=32, δ=1e-5.
It treats the B gradients of one iteration as independently subsampled and ignores the C path,
so it is not a valid guarantee (accounting.md §4 "Warning").
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable

import dp_accounting
import numpy as np
from dp_accounting import rdp as dp_rdp

from dpgen.privacy import LedgerEntry
from dpgen.privacy.accountants.rdp import rdp_curve

ENTRY = "dpac.generator"


def iteration_entries(z: float, k: int, batch: int, iters: int, c_start: int | None, start: int = 0,
                      per_iter: int = 1) -> list[LedgerEntry]:
    """Sound ledger entries for generator iterations start..iters−1 (classifier path from ``c_start`` on), each
    sampling partitions at rate ``per_iter``/K."""
    zp = z / math.sqrt(batch)
    q = min(1.0, per_iter / k)
    d_only = max(0, min(iters, iters if c_start is None else c_start) - start)
    both = iters - start - d_only
    out = []
    if d_only:
        out.append(LedgerEntry(ENTRY, [zp], "poisson", q, count=d_only))
    if both:
        out.append(LedgerEntry(ENTRY, [zp, zp], "poisson", q, count=both))
    return out


@lru_cache(maxsize=256)
def _wor_unit_curve(z: float, k: int, per_iter: int = 1) -> tuple[np.ndarray, np.ndarray]:
    acct = dp_rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acct.compose(dp_accounting.SampledWithoutReplacementDpEvent(k, per_iter, dp_accounting.GaussianDpEvent(z)))
    return rdp_curve(acct)


def gswgan_paper_epsilon(z: float, k: int, compositions: int, delta: float, per_iter: int = 1) -> float:
    """GS-WGAN's published analysis: ``compositions`` × sampled-w/o-replacement Gaussian(z) at ``per_iter``/K
    (1/K in the paper), Mironov conversion."""
    if compositions <= 0:
        return 0.0
    orders, rdp = _wor_unit_curve(float(z), int(k), int(per_iter))
    with np.errstate(over="ignore", invalid="ignore"):
        eps = compositions * rdp - math.log(delta) / (orders - 1.0)
    return float(np.nanmin(eps))


def paper_epsilon_fn(batch: int, entry: str = ENTRY, z_scale: float = 1.0,
                     per_iter: int = 1) -> Callable[[list[LedgerEntry], float], float]:
    """``ledger.paper_epsilon``: maps the sound entries named ``entry`` back to GS-WGAN's count
    (B compositions per iteration, D path only; z = multiplier·√B·``z_scale``; ``per_iter`` of K partitions
    sampled without replacement, K = ``per_iter`` ÷ the entry's rate); efsgd reuses it with its own entry name
    and scale."""

    def fn(entries: list[LedgerEntry], delta: float) -> float:
        comps: dict[tuple[float, int], int] = {}
        for e in entries:
            if e.name == entry:  # first multiplier = the D path; the C path is not counted (official accountant)
                key = (e.noise_multipliers[0] * math.sqrt(batch) * z_scale, round(per_iter / e.sampling_rate))
                comps[key] = comps.get(key, 0) + e.count * batch
        if not comps:
            return 0.0
        orders, total = None, 0.0
        for (z, k), count in comps.items():
            orders, rdp = _wor_unit_curve(float(z), int(k), int(per_iter))
            total = total + count * rdp
        with np.errstate(over="ignore", invalid="ignore"):
            return float(np.nanmin(total - math.log(delta) / (orders - 1.0)))

    return fn


def paper_max_iters(z: float, k: int, batch: int, delta: float, target: float, cap: int, per_iter: int = 1) -> int:
    """Largest T ≤ cap whose paper ε (B·T compositions) stays ≤ target (integer bisection)."""
    if math.isinf(target):  # eps=inf: no budget, the configured iterations bind
        return cap
    if gswgan_paper_epsilon(z, k, batch, delta, per_iter) > target:
        return 0
    lo, hi = 1, cap
    if gswgan_paper_epsilon(z, k, cap * batch, delta, per_iter) <= target:
        return cap
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if gswgan_paper_epsilon(z, k, mid * batch, delta, per_iter) <= target:
            lo = mid
        else:
            hi = mid
    return lo


def paper_noise_multiplier(k: int, batch: int, iters: int, delta: float, target: float, tol: float = 1e-3,
                           per_iter: int = 1) -> float:
    """Smallest z (to ``tol``, conservative side) whose paper ε after ``iters`` iterations is ≤ target (0 for
    the eps=inf reference)."""
    if math.isinf(target):
        return 0.0
    lo, hi = 0.3, 100.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if gswgan_paper_epsilon(mid, k, iters * batch, delta, per_iter) <= target:
            hi = mid
        else:
            lo = mid
    return hi
