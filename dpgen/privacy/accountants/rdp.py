"""The RDP composition backend: Renyi-DP curves of ledger entries and their (epsilon, delta) conversions.

The curve of one application of an entry comes from :class:`dp_accounting.rdp.RdpAccountant` (the
Poisson-subsampled Gaussian of Mironov, Talwar & Zhang 2019; opacus' ``accountants/analysis/rdp.py``
computes the same); RDP composes additively (Mironov 2017 Prop. 1), so a ledger's curve is the
count-weighted sum of cached unit curves. Two conversions to (epsilon, delta):

* :func:`epsilon`: the Canonne-Kamath-Steinke 2020 Prop. 12 bound (the same as Balle et al. 2020 Thm 21,
  which opacus' ``RDPAccountant`` uses), via ``dp_accounting.rdp.compute_epsilon``;
* :func:`classic_epsilon`: Mironov 2017 Prop. 3, ``min_alpha rdp(alpha) - log(delta)/(alpha-1)``, the
  conversion of older papers (TF-privacy tutorials, PATE, G-PATE, autodp): sound but looser.

Callers go through :func:`dpgen.privacy.accountants.compute_epsilon`, which validates the arguments.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

import dp_accounting
import numpy as np
from dp_accounting import rdp as dp_rdp

from dpgen.privacy.events import LedgerEntry

__all__ = ["classic_epsilon", "epsilon", "rdp_curve", "total_rdp"]


def rdp_curve(accountant: dp_rdp.RdpAccountant) -> tuple[np.ndarray, np.ndarray]:
    """The (orders, RDP values) an RdpAccountant has accumulated.

    dp_accounting 0.6 has no public accessor for the RDP curve, so this reads
    the private ``_orders`` / ``_rdp`` arrays of ``RdpAccountant`` (see its
    ``__init__`` / ``_maybe_compose``).  This is the ONLY place that touches
    private state; if a future version renames them, fix it here.
    """
    try:
        orders = np.asarray(accountant._orders, dtype=np.float64)  # noqa: SLF001 (no public API)
        rdp = np.asarray(accountant._rdp, dtype=np.float64)  # noqa: SLF001
    except AttributeError as exc:  # pragma: no cover - depends on the installed dp_accounting
        raise RuntimeError("this dp_accounting version does not expose RdpAccountant._orders/_rdp") from exc
    return orders.copy(), rdp.copy()


@lru_cache(maxsize=4096)
def _unit_rdp(sampling: str, q: float, mechanism: str, z_eff: float) -> tuple[np.ndarray, np.ndarray]:
    """RDP curve of ONE application of a (possibly Poisson-subsampled) mechanism, from dp_accounting."""
    entry = LedgerEntry("unit", [z_eff], sampling=sampling, sampling_rate=q, count=1, mechanism=mechanism)
    acct = dp_rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    entry.compose_into(acct, unit=True)
    orders, rdp = rdp_curve(acct)
    orders.flags.writeable = False
    rdp.flags.writeable = False
    return orders, rdp


def total_rdp(entries: Sequence[LedgerEntry]) -> tuple[np.ndarray, np.ndarray]:
    """RDP curve of the composition of ``entries``.

    RDP composes additively (Mironov 2017 Prop. 1), and RdpAccountant itself
    adds ``count * rdp(unit event)`` per event; we do the same additions in
    the same order, with the per-unit curves cached, so repeated queries
    (calibration, budget guards) do not recompute the subsampled-Gaussian RDP.
    """
    orders, _ = _unit_rdp("none", 1.0, "gaussian", 1.0)
    total = np.zeros_like(orders, dtype=np.float64)
    for e in entries:
        _, r = _unit_rdp(e.sampling, e.sampling_rate, e.mechanism, e.effective_noise_multiplier)
        total += e.count * r
    return orders, total


def epsilon(entries: Sequence[LedgerEntry], delta: float) -> float:
    """Epsilon at ``delta`` of the composed RDP curve, Canonne-Kamath-Steinke 2020 Prop. 12 conversion."""
    orders, rdp = total_rdp(entries)
    return float(dp_rdp.compute_epsilon(orders, rdp, delta)[0])


def classic_epsilon(entries: Sequence[LedgerEntry], delta: float) -> float:
    """Epsilon at ``delta`` of the composed RDP curve, Mironov 2017 Prop. 3 conversion."""
    orders, rdp = total_rdp(entries)
    with np.errstate(over="ignore", invalid="ignore"):
        eps = rdp - math.log(delta) / (orders - 1.0)
    return float(max(0.0, np.nanmin(eps)))
