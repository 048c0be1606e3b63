"""The canary hooks of dpgen's mechanism families (each a :class:`~dpgen.audit.canaries.Channel`).

Every hook gives canary j coordinates of its own that no real record can reach, puts the included canaries
into the mechanism's input where its records enter it (before the mechanism bounds them), and reads back the
mechanism's release on those coordinates. What one canary adds is at most what one record may add under the
mechanism's sensitivity argument (more would report a leak that is not there), and as much of it as the
mechanism's structure lets a canary use (less wastes power): the channel's ``strength`` (shift ÷ sensitivity)
says how much, and the f-DP bound tests the canaries against the mechanism at that strength.

* :class:`DpsgdCanaries` (DP-SGD: dpgan's D, feta/dpdm's denoiser, dpaf's conv1 and conv2*): a canary's
  per-sample gradient is a Dirac vector of norm :data:`DIRAC_NORM` × C on its own coordinate of an extra
  parameter vector that no forward pass uses, so real records' gradients are 0 there. The mechanism clips it
  to C with the real rows and adds its noise to the extra coordinates too: it moves its coordinate by C, the
  whole sensitivity (strength 1). A canary costs one coordinate.
* :class:`VoteCanaries` (G-PATE's Confident-GNMax): each canary is the only record of a teacher of its own, which
  votes, in every query, into one of two reserved bins appended to the vote histogram: bin B_j when the canary is
  included, A_j when it is not (an empty teacher's vote, as a data-independent default). The histogram moves by
  one vote from A_j to B_j: ℓ2 √2, the sensitivity the ledger charges the argmax with (strength 1; the
  threshold check, charged apart, sees the real bins only). A canary costs two bins of every query.
* :class:`FeatureCanaries` (DPAF's DPAGG): a canary's feature row is a Dirac vector of norm √m·p (the bound SIN
  gives every row, Eq. 4) on a reserved coordinate appended to the aggregated space (strength 1); it is
  Poisson-sampled with its group (a secret draw) into sub-batch j mod μ (public: the ledger charges one Gaussian
  per group whatever the split); its conv2* gradient is a :class:`DpsgdCanaries` of the same sampling event.
* :class:`SanitizerCanaries` (the GS-WGAN family's gradient sanitisers: gswgan, dpac, efsgd): canaries are
  records of the K partitions (canary j of partition j mod K). Each sampled member releases, beside its B image
  rows (its gradients w.r.t. the B generated images), canary rows that only canaries use: canary j owns b of
  them (:func:`sanitizer_rows_per_canary`), each :data:`DIRAC_NORM` × C before the per-row clip, so it moves
  each by C. The sanitiser clips every row with the clip of its image rows, sums the sampled members' rows per
  position, noises them with the std of its image release, and only the B image rows go on to G: real rows
  and G never see a canary. b is chosen so that C·√b reaches the sensitivity a record is charged for (2C·√B: b = 4B;
  efsgd's 2(C1 + C2)·√B: b = 4B(1 + C2/C1)²), strength 1: an included canary is 0 → Δ on its own entries when
  its partition is drawn, the add/remove pair of the ledger's Poisson-subsampled Gaussian. (A canary that took
  ±C on one row, −C when out, would use the same norm on fewer rows, but it is a pair that the ledger's
  add/remove analysis does not dominate at small ε.) A canary costs b one-value rows of its partition's member.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable

import torch
from torch import nn

from dpgen.audit.canaries import Canaries, Channel, SamplingGroup
from dpgen.errors import DpgenError

__all__ = ["DIRAC_NORM", "ROW_BUDGET", "DEFAULT_ROW_BUDGET", "DpsgdCanaries", "VoteCanaries", "FeatureCanaries",
           "SanitizerCanaries", "max_sanitizer_canaries", "sanitizer_rows_per_canary"]

#: a canary's gradient (or row) norm before clipping, in units of the clip norm C: far above C, so that a
#: missing or loosened clip lets ~1000x the canary through and the audit sees it at once; clipped, it adds C
DIRAC_NORM = 1000.0
#: the canary rows one GS-WGAN-family member may take per image row: the canaries of one partition times their b
#: rows each stay within ROW_BUDGET·B (the cap on m); the default m takes a quarter of it (DEFAULT_ROW_BUDGET·B,
#: quick B = 16: 1,024 one-value rows a member, and K times that many noised positions a release)
ROW_BUDGET = 256
DEFAULT_ROW_BUDGET = 64


def sanitizer_rows_per_canary(row_sensitivity: float, clip: float, rows: int) -> int:
    """b: the canary rows one GS-WGAN-family canary owns, each moved by ``clip`` C, so that its shift C·√b reaches
    the ℓ2 sensitivity ``row_sensitivity``·√B a record is charged for on a member's B ``rows`` (strength 1): the
    largest b with C·√b ≤ row_sensitivity·√B, at most DEFAULT_ROW_BUDGET·B (so that the default m holds one
    canary per partition; beyond it, e.g. efsgd with C2 > 3·C1, the strength falls below 1)."""
    full = math.floor((float(row_sensitivity) / float(clip)) ** 2 * int(rows) * (1 + 1e-9))
    return max(1, min(full, DEFAULT_ROW_BUDGET * int(rows)))


def max_sanitizer_canaries(partitions: int, rows: int, per: int, budget: int = ROW_BUDGET) -> int:
    """The most canaries a GS-WGAN-family audit takes: K·⌊budget·B / b⌋ (b rows per canary, at most budget·B canary
    rows per member); ``budget=DEFAULT_ROW_BUDGET``: the default m."""
    return int(partitions) * (int(budget) * int(rows) // int(per))


class DpsgdCanaries(Channel):
    """DP-SGD canaries on m reserved coordinates (:attr:`coordinates`, an extra parameter vector that no
    forward pass uses). Each step the mechanism asks for :meth:`clipped_sum` (the sampled included canaries'
    per-sample gradients on the reserved coordinates, clipped by its own clipping factors), adds it to the
    reserved coordinates of the records' clipped sum, noises them with the model's, and hands its released
    noisy sum on the coordinates to :meth:`observe`.

    ``sample()`` says which included canaries this step's batch holds (:class:`~dpgen.audit.canaries.PoissonCanaries`
    at the mechanism's rate, or the sample of a sampling event the step shares with other releases: ``group``).
    ``scale``: what the release divides the noisy sum by (feta's expected batch B*; 1 for a sum).
    """

    kind = "dp-sgd"

    def __init__(self, canaries: Canaries, name: str, clip: float, noise_multiplier: float,
                 sample: Callable[[], torch.Tensor], scale: float = 1.0, rate: float = 1.0,
                 group: SamplingGroup | None = None, where: str = "") -> None:
        unit = float(clip) / float(scale)
        super().__init__(canaries, name, shift=unit, noise_std=float(noise_multiplier) * unit, sensitivity=unit,
                         rate=rate, group=group, ledger_multipliers=[float(noise_multiplier)],
                         where=where or f"{name}: per-sample gradient before clipping, a Dirac vector of norm "
                                        f"{DIRAC_NORM:g}*C on the canary's reserved parameter coordinate")
        self.clip = float(clip)
        self.sample = sample
        #: the reserved coordinates: a parameter so that the optimizer machinery treats it like any other
        self.coordinates = nn.Parameter(torch.zeros(canaries.m, device=canaries.device))

    @classmethod
    def poisson(cls, canaries: Canaries, name: str, clip: float, noise_multiplier: float, q: float,
                scale: float = 1.0) -> "DpsgdCanaries":
        """Canaries of a DP-SGD phase whose steps Poisson-sample records at rate ``q``: sampled alike, one
        sampling event per step."""
        return cls(canaries, name, clip, noise_multiplier, canaries.poisson(name, q).draw, scale, rate=q)

    def clipped_sum(self, factors: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Σ_i c_i·g_i over this step's sampled canaries: an m-vector on the reserved coordinates, c_i =
        ``factors(‖g_i‖)`` the mechanism's own per-sample clipping factors. g_i is a Dirac vector of norm
        DIRAC_NORM·C on canary i's coordinate and zero on the model, so its norm over all parameters is that
        value and its clipped row touches one coordinate: O(c + m) work, where dense (c, m) rows cost c·m
        (m = 50,000 canaries at q = 0.36: 9,000 rows of 50,000 a step)."""
        idx = self.sample()
        dtype = self.coordinates.dtype
        value = torch.full((len(idx),), DIRAC_NORM * self.clip, dtype=dtype, device=idx.device)
        out = torch.zeros(self.m, dtype=dtype, device=self.coordinates.device)
        return out.index_add_(0, idx, factors(value.abs()) * value)

    def observe_release(self) -> None:
        """Read the released noisy gradient on the reserved coordinates (``coordinates.grad``)."""
        self.observe(self.coordinates.grad)


class VoteCanaries(Channel):
    """G-PATE canaries: 2m reserved bins after the real bins of every query's vote histogram, A_0..A_{m-1} then
    B_0..B_{m-1}.

    Canary j is the one record of a teacher of its own (not one of the real teachers, whose partitions and
    votes stay exactly those of the run); that teacher votes into B_j in every query when the canary is
    included and into A_j otherwise. The number of teachers and N do not enter G-PATE's (data-independent)
    accounting, so the ledger is unchanged. ``ledger_multipliers``: the ledger's multipliers of one query
    (threshold σ1/1 and argmax σ2/√2, or the argmax alone).
    """

    kind = "votes"

    def __init__(self, canaries: Canaries, name: str, sigma: float, ledger_multipliers: Iterable[float],
                 where: str = "") -> None:
        super().__init__(canaries, name, shift=math.sqrt(2.0), noise_std=float(sigma), sensitivity=math.sqrt(2.0),
                         rate=1.0, ledger_multipliers=list(ledger_multipliers),
                         where=where or f"{name}: the vote histogram before the Gaussian argmax noise; a canary's "
                                        "teacher votes into reserved bin B_j (included) or A_j (excluded) of every "
                                        "query")

    @property
    def bins(self) -> int:
        """Reserved bins per query."""
        return 2 * self.m

    def votes(self, queries: int) -> torch.Tensor:
        """(queries, 2m) vote counts of the canaries' teachers: one vote per canary and query, in B_j or A_j."""
        inc = self.canaries.included.to(torch.float32)
        return torch.cat([1.0 - inc, inc]).unsqueeze(0).expand(int(queries), self.bins)

    def observe_queries(self, noisy: torch.Tensor) -> None:
        """``noisy`` (queries, 2m): the noisy reserved bins of one aggregation. Per query the difference
        d = B_j − A_j has mean +1 (in) or −1 (out) and std √2·σ: log-likelihood ratio d / σ², summed over the
        queries (unsampled events)."""
        d = (noisy[:, self.m:] - noisy[:, :self.m]).detach().to(self.canaries.score_dtype).sum(0)
        self.observe_log_ratio(d / self.score_std ** 2, events=int(noisy.shape[0]))


class FeatureCanaries(Channel):
    """DPAF DPAGG canaries: m reserved coordinates after the d = m_feat·p·p aggregated feature coordinates.

    :meth:`start_group` closes the last group's sampling event and draws which included canaries the group's
    Poisson sample (rate ρ) holds; canary j enters sub-batch j mod μ (public: the ledger charges one Gaussian
    per group whatever the split, so a record whose sub-batch is known is within its analysis, and a canary in an
    unknown one of μ releases would be weaker); :meth:`summed` gives the sum of sub-batch i's canary feature rows, Dirac vectors
    of norm ``sensitivity`` (√m·p, the row bound of SIN). The group's conv2* step is a :class:`DpsgdCanaries` of
    the same ``group``, holding the whole group sample.
    """

    kind = "dpagg"

    def __init__(self, canaries: Canaries, name: str, sensitivity: float, noise_multiplier: float, rate: float,
                 mu: int, where: str = "") -> None:
        sens = float(sensitivity)
        super().__init__(canaries, name, shift=sens, noise_std=float(noise_multiplier) * sens,
                         sensitivity=sens, group=canaries.group(rate), parts=int(mu),
                         ledger_multipliers=[float(noise_multiplier)],
                         where=where or f"{name}: a feature row entering DPAGG's sum of sub-batch j mod mu, a Dirac "
                                        "vector of norm sqrt(m)*p (SIN's row bound) on the canary's reserved "
                                        "coordinate")
        self.row_norm, self.mu = float(sensitivity), int(mu)
        self.sampler = canaries.poisson(name, rate)
        #: canary j's sub-batch (public)
        self.part_of = torch.arange(canaries.m, device=canaries.device) % self.mu
        self.sampled: torch.Tensor = torch.zeros(0, dtype=torch.long, device=canaries.device)
        self.part = 0

    def start_group(self) -> torch.Tensor:
        """Close the last group's event and draw the next group's canaries; returns them (all μ sub-batches: what a
        DP-SGD step on the whole group sample holds)."""
        self.group.close()
        self.sampled = self.sampler.draw()
        return self.sampled

    def summed(self, j: int) -> torch.Tensor:
        """The sum of sub-batch j's canary feature rows on the reserved coordinates (an m-vector: each row is a
        Dirac vector, so the sum is ``sensitivity`` on each of its canaries' coordinates); the release that
        follows is sub-batch j's (:meth:`observe`)."""
        self.part = int(j)
        # the other sub-batches' canaries add a zero: a boolean mask would read the sample back to the host
        keep = (self.part_of.index_select(0, self.sampled) == self.part).to(torch.float32)
        out = torch.zeros(self.m, dtype=torch.float32, device=self.sampled.device)
        return out.index_add_(0, self.sampled, keep * self.row_norm)

    def log_ratio(self, released: torch.Tensor) -> torch.Tensor:
        """Sub-batch j's release speaks of the canaries of sub-batch j only."""
        return torch.where(self.part_of == self.part, super().log_ratio(released), 0.0)


class SanitizerCanaries(Channel):
    """Canaries of one GS-WGAN gradient sanitiser (GS-WGAN Alg. 1 / DPAC Eq. 5, 9; EFSGD Eq. 7–11) on canary rows of
    their own, released beside every sampled member's image rows.

    Canary j is a record of partition k = j mod K, in slot r = j // K of it, and owns b canary rows
    (:func:`sanitizer_rows_per_canary`): positions ((k·S + r)·b … (k·S + r)·b + b − 1) of a release of P = K·S·b
    positions (S = ⌈m / K⌉ slots). The trainer calls :meth:`start_iteration` with the drawn partitions k_1..k_M (a
    device tensor); the sanitiser asks :meth:`rows` for the members' canary rows (member i: the S·b rows of partition
    k_i, DIRAC_NORM·C at its included canaries' rows, 0 elsewhere, before clipping; one value wide, since a canary's
    row holds nothing else), clips every row with the clip its image rows get, sums the members' rows per position
    (a position belongs to one partition, so no two members share one), noises the P positions with the std of its
    image release and hands that release to :meth:`release`, which scores it. A record may move each of its
    member's B rows by 2C (the sensitivity 2C·√B the ledger charges per path; efsgd: 2(C1 + C2)·√B); a canary
    moves its b rows by C each (C·√b, that sensitivity), and nothing else: its rows carry no image gradient, are
    not fed back (efsgd) and never reach G, so canaries are independent of each other and of the run. The canary
    rows are a release of their own rather than extra rows of the image release: w-wide rows with one non-zero
    entry each would cost M·S·b·w values an iteration (efsgd's quick audit: 20 members x 1,024 rows x 784).

    The score reads only released values: the sum of canary j's b positions, over every iteration, whichever
    partitions it drew; the sampling event is the iteration (rate ``rate``, shared by the paths of one run:
    ``group``).
    """

    kind = "sanitizer"

    def __init__(self, canaries: Canaries, name: str, partitions: int, rows: int, clip: float, noise_std: float,
                 row_sensitivity: float, rate: float, group: SamplingGroup | None = None, where: str = "") -> None:
        k, b, m = int(partitions), int(rows), canaries.m
        per = sanitizer_rows_per_canary(row_sensitivity, clip, b)
        cap = max_sanitizer_canaries(k, b, per)
        if m > cap:
            raise DpgenError(f"audit.canaries={m} must be <= K*({ROW_BUDGET}*B // b) = {k}*({ROW_BUDGET}*{b} // {per}) "
                             f"= {cap} for {name} ({per} sanitiser rows per canary, at most {ROW_BUDGET}*B "
                             "per partition)")
        sensitivity = float(row_sensitivity) * math.sqrt(b)
        # min(): C·√b equals the sensitivity up to rounding, and a canary may not move more than a record
        super().__init__(canaries, name, shift=min(float(clip) * math.sqrt(per), sensitivity),
                         noise_std=float(noise_std), sensitivity=sensitivity, rate=rate, group=group,
                         where=where or f"{name}: {per} canary rows of its partition's member per canary, each "
                                        f"{DIRAC_NORM:g}*C before the sanitiser's per-row clip, released with the "
                                        "sanitiser's noise beside the image rows; never fed back, never reaching G")
        self.per = per
        self.clip, self.partitions, self.rows_per_release = float(clip), k, b
        self.slots = -(-m // k)  # canaries per partition
        #: P: the canary release's positions, S·b per partition
        self.size = k * self.slots * per
        dev = canaries.device
        j = torch.arange(m, device=dev)
        offs = torch.arange(per, device=dev)
        #: (m, b) canary j's positions in the canary release
        self.entries = (((j % k) * self.slots + j // k) * per).unsqueeze(1) + offs
        value = canaries.included.to(device=dev, dtype=torch.float32) * (DIRAC_NORM * self.clip)
        val = torch.zeros((k * self.slots, per), device=dev)
        val[(j % k) * self.slots + j // k] = value.unsqueeze(1).expand(m, per)
        #: per partition (K, S·b): its positions (each (partition, slot, row) its own; a slot without a canary gets
        #: value 0 at a position nothing else uses) and DIRAC_NORM·C values (0 where excluded or absent)
        self.part_index = torch.arange(self.size, device=dev).view(k, -1)
        self.part_value = val.view(k, -1)
        self.current: torch.Tensor | None = None

    def start_iteration(self, k: torch.Tensor) -> None:
        """The iteration drew partitions ``k`` (a device tensor of M ≥ 0 members: no host sync): the last
        iteration's sampling event closes, and their included canaries enter this iteration's canary rows."""
        self.current = k.reshape(-1)

    def rows(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """The members' canary rows before clipping, (M·S·b, 1), member i's after member i−1's, and each row's
        position in the canary release (M·S·b,)."""
        if self.current is None:
            raise RuntimeError(f"audit channel {self.name}: start_iteration(k) was not called")
        # index_select with the device tensor k: indexing by a 0-d tensor would read it back to the host
        values = self.part_value.index_select(0, self.current).reshape(-1, 1).to(dtype)
        return values, self.part_index.index_select(0, self.current).reshape(-1)

    @property
    def rows_per_member(self) -> int:
        """S·b: a member's canary rows (:meth:`rows`)."""
        return self.slots * self.per

    def release(self, released: torch.Tensor) -> None:
        """Score the canary release (P positions: the members' clipped canary rows summed per position, plus the
        sanitiser's noise)."""
        x = released.detach().reshape(-1).to(self.canaries.score_dtype)[self.entries].sum(1)
        self.observe_log_ratio((x * self.clip - 0.5 * self.per * self.clip ** 2) / self.score_std ** 2)

    @classmethod
    def attach(cls, canaries: Canaries, partitions: int, rows: int, rate: float,
               sanitizers: dict[str, object]) -> "SanitizerGroup":
        """One channel per sanitiser path (``sanitizers``: name → sanitiser, None for a path that is off), each set
        as its sanitiser's ``audit``, all in one sampling event per iteration (rate ``rate``); returns the group
        whose :meth:`SanitizerGroup.start_iteration` the trainer calls once per iteration."""
        group = canaries.group(rate)
        channels = []
        for name, san in sanitizers.items():
            if san is None:
                continue
            row_sens = float(getattr(san, "sensitivity", 2.0 * san.clip))
            ch = cls(canaries, name, partitions, rows, san.clip, san.noise_std, row_sens, rate, group)
            san.audit = ch
            channels.append(ch)
        return SanitizerGroup(channels, group)


class SanitizerGroup:
    """The sanitiser channels of one GS-WGAN-family run and their per-iteration sampling event."""

    def __init__(self, channels: list[SanitizerCanaries], group: SamplingGroup) -> None:
        self.channels, self.group = channels, group

    def start_iteration(self, k: torch.Tensor) -> None:
        """The iteration drew partitions ``k`` (one with the paper's uniform draw, Alg. 1 line 2; any number with
        Poisson sampling): the last iteration's event closes, and every path's canaries of those partitions enter
        this iteration's canary rows."""
        self.group.close()
        for ch in self.channels:
            ch.start_iteration(k)
