"""Checks of the privacy parameters a user or a file supplies: epsilon, delta and the named choices.

Every check raises a one-line :class:`~dpgen.errors.DpgenError` (exit 2 at the CLI) and nothing else; the
rest of the privacy layer calls these instead of repeating them.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from dpgen.errors import DpgenError

__all__ = ["as_delta", "check_choice", "check_delta", "check_epsilon", "delta_below", "parse_epsilon"]


def check_delta(delta: float, n: int) -> None:
    """Reject a delta that is not meaningfully small for a data set of ``n`` examples.

    (epsilon, delta)-DP with ``delta >= 1/N`` allows releasing one training
    example in the clear ("name-and-shame"; Dwork & Roth 2014, Sec. 2.3), so a
    valid configuration needs ``0 < delta < 1/N``.
    """
    n_int = int(n)
    if n_int < 1:
        raise DpgenError(f"the training set must have at least one example, got N={n}")
    d = float(delta)
    if not math.isfinite(d) or d <= 0.0 or d >= 1.0 / n_int:
        raise DpgenError(
            f"delta={delta} must be < 1/N = {1.0 / n_int:.6g} for N={n_int} training examples "
            "(and > 0); lower privacy.delta"
        )


def delta_below(n: int) -> float:
    """The largest power of ten strictly below 1/N: the default delta of a dataset whose size is only known once it is
    listed (``dataset=folder``). The built-in datasets' defaults follow the same rule (1e-5 for the 60,000
    images of (F-)MNIST, 1e-6 for CelebA's 162,770)."""
    n_int = int(n)
    if n_int < 1:
        raise DpgenError(f"the training set must have at least one example, got N={n}")
    k = math.floor(-math.log10(n_int)) if n_int > 1 else -1
    while 10.0 ** k >= 1.0 / n_int:  # 1/N itself a power of ten (N = 100) or a rounding error of the log
        k -= 1
    return float(f"1e{k}")


_INF_SPELLINGS = ("inf", ".inf", "+inf", "+.inf", "infinity", "+infinity")


def parse_epsilon(eps: Any, key: str = "eps") -> float:
    """A target epsilon from a config value: a positive number, or ``inf`` for the privacy-off reference.

    Accepts ints, floats and their strings, plus ``inf``/``.inf`` (YAML)/``Infinity``. ``inf`` means
    "no privacy": every noise multiplier is 0, clipping is kept, and the run is never reported as
    private (:attr:`dpgen.privacy.ledger.PrivacyLedger.privacy_off`).
    """
    if isinstance(eps, bool):
        raise DpgenError(f"{key} (target epsilon) must be a positive number or inf, got {eps!r}")
    if isinstance(eps, str):
        text = eps.strip().lower()
        if text in _INF_SPELLINGS:
            return math.inf
        try:
            e = float(text)
        except ValueError:
            raise DpgenError(f"{key} (target epsilon) must be a positive number or inf, got {eps!r}") from None
    else:
        try:
            e = float(eps)
        except (TypeError, ValueError):
            raise DpgenError(f"{key} (target epsilon) must be a positive number or inf, got {eps!r}") from None
    if math.isnan(e) or e <= 0.0:
        raise DpgenError(f"{key} (target epsilon) must be a positive number or inf, got {eps!r}")
    return e


def check_epsilon(eps: float, allow_inf: bool = False) -> None:
    """Reject a target epsilon that is not a positive finite number (``inf`` too, if ``allow_inf``)."""
    try:
        e = float(eps)
    except (TypeError, ValueError):
        raise DpgenError(f"target epsilon must be a positive number, got {eps!r}") from None
    if allow_inf and e == math.inf:
        return
    if not math.isfinite(e) or e <= 0.0:
        raise DpgenError(f"target epsilon must be a positive finite number, got {eps!r}")


def as_delta(delta: Any) -> float:
    """``delta`` as a float in (0, 1): the delta of an accountant query or a ledger (no data-set size here;
    :func:`check_delta` adds the ``delta < 1/N`` rule where N is known)."""
    try:
        d = float(delta)
    except (TypeError, ValueError):
        raise DpgenError(f"delta must be a number in (0, 1), got {delta!r}") from None
    if not math.isfinite(d) or not 0.0 < d < 1.0:
        raise DpgenError(f"delta must be in (0, 1), got {delta!r}")
    return d


def check_choice(what: str, value: str, allowed: Sequence[str]) -> str:
    """``value`` if it is one of ``allowed``, else a DpgenError naming ``what`` and the choices."""
    if value not in allowed:
        raise DpgenError(f"{what} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value
