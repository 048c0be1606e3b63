"""The privacy ledger: every private release of a run, and the (epsilon, delta) it costs.

Methods record each release in a :class:`PrivacyLedger` (as :class:`~dpgen.privacy.events.LedgerEntry`
mechanism events, :mod:`dpgen.privacy.events`); the ledger asks a composition backend
(:mod:`dpgen.privacy.accountants`: RDP or PLD through Google's ``dp_accounting``) for epsilon, hands out
budget guards (:mod:`dpgen.privacy.budget`), saves itself in checkpoints and writes ``privacy.json``. Like
opacus' ``IAccountant`` it is the one object a training loop reports its steps to; unlike it, it keeps
releases of different mechanisms and sampling rates side by side, and can also report a paper's own
analysis (``accounting="paper"``), marked as no valid guarantee.

The layers below it, each importing only downward::

    validation  <-  events  <-  accountants (rdp, pld)  <-  calibrate  <-  budget  <-  ledger

Every name this module exported before the privacy layer was split (``LedgerEntry``, ``EventBuilder``,
``BudgetGuard``, ``compute_epsilon``, ``check_delta``, ``check_epsilon``, ``parse_epsilon``) is still
importable from it; new code imports them from :mod:`dpgen.privacy` or their own modules.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

from dpgen.errors import DpgenError
from dpgen.privacy.accountants import ACCOUNTANTS, compute_epsilon
from dpgen.privacy.budget import BudgetGuard
from dpgen.privacy.events import SAMPLINGS, EventBuilder, LedgerEntry
from dpgen.privacy.validation import as_delta, check_choice, check_delta, check_epsilon, parse_epsilon

__all__ = [
    "LedgerEntry",
    "PrivacyLedger",
    "EventBuilder",
    "BudgetGuard",
    "PRIVACY_OFF_NOTE",
    "FIXED_NOISE_SEED_NOTE",
    "check_delta",
    "check_epsilon",
    "compute_epsilon",
    "parse_epsilon",
]

PRIVACY_OFF_NOTE = (
    "eps=inf: privacy-off reference run. Every noise multiplier is 0 (clipping, sampling and all other "
    "code paths are those of a private run), so no (epsilon, delta) guarantee holds: epsilon is infinite. "
    "Use it as the upper-bound row, never as a private result."
)

FIXED_NOISE_SEED_NOTE = (
    "privacy.noise_seed is set: the mechanisms' randomness (sampling, partition draws, every noise) is fixed by a "
    "value in the run's config, so anyone with the config can replay it and the release has no DP guarantee "
    "(epsilon is what the mechanisms would cost with secret randomness). For debugging and tests only."
)

_ACCOUNTINGS = ("sound", "paper")
_STATE_VERSION = 1


class PrivacyLedger:
    """All private releases of one run, and their epsilon at ``delta``.

    ``accounting="sound"`` reports the dp_accounting epsilon (a valid DP
    guarantee).  ``accounting="paper"`` lets a method install
    ``paper_epsilon(entries, delta)`` to report the number its paper would
    have reported (e.g. a data-dependent or legacy analysis); ``to_json``
    then still shows the sound bound as ``sound_epsilon`` and marks
    ``valid_dp_guarantee: false``.

    ``target_epsilon=inf`` is the privacy-off reference (``eps=inf``):
    :attr:`privacy_off` is true, calibration returns noise multiplier 0, budget
    guards never bind, and ``privacy.json`` reports ``epsilon: Infinity`` with
    ``valid_dp_guarantee: false``.

    ``fixed_randomness=True``: the mechanisms drew from streams that ``privacy.noise_seed`` fixed, so the
    release has no DP guarantee whatever its epsilon (``valid_dp_guarantee: false``, with the reason).
    """

    def __init__(
        self,
        delta: float,
        target_epsilon: float | None = None,
        accountant: str = "rdp",
        accounting: str = "sound",
        fixed_randomness: bool = False,
    ) -> None:
        self.delta = as_delta(delta)
        if target_epsilon is not None:
            check_epsilon(target_epsilon, allow_inf=True)
            target_epsilon = float(target_epsilon)
        self.target_epsilon: float | None = target_epsilon
        self.accountant = check_choice("privacy accountant", accountant, ACCOUNTANTS)
        self.accounting = check_choice("privacy accounting", accounting, _ACCOUNTINGS)
        self.fixed_randomness = bool(fixed_randomness)
        self.entries: list[LedgerEntry] = []
        self.notes: list[str] = []
        self.paper_epsilon: Callable[[list[LedgerEntry], float], float] | None = None
        self._version = 0  # bumped on every change to ``entries``; lets BudgetGuard notice foreign records

    # -- recording ------------------------------------------------------------

    def record(
        self,
        name: str,
        noise_multipliers: float | Sequence[float],
        sampling: str = "none",
        sampling_rate: float = 1.0,
        count: int = 1,
        mechanism: str = "gaussian",
    ) -> None:
        """Record ``count`` releases; merges into the last entry if only ``count`` differs."""
        if isinstance(noise_multipliers, (int, float)):
            noise_multipliers = [noise_multipliers]
        entry = LedgerEntry(
            name=name,
            noise_multipliers=list(noise_multipliers),
            sampling=sampling,
            sampling_rate=sampling_rate,
            count=count,
            mechanism=mechanism,
        )
        self._append(entry)

    def _append(self, entry: LedgerEntry) -> None:
        if self.entries and self.entries[-1].same_release(entry):
            self.entries[-1].count += entry.count
        else:
            self.entries.append(entry)
        self._version += 1

    @contextmanager
    def sampled_event(self, name: str, sampling: str = "poisson", sampling_rate: float = 1.0) -> Iterator[EventBuilder]:
        """Group the Gaussian releases made on ONE Poisson batch into one ledger entry.

        Example::

            with ledger.sampled_event("dpdm.step", "poisson", q) as ev:
                gaussian_sum_query(g1, ..., record=ev)
                gaussian_sum_query(g2, ..., record=ev)

        On exit a single entry with all noise multipliers is recorded (the
        releases share one sampled batch, so they compose inside one sampling
        event, sigma_eff = (sum z^-2)^-1/2).  Nothing is recorded if no release
        was added.  The entry is recorded even if the block raises, since a
        release may already have left the block.
        """
        check_choice(f"sampling of {name!r}", sampling, SAMPLINGS)
        # validate name / rate up front (raises DpgenError)
        LedgerEntry(name, [1.0], sampling=sampling, sampling_rate=sampling_rate)
        ev = EventBuilder(name, sampling, sampling_rate)
        try:
            yield ev
        finally:
            if ev.noise_multipliers:
                self.record(name, list(ev.noise_multipliers), sampling=sampling, sampling_rate=sampling_rate)

    # -- epsilon --------------------------------------------------------------

    def epsilon(
        self,
        delta: float | None = None,
        extra: Sequence[LedgerEntry] = (),
        conversion: str = "tight",
    ) -> float:
        """Sound epsilon of ``entries + extra`` at ``delta`` (default: the ledger's), see :func:`compute_epsilon`."""
        return compute_epsilon(
            list(self.entries) + list(extra),
            self.delta if delta is None else delta,
            accountant=self.accountant,
            conversion=conversion,
        )

    def report_epsilon(self) -> float:
        """The epsilon to report: ``paper_epsilon(entries, delta)`` if installed, else :meth:`epsilon`.

        A noiseless release makes both infinite, so a paper analysis is not asked.
        """
        if self.paper_epsilon is not None and not any(e.noiseless for e in self.entries):
            return float(self.paper_epsilon(list(self.entries), self.delta))
        return self.epsilon()

    @property
    def privacy_off(self) -> bool:
        """True for the ``eps=inf`` reference: methods use noise multiplier 0 and keep clipping."""
        return self.target_epsilon == math.inf

    @property
    def valid_dp_guarantee(self) -> bool:
        """Sound accounting, a finite epsilon (a noiseless release guarantees nothing) and secret randomness."""
        return self.accounting == "sound" and not self.fixed_randomness and not any(e.noiseless for e in self.entries)

    def budget_guard(
        self,
        name: str,
        noise_multipliers: float | Sequence[float],
        sampling: str = "none",
        sampling_rate: float = 1.0,
        max_count: int | None = None,
    ) -> "BudgetGuard":
        """A :class:`BudgetGuard` for steps of one entry against ``target_epsilon``."""
        if self.target_epsilon is None:
            raise DpgenError("a privacy budget guard needs a target epsilon; set privacy.epsilon")
        if isinstance(noise_multipliers, (int, float)):
            noise_multipliers = [noise_multipliers]
        entry = LedgerEntry(name, list(noise_multipliers), sampling=sampling, sampling_rate=sampling_rate, count=1)
        return BudgetGuard(self, entry, max_count=max_count)

    # -- persistence ----------------------------------------------------------

    def state_dict(self) -> dict:
        """Plain python containers only (safe for ``torch.load(weights_only=True)``)."""
        return {
            "version": _STATE_VERSION,
            "delta": float(self.delta),
            "target_epsilon": None if self.target_epsilon is None else float(self.target_epsilon),
            "accountant": str(self.accountant),
            "accounting": str(self.accounting),
            "fixed_randomness": bool(self.fixed_randomness),
            "entries": [e.to_dict() for e in self.entries],
            "notes": [str(n) for n in self.notes],
        }

    def load_state_dict(self, d: dict) -> None:
        """Restore a :meth:`state_dict` (replaces entries, notes and settings).

        ``d`` may come from a shared checkpoint: everything is checked (types, choices, ranges, at most
        100000 entries and 1000 notes) before anything is replaced, and any problem is a one-line DpgenError.
        """
        if not isinstance(d, dict) or "entries" not in d or "delta" not in d:
            raise DpgenError("corrupt privacy ledger in checkpoint (missing 'entries'/'delta'); delete the checkpoint or restore it")
        if d.get("version", _STATE_VERSION) != _STATE_VERSION:
            raise DpgenError(f"privacy ledger state version {str(d.get('version'))[:20]} is not supported (expected {_STATE_VERSION})")
        delta = as_delta(d["delta"])
        target = d.get("target_epsilon")
        if target is not None:
            if isinstance(target, (bool, str)):
                raise DpgenError(f"corrupt privacy ledger: target_epsilon must be a number, got {target!r:.40}")
            check_epsilon(target, allow_inf=True)
            target = float(target)
        accountant, accounting = d.get("accountant", "rdp"), d.get("accounting", "sound")
        if not isinstance(accountant, str) or not isinstance(accounting, str):
            raise DpgenError("corrupt privacy ledger: accountant and accounting must be strings")
        check_choice("privacy accountant", accountant, ACCOUNTANTS)
        check_choice("privacy accounting", accounting, _ACCOUNTINGS)
        fixed = d.get("fixed_randomness", False)
        if not isinstance(fixed, bool):
            raise DpgenError("corrupt privacy ledger: fixed_randomness must be true or false")
        raw_entries, raw_notes = d["entries"], d.get("notes", [])
        if not isinstance(raw_entries, list) or len(raw_entries) > 100_000:
            raise DpgenError("corrupt privacy ledger: entries must be a list of at most 100000 entries")
        if not isinstance(raw_notes, list) or len(raw_notes) > 1000 or not all(isinstance(n, str) for n in raw_notes):
            raise DpgenError("corrupt privacy ledger: notes must be a list of at most 1000 strings")
        entries = []
        for e in raw_entries:
            if isinstance(e, dict):
                bad = [k for k in ("name", "sampling", "mechanism") if k in e and not isinstance(e[k], str)]
                zs = e.get("noise_multipliers")
                if bad or not isinstance(zs, (list, int, float)) or isinstance(zs, bool) or \
                        (isinstance(zs, list) and (len(zs) > 1000 or any(isinstance(z, (bool, str)) for z in zs))) or \
                        isinstance(e.get("count", 1), (bool, float, str)) or not 1 <= e.get("count", 1) <= 10**15 or \
                        isinstance(e.get("sampling_rate", 1.0), (bool, str)):
                    raise DpgenError(f"corrupt privacy ledger entry {str(e.get('name'))[:40]!r}: bad types or sizes")
            entries.append(LedgerEntry.from_dict(e))
        self.delta, self.target_epsilon = delta, target
        self.accountant, self.accounting, self.fixed_randomness = accountant, accounting, fixed
        self.entries, self.notes = entries, list(raw_notes)
        self._version += 1

    def to_json(self) -> dict:
        """The content of ``privacy.json`` (an infinite epsilon is written as JSON ``Infinity``)."""
        notes = list(self.notes)
        if any(e.noiseless for e in self.entries) and PRIVACY_OFF_NOTE not in notes:
            notes.insert(0, PRIVACY_OFF_NOTE)
        if self.fixed_randomness and FIXED_NOISE_SEED_NOTE not in notes:
            notes.insert(0, FIXED_NOISE_SEED_NOTE)
        return {
            "epsilon": float(self.report_epsilon()),
            "delta": float(self.delta),
            "target_epsilon": self.target_epsilon,
            "accountant": self.accountant,
            "accounting": self.accounting,
            "valid_dp_guarantee": self.valid_dp_guarantee,
            "secret_randomness": not self.fixed_randomness,
            "entries": [e.to_dict() for e in self.entries],
            "notes": notes,
            "sound_epsilon": float(self.epsilon()),
        }

    @classmethod
    def from_json(cls, d: dict) -> "PrivacyLedger":
        """Rebuild a ledger from ``privacy.json`` (to recompute or re-convert its sound ε).

        ``privacy.json`` may come from a shared run directory: it is checked exactly like a checkpoint's
        ledger (:meth:`load_state_dict`), so a damaged or crafted file is a one-line DpgenError.
        """
        if not isinstance(d, dict):
            raise DpgenError(f"privacy.json must hold an object, got {type(d).__name__}")
        ledger = cls(delta=0.5)
        state = {k: d[k] for k in ("delta", "target_epsilon", "accountant", "accounting", "entries", "notes") if k in d}
        if "secret_randomness" in d:
            if not isinstance(d["secret_randomness"], bool):
                raise DpgenError("privacy.json: secret_randomness must be true or false")
            state["fixed_randomness"] = not d["secret_randomness"]
        ledger.load_state_dict(state)
        return ledger

    def __repr__(self) -> str:
        return (
            f"PrivacyLedger(delta={self.delta}, target_epsilon={self.target_epsilon}, accountant={self.accountant!r}, "
            f"accounting={self.accounting!r}, entries={len(self.entries)})"
        )
