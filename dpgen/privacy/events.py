"""Mechanism events: what one kind of private release is, as the ledger records it.

A :class:`LedgerEntry` is a possibly Poisson-subsampled Gaussian or Laplace mechanism, self-composed
``count`` times; :meth:`LedgerEntry.dp_event` turns it into the ``dp_accounting`` event that the
composition backends (:mod:`dpgen.privacy.accountants`) account, as opacus' accountants consume
``(noise_multiplier, sample_rate)`` steps.

The neighbouring relation is add/remove-one throughout (the relation under
which Poisson subsampling amplifies privacy; Abadi et al. 2016).

Several Gaussian releases computed from the SAME Poisson batch (e.g. the
parameter groups of one model, or two statistics of one batch) are one
sampling event: they are equivalent to a single Gaussian with
``sigma_eff = (sum_k z_k^-2)^-1/2`` (Mironov, Talwar & Zhang 2019, Sec. 3),
which is what :meth:`LedgerEntry.dp_event` emits and what :class:`EventBuilder`
collects.  Recording them as separate sampled events would UNDER-estimate
epsilon (they are not independently sampled), see
:meth:`dpgen.privacy.ledger.PrivacyLedger.sampled_event`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import dp_accounting

from dpgen.errors import DpgenError
from dpgen.privacy.validation import check_choice

__all__ = ["EventBuilder", "LedgerEntry", "MECHANISMS", "SAMPLINGS"]

#: how a release picks its records: Poisson subsampling at ``sampling_rate``, or the whole data set
SAMPLINGS = ("poisson", "none")
#: the noise a release adds
MECHANISMS = ("gaussian", "laplace")


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
        check_choice(f"sampling of ledger entry {self.name!r}", self.sampling, SAMPLINGS)
        check_choice(f"mechanism of ledger entry {self.name!r}", self.mechanism, MECHANISMS)
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

    def unit_event(self) -> dp_accounting.DpEvent:
        """ONE application of the release: ``PoissonSampled(q, mechanism)``, or the bare mechanism if unsampled."""
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
        return dp_accounting.SelfComposedDpEvent(self.unit_event(), self.count)

    def compose_into(self, accountant: dp_accounting.PrivacyAccountant, unit: bool = False) -> None:
        """Compose :meth:`dp_event` (:meth:`unit_event` if ``unit``) into a dp_accounting accountant.

        An event the accountant cannot account (RdpAccountant and a Poisson-sampled Laplace release) is a
        one-line DpgenError naming this entry.
        """
        event = self.unit_event() if unit else self.dp_event()
        try:
            accountant.compose(event)
        except dp_accounting.UnsupportedEventError:
            kind = type(accountant).__name__
            hint = " (use accountant='pld')" if self.mechanism == "laplace" and self.sampling == "poisson" else ""
            raise DpgenError(
                f"{kind} cannot account ledger entry {self.name!r} ({self.sampling}-sampled {self.mechanism}){hint}"
            ) from None

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


class EventBuilder:
    """Collects the Gaussian releases made on ONE sampled batch (see
    :meth:`dpgen.privacy.ledger.PrivacyLedger.sampled_event`), which the ledger records as one entry."""

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
