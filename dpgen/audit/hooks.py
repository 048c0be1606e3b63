"""The canary hooks of dpgen's mechanism families (each a :class:`~dpgen.audit.canaries.Channel`).

Every hook gives canary j a coordinate of its own that no real record can reach, puts the included canaries
into the mechanism's input where its records enter it (before the mechanism bounds them), and reads back the
mechanism's release on those coordinates. What one canary adds is exactly what one record may add under the
mechanism's sensitivity argument: more would report a leak that is not there, less would waste power.

* :class:`DpsgdCanaries` (DP-SGD: dpgan's D, feta/dpdm's denoiser, dpaf's conv1 and conv2*): a canary's
  per-sample gradient is a Dirac vector of norm :data:`DIRAC_NORM` × C on its own coordinate of an extra
  parameter vector that no forward pass uses, so real records' gradients are 0 there. The mechanism clips it
  to C with the real rows and adds its noise to the extra coordinates too; the score sums the released noisy
  gradient sum on the coordinate over every step (sampled or not).
* :class:`VoteCanaries` (G-PATE's Confident-GNMax): each canary is the only record of a teacher of its own,
  which votes, in every query, into a reserved bin appended to the vote histogram; an excluded canary's teacher
  has no data and abstains. The histogram moves by one vote (ℓ2 1 ≤ √2, the sensitivity the ledger charges a
  query with). Score: the noisy reserved bin summed over every query.
* :class:`FeatureCanaries` (DPAF's DPAGG): a canary's feature row is a Dirac vector of norm √m·p (the bound SIN
  gives every row, Eq. 4) on a reserved coordinate appended to the aggregated space; it is Poisson-sampled
  with its group and split into one of the group's μ sub-batches as the records are (secret draws). Score: the released aggregate's
  reserved coordinate summed over all μ releases of every group.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from dpgen.audit.canaries import Canaries, Channel
from dpgen.privacy.randomness import require_secret

__all__ = ["DIRAC_NORM", "DpsgdCanaries", "VoteCanaries", "FeatureCanaries", "dirac_rows"]

#: a DP-SGD canary's per-sample gradient norm, in units of the clip norm C: far above C, so that a missing or
#: loosened clip lets ~1000× the canary through and the audit sees it at once; clipped, it adds exactly C
DIRAC_NORM = 1000.0


def dirac_rows(idx: torch.Tensor, m: int, norm: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(len(idx), m) rows: row r is ``norm`` · e_{idx[r]}."""
    rows = torch.zeros(len(idx), m, dtype=dtype, device=idx.device)
    rows[torch.arange(len(idx), device=idx.device), idx] = float(norm)
    return rows


class DpsgdCanaries(Channel):
    """DP-SGD canaries on m reserved coordinates (:attr:`coordinates`, an extra parameter vector that no
    forward pass uses). Each step the mechanism asks for :meth:`rows` (the sampled included canaries'
    per-sample gradients on the reserved coordinates), clips and noises them with the real rows, and hands
    its released noisy sum on the coordinates to :meth:`observe`.

    ``sample()`` says which included canaries this step's batch holds (:class:`~dpgen.audit.canaries.PoissonCanaries`
    at the mechanism's rate, or the sample of a sampling event the step shares with another release).
    ``scale``: what the release divides the noisy sum by (feta's expected batch B*; 1 for a sum).
    """

    kind = "dp-sgd"

    def __init__(self, canaries: Canaries, name: str, clip: float, noise_multiplier: float,
                 sample: Callable[[], torch.Tensor], scale: float = 1.0, where: str = "") -> None:
        super().__init__(canaries, name, unit=float(clip) / float(scale), noise=noise_multiplier,
                         where=where or f"{name}: per-sample gradient before clipping, a Dirac vector of norm "
                                        f"{DIRAC_NORM:g}*C on the canary's reserved parameter coordinate")
        self.clip = float(clip)
        self.sample = sample
        #: the reserved coordinates: a parameter so that the optimizer machinery treats it like any other
        self.coordinates = nn.Parameter(torch.zeros(canaries.m, device=canaries.device))

    @classmethod
    def poisson(cls, canaries: Canaries, name: str, clip: float, noise_multiplier: float, q: float,
                scale: float = 1.0) -> "DpsgdCanaries":
        """Canaries of a DP-SGD phase whose steps Poisson-sample records at rate ``q``: sampled alike."""
        return cls(canaries, name, clip, noise_multiplier, canaries.poisson(name, q).draw, scale)

    def rows(self) -> torch.Tensor:
        """This step's canary rows (c, m): Dirac vectors of norm DIRAC_NORM·C, before clipping."""
        return dirac_rows(self.sample(), self.m, DIRAC_NORM * self.clip, self.coordinates.dtype)

    def observe_release(self) -> None:
        """Read the released noisy gradient on the reserved coordinates (``coordinates.grad``)."""
        self.observe(self.coordinates.grad)


