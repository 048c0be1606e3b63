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
* :class:`SanitizerCanaries` (the GS-WGAN family's gradient sanitisers: gswgan, dpac, efsgd): canaries belong to
  the K partitions as records do (canary j to partition j mod K, in generated-sample row (j // K) mod B). An
  iteration that draws partition k gives each included canary of k a per-sample image gradient (the sanitiser's
  input row) that is a Dirac vector of norm :data:`DIRAC_NORM` × C on a reserved coordinate d + j appended to
  the d image-gradient coordinates; the sanitiser clips the extended rows and noises every column with one
  draw, and only the first d columns go on to G. Score: the released value of coordinate d + j in the canary's
  row, summed over every iteration (whichever partition it drew).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from dpgen.audit.canaries import Canaries, Channel
from dpgen.errors import DpgenError
from dpgen.privacy.randomness import require_secret

__all__ = ["DIRAC_NORM", "DpsgdCanaries", "VoteCanaries", "FeatureCanaries", "SanitizerCanaries", "dirac_rows"]

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


class SanitizerCanaries(Channel):
    """Canaries of one GS-WGAN gradient sanitiser (GS-WGAN Alg. 1 / DPAC Eq. 5, 9; EFSGD Eq. 7–11): m reserved
    coordinates after the d coordinates of each per-sample image-gradient row (d pixels, or L coefficients with
    ``dpac.grad_basis``).

    Canary j is a record of partition j mod K; in an iteration that draws its partition it is the generated
    sample of row (j // K) (so m ≤ K·B: at most one canary per partition and row). The trainer calls
    :meth:`start_iteration` with the drawn partitions k_1..k_M (a device tensor); the sanitiser then calls
    :meth:`extend` on its (M·B, d) rows (member j's B rows) before clipping, and :meth:`release` on its (B, d + m)
    release (the clipped rows summed over the M members, plus noise), which scores the reserved coordinates and
    hands the first d columns back. Row r of an iteration that
    drew k carries e_{d+j}·DIRAC_NORM·C for the included canary j = k + r·K: after the clip it adds C to that one
    row, within the 2C per row (all B rows) that the sanitiser's sensitivity argument allows a record of
    partition k. An error-feedback sanitiser (efsgd) clips and keeps error states on the extended rows, so a
    canary's residual is fed back like any coordinate's (bounded by C2 per row, within 2(C1 + C2)).

    The score reads only the released values: coordinate d + j of row j // K (public), summed over every
    iteration, whichever partition it drew, so the auditor never uses the secret draw k.
    """

    kind = "sanitizer"

    def __init__(self, canaries: Canaries, name: str, partitions: int, rows: int, clip: float, noise_std: float,
                 where: str = "") -> None:
        k, b, m = int(partitions), int(rows), canaries.m
        if m > k * b:
            raise DpgenError(f"audit.canaries={m} must be <= K*B = {k}*{b} = {k * b} for {name} (one canary per "
                             "partition and generated-sample row)")
        super().__init__(canaries, name, unit=float(clip), noise=float(noise_std) / float(clip),
                         where=where or f"{name}: a generated sample's image gradient before clipping, a Dirac "
                                        f"vector of norm {DIRAC_NORM:g}*C on the canary's reserved coordinate, in "
                                        "row j // K of the iterations that draw its partition j mod K")
        self.clip, self.partitions, self.rows_per_release = float(clip), k, b
        dev = canaries.device
        j = torch.arange(m, device=dev)
        #: [K, B]: the canary of partition k in row r (m: none), and DIRAC_NORM·C where it is included, else 0
        table = torch.full((k * b,), m, dtype=torch.long, device=dev)
        table[(j % k) * b + j // k] = j
        self.table = table.view(k, b)
        value = torch.cat([canaries.included.to(torch.float32) * (DIRAC_NORM * self.clip),
                           torch.zeros(1, device=dev)])
        self.value = value[self.table]
        self.row_of, self.cols = j // k, j  # canary j's row (public) and its column after the d image columns
        self.current: torch.Tensor | None = None
        self.shape: torch.Size | None = None

    def start_iteration(self, k: torch.Tensor) -> None:
        """The iteration drew partitions ``k`` (a device tensor of M ≥ 0 members: no host sync): their included
        canaries enter this iteration's rows."""
        self.current = k.reshape(-1)

    def extend(self, rows: torch.Tensor) -> torch.Tensor:
        """(M·B, ...) rows, member j's B rows after member j-1's → (M·B, d + m): the rows flattened, then the
        canaries' Dirac columns (before clipping); a canary of partition k_j enters member j's rows only."""
        if self.current is None:
            raise RuntimeError(f"audit channel {self.name}: start_iteration(k) was not called")
        b, m_members = self.rows_per_release, len(self.current)
        if rows.shape[0] != m_members * b:
            raise RuntimeError(f"audit channel {self.name}: {rows.shape[0]} rows, expected M*B={m_members}*{b}")
        self.shape = torch.Size((b, *rows.shape[1:]))
        flat = rows.flatten(1)
        extra = torch.zeros(rows.shape[0], self.m + 1, dtype=flat.dtype, device=flat.device)
        # index_select with the device tensor k: indexing by a 0-d tensor would read it back to the host
        extra.scatter_(1, self.table.index_select(0, self.current).view(-1, 1),
                       self.value.index_select(0, self.current).view(-1, 1).to(flat.dtype))
        return torch.cat([flat, extra[:, :self.m]], dim=1)

    def release(self, released: torch.Tensor) -> torch.Tensor:
        """Score the reserved coordinates of the (B, d + m) release; return its first d columns in the rows'
        original shape (what goes on to G)."""
        d = released.shape[1] - self.m
        self.observe(released.detach()[self.row_of, d + self.cols])
        return released[:, :d].reshape(self.shape)

    @classmethod
    def attach(cls, canaries: Canaries, partitions: int, rows: int,
               sanitizers: dict[str, object]) -> "SanitizerGroup":
        """One channel per sanitiser path (``sanitizers``: name → sanitiser, None for a path that is off), each set
        as its sanitiser's ``audit``; returns the group whose :meth:`SanitizerGroup.start_iteration` the trainer
        calls once per iteration."""
        group = []
        for name, san in sanitizers.items():
            if san is None:
                continue
            ch = cls(canaries, name, partitions, rows, san.clip, san.noise_std)
            san.audit = ch
            group.append(ch)
        return SanitizerGroup(group)


class SanitizerGroup:
    """The sanitiser channels of one GS-WGAN-family run."""

    def __init__(self, channels: list[SanitizerCanaries]) -> None:
        self.channels = channels

    def start_iteration(self, k: torch.Tensor) -> None:
        """The iteration drew partitions ``k`` (one with the paper's uniform draw, Alg. 1 line 2; any number with
        Poisson sampling): every path's canaries of those partitions enter this iteration's rows."""
        for ch in self.channels:
            ch.start_iteration(k)
