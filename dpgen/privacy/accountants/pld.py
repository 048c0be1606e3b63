"""The PLD composition backend: privacy loss distributions of ledger entries, composed and converted.

:class:`dp_accounting.pld.PLDAccountant` (Meiser & Mohammadi 2018; Koskela et al. 2020) composes the
entries' events by discretised convolution of their privacy loss distributions and reads epsilon at
delta off the result: tighter than RDP, and slower (about a second per query for a long sampled
composition, where RDP with cached curves takes well under a millisecond), like the PRV accountant
(Gopi, Lee & Wutschitz 2021) opacus offers beside its RDP one.

Callers go through :func:`dpgen.privacy.accountants.compute_epsilon`, which validates the arguments.
"""

from __future__ import annotations

from typing import Sequence

import dp_accounting
from dp_accounting import pld as dp_pld

from dpgen.privacy.events import LedgerEntry

__all__ = ["epsilon"]


def epsilon(entries: Sequence[LedgerEntry], delta: float) -> float:
    """Epsilon at ``delta`` of the composition of ``entries`` under the PLD accountant (add/remove-one)."""
    acct = dp_pld.PLDAccountant(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    for e in entries:
        e.compose_into(acct)
    return float(acct.get_epsilon(delta))
