"""Composition backends: the (epsilon, delta) of a list of ledger entries, as opacus splits its accountants.

The ledger's entries (:mod:`dpgen.privacy.events`) become ``dp_accounting`` events, and one of Google's
accountants composes them:

* ``"rdp"`` (default, :mod:`.rdp`): :class:`dp_accounting.rdp.RdpAccountant`, Renyi DP of the
  Poisson-subsampled Gaussian (Mironov, Talwar & Zhang 2019) converted to (epsilon, delta) with the
  Canonne-Kamath-Steinke 2020 Prop. 12 bound (the same as Balle et al. 2020 Thm 21, which opacus uses).
* ``"pld"`` (:mod:`.pld`): :class:`dp_accounting.pld.PLDAccountant`, privacy loss distributions
  (Meiser & Mohammadi 2018; Koskela et al. 2020), tighter.

Releases that are all unsampled Laplace mechanisms are also capped by basic pure-DP composition
(Dwork et al. 2006). The neighbouring relation is add/remove-one throughout.
"""

from __future__ import annotations

import math
from typing import Sequence

from dpgen.privacy.accountants import pld, rdp
from dpgen.privacy.events import LedgerEntry
from dpgen.privacy.validation import as_delta, check_choice

__all__ = ["ACCOUNTANTS", "CONVERSIONS", "compute_epsilon"]

#: the composition backends ``privacy.accountant`` selects
ACCOUNTANTS = ("rdp", "pld")
#: ``tight``: the chosen backend's conversion; ``classic``: Mironov 2017 Prop. 3 on the RDP curve
CONVERSIONS = ("tight", "classic")


def _pure_dp_bound(entries: Sequence[LedgerEntry]) -> float:
    """Basic-composition pure-DP bound sum(count / b) when every entry is an unsampled Laplace release (Dwork et al. 2006)."""
    if entries and all(e.mechanism == "laplace" and e.sampling == "none" for e in entries):
        return math.fsum(e.count / e.noise_multipliers[0] for e in entries)
    return math.inf


def compute_epsilon(
    entries: Sequence[LedgerEntry],
    delta: float,
    accountant: str = "rdp",
    conversion: str = "tight",
) -> float:
    """Sound epsilon at ``delta`` for the composition of ``entries``.

    ``conversion="tight"`` asks the chosen dp_accounting accountant (RDP with
    the Canonne-Kamath-Steinke 2020 Prop. 12 / Balle et al. 2020 Thm 21
    conversion, or PLD).  When all entries are unsampled Laplace releases the
    result is additionally capped by the basic pure-DP composition bound.

    ``conversion="classic"`` reproduces older papers (TF-privacy tutorials,
    PATE, G-PATE, autodp): it always uses the RDP curve and the original
    conversion ``eps = min_alpha rdp(alpha) - log(delta)/(alpha-1)``
    (Mironov 2017 Prop. 3), whatever ``accountant`` says.  It is sound but
    looser.
    """
    check_choice("accountant", accountant, ACCOUNTANTS)
    check_choice("conversion", conversion, CONVERSIONS)
    delta = as_delta(delta)
    entries = list(entries)
    if not entries:
        return 0.0
    if any(e.noiseless for e in entries):
        return math.inf
    if conversion == "classic":
        return rdp.classic_epsilon(entries, delta)
    eps = rdp.epsilon(entries, delta) if accountant == "rdp" else pld.epsilon(entries, delta)
    return max(0.0, min(eps, _pure_dp_bound(entries)))
