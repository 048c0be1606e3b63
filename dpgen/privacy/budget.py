"""The budget guard: stops a training loop exactly before its next step would exceed the target epsilon.

Opacus' ``make_private_with_epsilon`` calibrates the noise to a planned number of epochs; the training loops
here also check, before each noisy step, that the step still fits the budget (the noise may be fixed by the
config, or part of the budget already spent on earlier releases). The guard answers "may I
take one more step?" without asking the accountant every step: the largest number of further steps is
found once by :func:`dpgen.privacy.calibrate.calibrate_steps` and then only counted down.

A guard is made by :meth:`dpgen.privacy.ledger.PrivacyLedger.budget_guard`; since the ledger builds
guards, this module names the ledger only through the :class:`GuardedLedger` protocol (no import of it).
"""

from __future__ import annotations

from typing import Protocol

from dpgen.errors import DpgenError
from dpgen.privacy.calibrate import calibrate_steps
from dpgen.privacy.events import LedgerEntry

__all__ = ["BudgetGuard", "GuardedLedger"]


class GuardedLedger(Protocol):
    """What a :class:`BudgetGuard` uses of :class:`dpgen.privacy.ledger.PrivacyLedger`."""

    delta: float
    target_epsilon: float | None
    accountant: str
    entries: list[LedgerEntry]
    _version: int  # bumped on every change to ``entries``

    @property
    def privacy_off(self) -> bool: ...

    def _append(self, entry: LedgerEntry) -> None: ...


class BudgetGuard:
    """Stops a training loop exactly before its steps would push epsilon past the target.

    The largest number of further steps of ``entry`` that keep
    ``epsilon <= target_epsilon`` (given the ledger's entries when the guard is
    made) is found ONCE by integer bisection (:func:`calibrate_steps`);
    :meth:`allows` and :meth:`step` then only count.  If something else records
    into the ledger meanwhile, the bound is recomputed on the next
    :meth:`allows`/:meth:`step` so the guarantee stays sound.
    """

    def __init__(self, ledger: GuardedLedger, entry: LedgerEntry, max_count: int | None = None) -> None:
        if ledger.target_epsilon is None:
            raise DpgenError("a privacy budget guard needs a target epsilon; set privacy.epsilon")
        if max_count is not None and (isinstance(max_count, bool) or int(max_count) != max_count or max_count < 0):
            raise DpgenError(f"max_count must be a non-negative integer, got {max_count!r}")
        self.ledger = ledger
        self.entry = LedgerEntry(**{**entry.to_dict(), "count": 1})
        self.max_count = None if max_count is None else int(max_count)
        self.steps_taken = 0
        self.max_steps = 0
        self.remaining = 0
        self._compute()

    def _compute(self) -> None:
        template = self.entry.to_dict()
        cap = 10**7 if self.max_count is None else max(self.max_count - self.steps_taken, 0)
        if cap == 0 or self.ledger.privacy_off:
            more = cap  # eps=inf: no budget, only the configured step count binds
        else:
            more = calibrate_steps(
                self.ledger.target_epsilon,
                self.ledger.delta,
                lambda c: [LedgerEntry(**{**template, "count": c})],
                base=list(self.ledger.entries),
                accountant=self.ledger.accountant,
                max_steps=cap,
            )
        self.remaining = int(more)
        self.max_steps = self.steps_taken + self.remaining
        self._seen_version = self.ledger._version

    def _refresh(self) -> None:
        if self.ledger._version != self._seen_version:
            self._compute()

    def allows(self) -> bool:
        """True iff one more step keeps epsilon <= target_epsilon."""
        self._refresh()
        return self.remaining > 0

    def step(self) -> None:
        """Record one step of the guarded entry; raises DpgenError if it would exceed the budget."""
        if not self.allows():
            raise DpgenError(
                f"privacy budget exhausted: another {self.entry.name!r} step would exceed "
                f"epsilon={self.ledger.target_epsilon} at delta={self.ledger.delta} after {self.steps_taken} steps"
            )
        self.ledger._append(LedgerEntry(**self.entry.to_dict()))
        self.steps_taken += 1
        self.remaining -= 1
        self._seen_version = self.ledger._version

    def __repr__(self) -> str:
        return f"BudgetGuard({self.entry.name!r}, max_steps={self.max_steps}, remaining={self.remaining})"
