"""Differential-privacy bookkeeping for dpgen: ledger, accountants, calibration, noisy queries.

All accounting goes through Google's ``dp_accounting`` (RDP or PLD) with the
add/remove-one neighbouring relation; see :mod:`dpgen.privacy.ledger`.
"""

from dpgen.privacy.calibrate import calibrate_noise_multiplier, calibrate_steps
from dpgen.privacy.ledger import (
    BudgetGuard,
    EventBuilder,
    LedgerEntry,
    PrivacyLedger,
    PRIVACY_OFF_NOTE,
    check_delta,
    check_epsilon,
    parse_epsilon,
)
from dpgen.privacy.mechanisms import clip_rows, gaussian_sum_query
from dpgen.privacy.randomness import (PublicRandomnessError, SecretGenerator, gaussian_noise, require_secret,
                                      secret_generator)

__all__ = [
    "PrivacyLedger",
    "LedgerEntry",
    "BudgetGuard",
    "EventBuilder",
    "check_delta",
    "check_epsilon",
    "parse_epsilon",
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
