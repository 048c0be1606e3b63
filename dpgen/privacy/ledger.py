"""Privacy ledger: what was released, and the (epsilon, delta) it costs.

Every private release a method makes is recorded as a :class:`LedgerEntry`
(a possibly Poisson-subsampled Gaussian or Laplace mechanism, self-composed
``count`` times).  The ledger turns its entries into ``dp_accounting`` events
and asks one of Google's accountants for epsilon:

* ``"rdp"`` (default): :class:`dp_accounting.rdp.RdpAccountant`, Renyi DP of
  the Poisson-subsampled Gaussian (Mironov, Talwar & Zhang 2019) converted to
  (epsilon, delta) with the Canonne-Kamath-Steinke 2020 Prop. 12 bound (the same
  as Balle et al. 2020 Thm 21, which opacus uses).
* ``"pld"``: :class:`dp_accounting.pld.PLDAccountant`, privacy loss
  distributions (Meiser & Mohammadi 2018; Koskela et al. 2020), tighter.

The neighbouring relation is add/remove-one throughout (the relation under
which Poisson subsampling amplifies privacy; Abadi et al. 2016).

Several Gaussian releases computed from the SAME Poisson batch (e.g. the
parameter groups of one model, or two statistics of one batch) are one
sampling event: they are equivalent to a single Gaussian with
``sigma_eff = (sum_k z_k^-2)^-1/2`` (Mironov, Talwar & Zhang 2019, Sec. 3),
which is what :meth:`LedgerEntry.dp_event` emits.  Recording them as separate
sampled events would UNDER-estimate epsilon (they are not independently
sampled), see :meth:`PrivacyLedger.sampled_event`.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterator, Sequence

import dp_accounting
import numpy as np
from dp_accounting import pld as dp_pld
from dp_accounting import rdp as dp_rdp

from dpgen.errors import DpgenError

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

_SAMPLINGS = ("poisson", "none")
_MECHANISMS = ("gaussian", "laplace")
_ACCOUNTANTS = ("rdp", "pld")
_ACCOUNTINGS = ("sound", "paper")
_CONVERSIONS = ("tight", "classic")
_STATE_VERSION = 1


# ----------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------


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


_INF_SPELLINGS = ("inf", ".inf", "+inf", "+.inf", "infinity", "+infinity")


def parse_epsilon(eps: Any, key: str = "eps") -> float:
    """A target epsilon from a config value: a positive number, or ``inf`` for the privacy-off reference.

    Accepts ints, floats and their strings, plus ``inf``/``.inf`` (YAML)/``Infinity``. ``inf`` means
    "no privacy": every noise multiplier is 0, clipping is kept, and the run is never reported as
    private (:attr:`PrivacyLedger.privacy_off`).
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


def _check_ledger_delta(delta: float) -> float:
    try:
        d = float(delta)
    except (TypeError, ValueError):
        raise DpgenError(f"delta must be a number in (0, 1), got {delta!r}") from None
    if not math.isfinite(d) or not 0.0 < d < 1.0:
        raise DpgenError(f"delta must be in (0, 1), got {delta!r}")
    return d