class VoteCanaries(Channel):
    """G-PATE canaries: m reserved bins after the B real bins of every query's vote histogram.

    Canary j is the one record of a teacher of its own (not one of the real teachers, whose partitions and
    votes stay exactly those of the run); that teacher votes into bin B + j in every query when the canary is
    included and abstains otherwise. The number of teachers and N do not enter G-PATE's (data-independent)
    accounting, so the ledger is unchanged.
    """

    kind = "votes"

    def __init__(self, canaries: Canaries, name: str, sigma: float, where: str = "") -> None:
        super().__init__(canaries, name, unit=1.0, noise=sigma,
                         where=where or f"{name}: the vote histogram before the Gaussian argmax noise; a canary's "
                                        "teacher votes into a reserved bin of its own in every query")

    def votes(self, queries: int) -> torch.Tensor:
        """(queries, m) vote counts of the canaries' teachers: 1 in every query for an included canary."""
        return self.canaries.included.to(torch.float32).unsqueeze(0).expand(int(queries), self.m)

    def observe_queries(self, noisy: torch.Tensor) -> None:
        """``noisy`` (queries, m): the noisy reserved bins of one aggregation, summed over its queries."""
        self.observe(noisy.sum(0))


class FeatureCanaries(Channel):
    """DPAF DPAGG canaries: m reserved coordinates after the d = m_feat·p·p aggregated feature coordinates.

    :meth:`start_group` draws which included canaries the group's Poisson sample (rate ρ) holds and into which of
    the μ disjoint sub-batches each goes (uniform; any split keeps the ledger's bound); :meth:`rows` gives
    sub-batch j's canary feature rows, Dirac vectors of norm ``sensitivity`` (√m·p, the row bound of SIN).
    """

    kind = "dpagg"

    def __init__(self, canaries: Canaries, name: str, sensitivity: float, noise_multiplier: float, rate: float,
                 mu: int, where: str = "") -> None:
        super().__init__(canaries, name, unit=sensitivity, noise=noise_multiplier, per_event=mu,
                         where=where or f"{name}: a feature row entering DPAGG's sum, a Dirac vector of norm "
                                        "sqrt(m)*p (SIN's row bound) on the canary's reserved coordinate")
        self.sensitivity, self.mu = float(sensitivity), int(mu)
        self.sampler = canaries.poisson(name, rate)
        self.split_gen = require_secret(canaries.stream(f"{name}.split"), "audit canary split")
        self.group: torch.Tensor = torch.zeros(0, dtype=torch.long, device=canaries.device)
        self.parts: list[torch.Tensor] = []

    def start_group(self, split: Callable[[torch.Tensor, int, torch.Generator], list[torch.Tensor]]
                    ) -> torch.Tensor:
        """Draw the next group's canaries and ``split`` them into the μ sub-batches (the split the records get,
        from a secret stream of the audit's); returns the group's sampled canaries (all μ sub-batches: what a
        DP-SGD step on the whole group sample holds)."""
        self.group = self.sampler.draw()
        self.parts = split(self.group, self.mu, self.split_gen)
        return self.group

    def rows(self, j: int) -> torch.Tensor:
        """Sub-batch j's canary feature rows on the reserved coordinates (c_j, m)."""
        return dirac_rows(self.parts[j], self.m, self.sensitivity)
