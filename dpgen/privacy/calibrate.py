"""Calibrate a noise multiplier or a number of steps to a target (epsilon, delta).

Both searches treat the accountant as a black box (dp_accounting's RDP or
PLD accountant via :func:`dpgen.privacy.accountants.compute_epsilon`), keep an
invariant "the returned side satisfies epsilon <= target", and so always return
the conservative answer, like opacus' ``get_noise_multiplier`` (which returns
the upper end of its bisection bracket).  Unlike opacus they compose any list
of entries, including earlier releases (``base``), as DP-FETA's vendored
``account_history`` does.

Calibration sits on top of the mechanism events and the composition backends and below the budget guard
(:mod:`dpgen.privacy.budget`, which counts down the steps :func:`calibrate_steps` allows) and the ledger.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from dpgen.errors import DpgenError
from dpgen.privacy.accountants import compute_epsilon
from dpgen.privacy.events import LedgerEntry
from dpgen.privacy.validation import as_delta, check_epsilon

__all__ = ["calibrate_noise_multiplier", "calibrate_steps"]


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    make_entries: Callable[[float], Sequence[LedgerEntry]],
    base: Sequence[LedgerEntry] = (),
    accountant: str = "rdp",
    tol: float = 1e-3,
    lo: float = 0.05,
    hi: float = 1e4,
) -> float:
    """Smallest noise multiplier z (to within ``tol``) with epsilon(base + make_entries(z)) <= target.

    Bisection (geometric while the bracket spans more than a factor 2, then
    arithmetic) on z, assuming epsilon decreases in z.  The returned z is
    the upper end of the final bracket, so ``epsilon(z) <= target_epsilon``
    holds exactly for the value returned (checked with the same accountant),
    and ``z - z* <= tol`` for the true crossing z*.  Returns ``lo`` if even
    ``lo`` meets the target.

    With ``accountant="pld"`` the bracket is first narrowed around the RDP
    answer, because PLD evaluations at very small z are very slow.

    Raises DpgenError if even ``hi`` cannot meet the target (e.g. ``base``
    alone already exceeds it).  ``target_epsilon=inf`` (the privacy-off
    reference) returns 0: no noise.
    """
    check_epsilon(target_epsilon, allow_inf=True)
    delta = as_delta(delta)
    target = float(target_epsilon)
    if target == math.inf:
        return 0.0
    lo, hi, tol = float(lo), float(hi), float(tol)
    if not (0.0 < lo < hi) or not math.isfinite(hi) or tol <= 0.0:
        raise DpgenError(f"noise calibration needs 0 < lo < hi and tol > 0, got lo={lo}, hi={hi}, tol={tol}")
    base = list(base)

    def eps(z: float) -> float:
        return compute_epsilon(base + list(make_entries(z)), delta, accountant=accountant)

    lo_b, hi_b = lo, hi  # bracket to bisect; invariant below: eps(lo_b) > target >= eps(hi_b)
    if accountant == "pld":
        # PLD evaluations get slow for small z (seconds to minutes), so do not
        # probe the extremes: start from the (fast, looser) RDP answer, which in
        # practice meets the target under PLD too, and widen downwards from it.
        try:
            z0: float | None = calibrate_noise_multiplier(target, delta, make_entries, base, "rdp", tol, lo, hi)
        except DpgenError:
            z0 = None
        if z0 is None:
            pass
        elif eps(z0) <= target:
            hi_b = z0
            z = z0
            while True:
                z = max(lo, z * 0.85)
                if eps(z) > target:
                    lo_b = z
                    break
                hi_b = z
                if z <= lo:
                    return lo
        else:
            lo_b = z0
    if hi_b == hi:
        e_hi = eps(hi)
        if e_hi > target:
            raise DpgenError(
                f"cannot reach epsilon={target} at delta={delta}: even noise multiplier {hi:g} gives "
                f"epsilon={e_hi:.4g}; raise the budget or use fewer steps / a smaller sampling rate"
            )
    if lo_b == lo and eps(lo) <= target:
        return lo
    lo, hi = lo_b, hi_b
    while hi - lo > tol:
        mid = math.sqrt(lo * hi) if hi > 2.0 * lo else 0.5 * (lo + hi)
        if eps(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


def calibrate_steps(
    target_epsilon: float,
    delta: float,
    make_entries: Callable[[int], Sequence[LedgerEntry]],
    base: Sequence[LedgerEntry] = (),
    accountant: str = "rdp",
    max_steps: int = 10**7,
) -> int:
    """Largest count c in [0, max_steps] with epsilon(base + make_entries(c)) <= target (0 if none).

    Exponential search for a failing count, then integer bisection, assuming
    epsilon is non-decreasing in c; about 2*log2(answer) accountant calls
    (with the RDP accountant each call only rescales cached RDP curves).
    ``target_epsilon=inf`` returns ``max_steps``.
    """
    check_epsilon(target_epsilon, allow_inf=True)
    delta = as_delta(delta)
    target = float(target_epsilon)
    if isinstance(max_steps, bool) or int(max_steps) != max_steps or max_steps < 0:
        raise DpgenError(f"max_steps must be a non-negative integer, got {max_steps!r}")
    max_steps = int(max_steps)
    if target == math.inf:
        return max_steps
    base = list(base)

    def ok(c: int) -> bool:
        return compute_epsilon(base + list(make_entries(c)), delta, accountant=accountant) <= target

    if max_steps == 0 or not ok(1):
        return 0
    good, bad = 1, None
    # exponential search: invariant ok(good)
    while bad is None:
        nxt = min(2 * good, max_steps)
        if nxt == good:
            return good  # good == max_steps
        if ok(nxt):
            good = nxt
        else:
            bad = nxt
    # bisection: ok(good), not ok(bad)
    while bad - good > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good