def _check_choice(what: str, value: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise DpgenError(f"{what} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


# ----------------------------------------------------------------------------
# ledger entries
# ----------------------------------------------------------------------------


@dataclass
class LedgerEntry:
    """One kind of private release, self-composed ``count`` times.

    * ``noise_multipliers``: for Gaussian entries, the noise std divided by the
      L2 sensitivity (add/remove-one) of each release made on the same sampled
      batch; they form ONE sampling event with
      ``sigma_eff = (sum z^-2)^-1/2`` (Mironov, Talwar & Zhang 2019, Sec. 3).
      A multiplier of 0 is a release WITHOUT noise (the ``eps=inf`` privacy-off
      reference): its epsilon is infinite.
      For Laplace entries exactly one value, ``b / L1-sensitivity``.
    * ``sampling``: ``"poisson"`` (each example included independently with
      probability ``sampling_rate``; Abadi et al. 2016) or ``"none"`` (the
      release uses the whole data set, ``sampling_rate`` must be 1).
    """

    name: str
    noise_multipliers: list[float]
    sampling: str = "none"
    sampling_rate: float = 1.0
    count: int = 1
    mechanism: str = "gaussian"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise DpgenError(f"ledger entry name must be a non-empty string, got {self.name!r}")
        _check_choice(f"sampling of ledger entry {self.name!r}", self.sampling, _SAMPLINGS)
        _check_choice(f"mechanism of ledger entry {self.name!r}", self.mechanism, _MECHANISMS)
        if isinstance(self.noise_multipliers, (int, float)):
            zs_in: Sequence[Any] = [self.noise_multipliers]
        else:
            zs_in = list(self.noise_multipliers)
        zs: list[float] = []
        for z in zs_in:
            # Cast to python float: dp_accounting's Gaussian-combination helper
            # silently mishandles int noise multipliers.
            try:
                zf = float(z)
            except (TypeError, ValueError):
                raise DpgenError(f"noise multiplier of {self.name!r} must be a number, got {z!r}") from None
            if not math.isfinite(zf) or zf < 0.0:
                raise DpgenError(f"noise multiplier of {self.name!r} must be >= 0 and finite, got {z!r}")
            zs.append(zf)
        if not zs:
            raise DpgenError(f"ledger entry {self.name!r} needs at least one noise multiplier")
        if self.mechanism == "laplace" and len(zs) != 1:
            raise DpgenError(f"laplace ledger entry {self.name!r} takes exactly one noise multiplier, got {len(zs)}")
        self.noise_multipliers = zs
        try:
            q = float(self.sampling_rate)
        except (TypeError, ValueError):
            raise DpgenError(f"sampling rate of {self.name!r} must be a number, got {self.sampling_rate!r}") from None
        if not (0.0 < q <= 1.0):
            raise DpgenError(f"sampling rate of {self.name!r} must be in (0, 1], got {self.sampling_rate!r}")
        if self.sampling == "none" and q != 1.0:
            raise DpgenError(f"ledger entry {self.name!r} has sampling='none' but sampling_rate={q}; use sampling='poisson'")
        self.sampling_rate = q
        try:
            bad_count = isinstance(self.count, bool) or int(self.count) != self.count or int(self.count) < 1
        except (TypeError, ValueError, OverflowError):
            bad_count = True
        if bad_count:
            raise DpgenError(f"count of ledger entry {self.name!r} must be an integer >= 1, got {self.count!r}")
        self.count = int(self.count)

    # -- accounting -----------------------------------------------------------

    @property
    def effective_noise_multiplier(self) -> float:
        """``(sum z^-2)^-1/2``: the single Gaussian equivalent to all releases on one batch."""
        if self.mechanism == "laplace":
            return self.noise_multipliers[0]
        if min(self.noise_multipliers) == 0.0:
            return 0.0  # one noiseless release on the batch: no privacy at all
        return math.fsum(z ** -2 for z in self.noise_multipliers) ** -0.5

    @property
    def noiseless(self) -> bool:
        """True when the release adds no noise (epsilon is infinite)."""
        return self.effective_noise_multiplier == 0.0

    def _mechanism_event(self) -> dp_accounting.DpEvent:
        if self.mechanism == "laplace":
            return dp_accounting.LaplaceDpEvent(self.noise_multipliers[0])
        return dp_accounting.GaussianDpEvent(self.effective_noise_multiplier)

    def _unit_event(self) -> dp_accounting.DpEvent:
        mech = self._mechanism_event()
        if self.sampling == "poisson":
            return dp_accounting.PoissonSampledDpEvent(self.sampling_rate, mech)
        return mech

    def dp_event(self) -> dp_accounting.DpEvent:
        """``SelfComposed(PoissonSampled(q, mechanism), count)``.

        For ``sampling="none"`` the ``PoissonSampled`` wrapper is left out
        (``q=1`` is the identity): RdpAccountant rejects ``PoissonSampled`` of
        a Laplace event, and PLDAccountant composes a bare Gaussian exactly
        (std/sqrt(count)) instead of by discretised self-convolution.
        """
        return dp_accounting.SelfComposedDpEvent(self._unit_event(), self.count)

    def same_release(self, other: "LedgerEntry") -> bool:
        """True when ``other`` differs from this entry at most in ``count``."""
        return (
            self.name == other.name
            and self.noise_multipliers == other.noise_multipliers
            and self.sampling == other.sampling
            and self.sampling_rate == other.sampling_rate
            and self.mechanism == other.mechanism
        )

    # -- serialisation --------------------------------------------------------

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "noise_multipliers": [float(z) for z in self.noise_multipliers],
            "sampling": self.sampling,
            "sampling_rate": float(self.sampling_rate),
            "count": int(self.count),
            "mechanism": self.mechanism,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "LedgerEntry":
        if not isinstance(d, dict) or "name" not in d or "noise_multipliers" not in d:
            raise DpgenError(f"corrupt ledger entry (needs 'name' and 'noise_multipliers'): {d!r}"[:300])
        unknown = set(d) - {"name", "noise_multipliers", "sampling", "sampling_rate", "count", "mechanism"}
        if unknown:
            raise DpgenError(f"corrupt ledger entry {d.get('name')!r}: unknown keys {sorted(unknown)}")
        return cls(
            name=d["name"],
            noise_multipliers=list(d["noise_multipliers"]),
            sampling=d.get("sampling", "none"),
            sampling_rate=d.get("sampling_rate", 1.0),
            count=d.get("count", 1),
            mechanism=d.get("mechanism", "gaussian"),
        )


# ----------------------------------------------------------------------------
# accounting over a list of entries
# ----------------------------------------------------------------------------


def _rdp_curve(accountant: dp_rdp.RdpAccountant) -> tuple[np.ndarray, np.ndarray]:
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


def _compose_checked(accountant: dp_accounting.PrivacyAccountant, entry: LedgerEntry, event: dp_accounting.DpEvent) -> None:
    try:
        accountant.compose(event)
    except dp_accounting.UnsupportedEventError:
        kind = type(accountant).__name__
        hint = " (use accountant='pld')" if entry.mechanism == "laplace" and entry.sampling == "poisson" else ""
        raise DpgenError(
            f"{kind} cannot account ledger entry {entry.name!r} ({entry.sampling}-sampled {entry.mechanism}){hint}"
        ) from None


@lru_cache(maxsize=4096)
def _unit_rdp(sampling: str, q: float, mechanism: str, z_eff: float) -> tuple[np.ndarray, np.ndarray]:
    """RDP curve of ONE application of a (possibly Poisson-subsampled) mechanism, from dp_accounting."""
    entry = LedgerEntry("unit", [z_eff], sampling=sampling, sampling_rate=q, count=1, mechanism=mechanism)
    acct = dp_rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    _compose_checked(acct, entry, entry._unit_event())
    orders, rdp = _rdp_curve(acct)
    orders.flags.writeable = False
    rdp.flags.writeable = False
    return orders, rdp


def _total_rdp(entries: Sequence[LedgerEntry]) -> tuple[np.ndarray, np.ndarray]:
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
    _check_choice("accountant", accountant, _ACCOUNTANTS)
    _check_choice("conversion", conversion, _CONVERSIONS)
    delta = _check_ledger_delta(delta)
    entries = list(entries)
    if not entries:
        return 0.0
    if any(e.noiseless for e in entries):
        return math.inf
    if conversion == "classic":
        orders, rdp = _total_rdp(entries)
        with np.errstate(over="ignore", invalid="ignore"):
            eps = rdp - math.log(delta) / (orders - 1.0)
        return float(max(0.0, np.nanmin(eps)))
    if accountant == "rdp":
        orders, rdp = _total_rdp(entries)
        eps = float(dp_rdp.compute_epsilon(orders, rdp, delta)[0])
    else:
        acct = dp_pld.PLDAccountant(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
        for e in entries:
            _compose_checked(acct, e, e.dp_event())
        eps = float(acct.get_epsilon(delta))
    return max(0.0, min(eps, _pure_dp_bound(entries)))


# ----------------------------------------------------------------------------
# the ledger
# ----------------------------------------------------------------------------


class EventBuilder:
    """Collects the Gaussian releases made on ONE sampled batch (see :meth:`PrivacyLedger.sampled_event`)."""

    def __init__(self, name: str, sampling: str, sampling_rate: float) -> None:
        self.name = name
        self.sampling = sampling
        self.sampling_rate = float(sampling_rate)
        self.noise_multipliers: list[float] = []

    def add_gaussian(self, noise_multiplier: float) -> None:
        """Add one Gaussian release (noise std / L2 sensitivity = ``noise_multiplier``) on this batch."""
        z = float(noise_multiplier)
        if not math.isfinite(z) or z < 0.0:
            raise DpgenError(f"noise multiplier of {self.name!r} must be >= 0 and finite, got {noise_multiplier!r}")
        self.noise_multipliers.append(z)


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
        self.delta = _check_ledger_delta(delta)
        if target_epsilon is not None:
            check_epsilon(target_epsilon, allow_inf=True)
            target_epsilon = float(target_epsilon)
        self.target_epsilon: float | None = target_epsilon
        self.accountant = _check_choice("privacy accountant", accountant, _ACCOUNTANTS)
        self.accounting = _check_choice("privacy accounting", accounting, _ACCOUNTINGS)
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
        _check_choice(f"sampling of {name!r}", sampling, _SAMPLINGS)
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
        delta = _check_ledger_delta(d["delta"])
        target = d.get("target_epsilon")
        if target is not None:
            if isinstance(target, (bool, str)):
                raise DpgenError(f"corrupt privacy ledger: target_epsilon must be a number, got {target!r:.40}")
            check_epsilon(target, allow_inf=True)
            target = float(target)
        accountant, accounting = d.get("accountant", "rdp"), d.get("accounting", "sound")
        if not isinstance(accountant, str) or not isinstance(accounting, str):
            raise DpgenError("corrupt privacy ledger: accountant and accounting must be strings")
        _check_choice("privacy accountant", accountant, _ACCOUNTANTS)
        _check_choice("privacy accounting", accounting, _ACCOUNTINGS)
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


# ----------------------------------------------------------------------------
# budget guard
# ----------------------------------------------------------------------------


class BudgetGuard:
    """Stops a training loop exactly before its steps would push epsilon past the target.

    The largest number of further steps of ``entry`` that keep
    ``epsilon <= target_epsilon`` (given the ledger's entries when the guard is
    made) is found ONCE by integer bisection (:func:`calibrate_steps`);
    :meth:`allows` and :meth:`step` then only count.  If something else records
    into the ledger meanwhile, the bound is recomputed on the next
    :meth:`allows`/:meth:`step` so the guarantee stays sound.
    """

    def __init__(self, ledger: PrivacyLedger, entry: LedgerEntry, max_count: int | None = None) -> None:
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
        from dpgen.privacy.calibrate import calibrate_steps  # local import: calibrate imports this module

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
