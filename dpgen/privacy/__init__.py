"""Differential-privacy bookkeeping for dpgen: ledger, accountants, calibration, noisy queries.

All accounting goes through Google's ``dp_accounting`` (RDP or PLD) with the add/remove-one
neighbouring relation. One module per concept, each importing only the ones before it:

* :mod:`~dpgen.privacy.validation`: checks of epsilon, delta and named choices;
* :mod:`~dpgen.privacy.events`: :class:`LedgerEntry`, one kind of release (a mechanism event);
* :mod:`~dpgen.privacy.accountants`: the RDP and PLD composition backends, :func:`compute_epsilon`;
* :mod:`~dpgen.privacy.calibrate`: noise multiplier or step count for a target epsilon;
* :mod:`~dpgen.privacy.budget`: :class:`BudgetGuard`, stops a loop at the budget;
* :mod:`~dpgen.privacy.ledger`: :class:`PrivacyLedger`, a run's releases and ``privacy.json``;
* :mod:`~dpgen.privacy.randomness`, :mod:`~dpgen.privacy.sampling`, :mod:`~dpgen.privacy.mechanisms`,
  :mod:`~dpgen.privacy.optimizer`, :mod:`~dpgen.privacy.per_sample`: secret streams, Poisson batches and
  the noisy queries that record themselves in the ledger.
"""

from dpgen.privacy.accountants import compute_epsilon
from dpgen.privacy.budget import BudgetGuard
from dpgen.privacy.calibrate import calibrate_noise_multiplier, calibrate_steps
from dpgen.privacy.events import EventBuilder, LedgerEntry
from dpgen.privacy.ledger import PRIVACY_OFF_NOTE, PrivacyLedger
from dpgen.privacy.mechanisms import clip_rows, gaussian_sum_query
from dpgen.privacy.randomness import (PublicRandomnessError, SecretGenerator, gaussian_noise, require_secret,
                                      secret_generator)
from dpgen.privacy.validation import check_delta, check_epsilon, delta_below, parse_epsilon

__all__ = [
    "PrivacyLedger",
    "LedgerEntry",
    "BudgetGuard",
    "EventBuilder",
    "check_delta",
    "check_epsilon",
    "delta_below",
    "parse_epsilon",
    "compute_epsilon",
    "PRIVACY_OFF_NOTE",
    "calibrate_noise_multiplier",
    "calibrate_steps",
    "clip_rows",
    "gaussian_sum_query",
    "SecretGenerator",
    "PublicRandomnessError",
    "secret_generator",
    "require_secret",
    "gaussian_noise",
]
