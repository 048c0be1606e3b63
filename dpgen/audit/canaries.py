"""Canaries, their coins and their scores: the state of one audit run (Steinke, Nasr & Jagielski 2023, Alg. 1).

m canaries, each included by an independent fair coin drawn from the run's secret stream ``audit.coins``.
Mechanisms see them through a :class:`Channel` (one per mechanism, :mod:`dpgen.audit.hooks`): the channel
puts the included canaries into the mechanism's input where its records enter it, and reads the mechanism's
*released* values on the canaries' reserved coordinates back into one score per canary. After the run the
auditor guesses "in" for the k+ highest scores and "out" for the k− lowest (k± fixed in the config, never
chosen from the scores) and counts the correct guesses (:meth:`Canaries.guess`).

The score is the log-likelihood ratio of "in" against "out" given the releases and public values only, the
Neyman–Pearson statistic of the mechanism as its ledger describes it. A release adds x·u/σ² − u²/(2σ²) on a
coordinate where an included canary adds u and the noise std is σ (a :class:`Channel` may read it otherwise,
e.g. G-PATE's pair of bins). Releases that share one sampling draw form a :class:`SamplingGroup` event (a
DP-SGD step; dpaf's group: its μ DPAGG sums, of which a canary reaches one, and its conv2* step; the GS-WGAN
family's iteration: every sanitiser path), and the event adds log(1 − q + q·e^L), L the sampled canary's
log-likelihood ratio over the event's releases. Summed over events it
is the log-likelihood ratio of the composed subsampled mechanism, whose in/out distributions are the pair the
f-DP bound (:mod:`dpgen.audit.fdp`) tests. Without noise (``eps=inf``) the channel scores with a reference
noise equal to the canary's shift.

A run with several channels (dpaf; dpac with ``dpac.sanitize=per_path``; efsgd) has their combined score
(the log-likelihood ratio of all the events) and each channel's own (its marginal events): a channel whose noise
is missing stands out on its own even where the combination barely weighs it. These are several tests on the
same coins, so :func:`dpgen.audit.report.run_tests` splits the confidence among them (weighted Bonferroni:
half of 1 − confidence to the combined score).

What a score may depend on (the threat model of the audit): the released outputs of every step (white box:
every intermediate noisy release, as DP-SGD's analysis assumes) and public values (clip norms, noise
multipliers, sampling rates, the canaries' reserved coordinates). Never the secret randomness the accounting
amplifies over: which records a Poisson batch holds, which partition an iteration draws, how a group is split.
A score that used it would measure the mechanism without its amplification and could exceed a correctly
claimed ε. So a channel draws its canaries' sampling from secret streams of its own (``audit.<channel>``) and
scores sum over *every* release, sampled or not.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
import torch

from dpgen.privacy.randomness import SecretGenerator, require_secret

__all__ = ["Canaries", "Channel", "Guesses", "PoissonCanaries", "SamplingGroup"]


class Canaries:
    """m canaries: secret coins, the channels that score them and the sampling events they share.

    ``secret(name)`` hands out the run's secret streams (``run.secret_rng``): the coins come from
    ``audit.coins``, each channel's sampling from ``audit.<channel name>``. Scores stay on ``device``; nothing
    here reads them back before :meth:`scores_host`.
    """

    def __init__(self, m: int, secret: Callable[[str], SecretGenerator], device: torch.device | str) -> None:
        if int(m) < 1:
            raise ValueError(f"an audit needs at least one canary, got {m}")
        self.m = int(m)
        self.device = torch.device(device)
        self._secret = secret
        g = require_secret(secret("audit.coins"), "audit coins")
        #: the coins (True: included). Secret: written to audit/coins.npy only, after the run
        self.included = torch.randint(0, 2, (self.m,), generator=g, device=self.device).bool()
        self.members = self.included.nonzero().squeeze(1)  # the included canaries' indices (read once, here)
        self.score_dtype = torch.float32 if self.device.type == "mps" else torch.float64
        self.channels: dict[str, Channel] = {}
        self.groups: list[SamplingGroup] = []

    def stream(self, name: str) -> SecretGenerator:
        """The secret stream ``audit.<name>`` (a channel's own sampling draws)."""
        return self._secret(f"audit.{name}")

    def register(self, channel: "Channel") -> None:
        if channel.name in self.channels:
            raise ValueError(f"audit channel {channel.name!r} registered twice")
        self.channels[channel.name] = channel

    def group(self, rate: float) -> "SamplingGroup":
        """A new sampling event kind: releases that share one draw at ``rate``."""
        g = SamplingGroup(self, rate)
        self.groups.append(g)
        return g

    def poisson(self, name: str, q: float) -> "PoissonCanaries":
        """Poisson sampling of the included canaries at rate ``q`` from ``audit.<name>``."""
        return PoissonCanaries(self, name, q)

    @property
    def num_included(self) -> int:
        return len(self.members)

    def coins_host(self) -> np.ndarray:
        return self.included.cpu().numpy().astype(np.uint8)

    def finish(self) -> None:
        """Close every open sampling event (their releases are all in)."""
        for g in self.groups:
            g.close()

    def scores_host(self, channel: str | None = None) -> np.ndarray:
        """One channel's scores, or (None) the combined score of all its events."""
        self.finish()
        if channel is not None:
            return self.channels[channel].scores.cpu().numpy().astype(np.float64)
        total = torch.zeros(self.m, dtype=self.score_dtype, device=self.device)
        for g in self.groups:
            total += g.scores
        return total.cpu().numpy().astype(np.float64)

    def guess(self, k_in: int, k_out: int, channel: str | None = None) -> "Guesses":
        """"in" for the ``k_in`` highest scores, "out" for the ``k_out`` lowest (of one channel, or of all
        combined); ties are broken by canary index (public and independent of the coins), as a stable sort does."""
        if k_in < 0 or k_out < 0 or k_in + k_out > self.m:
            raise ValueError(f"need 0 <= k+ ({k_in}), k- ({k_out}) and k+ + k- <= {self.m} canaries")
        return Guesses.from_scores(self.scores_host(channel), self.coins_host(), k_in, k_out)

    def events(self, channel: str | None = None) -> list:
        """The :class:`~dpgen.audit.fdp.CanaryEvent` list the canaries went through (all channels, or one)."""
        from dpgen.audit.fdp import CanaryEvent

        self.finish()
        merged: Counter = Counter()
        for g in self.groups:
            for sig, n in g.signatures.items():
                chans = [(self.channels[name], r) for name, r in sig if channel is None or name == channel]
                if not chans:
                    continue
                canary = math.fsum(r / ch.canary_multiplier ** 2 for ch, r in chans) ** -0.5
                ledger = math.fsum(r / z ** 2 for ch, r in chans for z in ch.ledger_reference) ** -0.5
                merged[(g.rate, round(canary, 12), round(ledger, 12))] += n
        return [CanaryEvent(q, zc, zl, n) for (q, zc, zl), n in merged.items()]


@dataclass(frozen=True)
class Guesses:
    """The auditor's guesses and how many are right."""

    k_in: int
    k_out: int
    correct_in: int
    correct_out: int

    @property
    def guesses(self) -> int:
        return self.k_in + self.k_out

    @property
    def correct(self) -> int:
        return self.correct_in + self.correct_out

    @classmethod
    def from_scores(cls, scores: np.ndarray, coins: np.ndarray, k_in: int, k_out: int) -> "Guesses":
        order = np.argsort(scores, kind="stable")  # ascending; equal scores keep index order
        outs, ins = order[:k_out], order[len(order) - k_in:] if k_in else order[:0]
        coins = np.asarray(coins).astype(bool)
        return cls(int(k_in), int(k_out), int(coins[ins].sum()), int((~coins[outs]).sum()))


class SamplingGroup:
    """Releases that share one sampling draw at ``rate`` (one event per draw): the channels' log-likelihood
    ratios of the event's releases are pooled and the event adds log(1 − q + q·e^L) to the combined score and
    log(1 − q + q·e^{L_c}) to each channel c's own. :meth:`close` ends an event (the trainer's next draw, or the
    end of the run); each event's signature (the channels that released in it, how often) is counted for the
    hypothesis of the f-DP bound."""

    def __init__(self, canaries: Canaries, rate: float) -> None:
        if not 0.0 < float(rate) <= 1.0:
            raise ValueError(f"sampling rate must be in (0, 1], got {rate}")
        self.canaries, self.rate = canaries, float(rate)
        self.channels: list[Channel] = []
        self.scores = torch.zeros(canaries.m, dtype=canaries.score_dtype, device=canaries.device)
        self.signatures: Counter = Counter()
        self._log_rest = math.log1p(-self.rate) if self.rate < 1.0 else -math.inf
        self._log_rate = math.log(self.rate)

    def add(self, channel: "Channel") -> None:
        self.channels.append(channel)

    def _event(self, log_ratio: torch.Tensor) -> torch.Tensor:
        if self.rate >= 1.0:
            return log_ratio
        return torch.logaddexp(torch.full_like(log_ratio, self._log_rest), log_ratio + self._log_rate)

    def close(self, count: int = 1) -> None:
        """End the open event (``count`` > 1: that many unsampled events at once, only at rate 1, where they add
        up). No-op when no channel released since the last close."""
        open_ = [ch for ch in self.channels if ch.pending_releases]
        if not open_:
            return
        if count != 1 and self.rate < 1.0:
            raise ValueError("only unsampled events can be closed several at once")
        total = torch.zeros_like(self.scores)
        for ch in open_:
            contribution = ch.take_pending()
            total += contribution
            ch.scores += self._event(contribution)
        self.scores += self._event(total)
        self.signatures[tuple(sorted((ch.name, ch.last_releases) for ch in open_))] += int(count)


class Channel:
    """The hook one mechanism implements: where its canaries enter and how its release is read.

    A subclass (:mod:`dpgen.audit.hooks`) puts the included canaries into the mechanism's input before the
    mechanism bounds it (clipping, one vote per teacher, ...) on coordinates no real record touches, and passes
    the mechanism's released values on those coordinates to :meth:`observe`.

    * ``shift``: how far an included canary moves its coordinates in one release that holds it (ℓ2), when the
      mechanism works (e.g. the clip norm C);
    * ``noise_std``: the noise std on each of them; ``sensitivity``: the ℓ2 sensitivity the ledger charges a
      record in that release; ``ledger_multipliers``: the ledger's noise multipliers of the release (default
      noise_std / sensitivity; more when the ledger charges parts the canary does not read, e.g. G-PATE's
      threshold check);
    * ``group``: the :class:`SamplingGroup` whose draw the release shares (None: a group of its own, one event per
      release, at ``rate``); ``parts``: the releases of one event go to this many disjoint sets of canaries (dpaf's
      μ DPAGG sums, canary j in sum j mod μ), so a canary reaches 1/parts of them.

    The canary's noise multiplier is noise_std / shift, its strength shift / sensitivity (1: the canary moves
    its release as far as a record may).
    """

    kind = "abstract"

    def __init__(self, canaries: Canaries, name: str, shift: float, noise_std: float, sensitivity: float,
                 rate: float = 1.0, group: SamplingGroup | None = None, parts: int = 1,
                 ledger_multipliers: Iterable[float] | None = None, where: str = "") -> None:
        if not (shift > 0 and sensitivity > 0 and noise_std >= 0):
            raise ValueError(f"channel {name}: need shift > 0, sensitivity > 0, noise_std >= 0; got {shift}, "
                             f"{sensitivity}, {noise_std}")
        if shift > sensitivity * (1 + 1e-9):
            raise ValueError(f"channel {name}: a canary may move its release by at most a record's sensitivity "
                             f"({sensitivity}), not {shift}")
        self.canaries, self.name, self.where = canaries, str(name), where
        self.shift, self.noise_std, self.sensitivity = float(shift), float(noise_std), float(sensitivity)
        self.ledger_multipliers = [float(z) for z in (ledger_multipliers if ledger_multipliers is not None
                                                        else [self.noise_std / self.sensitivity])]
        self.parts = int(parts)
        #: the noise the score assumes: the mechanism's, or (eps=inf) the canary's shift
        self.score_std = self.noise_std if self.noise_std > 0 else self.shift
        self.group = group if group is not None else canaries.group(rate)
        self.own_group = group is None
        self.group.add(self)
        self.releases = 0
        self.pending_releases = self.last_releases = 0
        self._pending = self._empty_pending()
        #: this channel's own score (its marginal events)
        self.scores = torch.zeros(canaries.m, dtype=canaries.score_dtype, device=canaries.device)
        canaries.register(self)

    # -- the hypothesis ------------------------------------------------------------------------------------
    @property
    def strength(self) -> float:
        return self.shift / self.sensitivity

    @property
    def canary_multiplier(self) -> float:
        """noise std / shift; without noise (eps=inf) the reference 1 / strength (ledger multiplier 1)."""
        return self.noise_std / self.shift if self.noise_std > 0 else 1.0 / self.strength

    @property
    def ledger_reference(self) -> list[float]:
        """The ledger's multipliers, with 1 for a noiseless one (the eps=inf reference)."""
        return [z if z > 0 else 1.0 for z in self.ledger_multipliers]

    # -- scoring -------------------------------------------------------------------------------------------
    @property
    def m(self) -> int:
        return self.canaries.m

    def _empty_pending(self) -> torch.Tensor:
        return torch.zeros(self.m, dtype=self.canaries.score_dtype, device=self.canaries.device)

    def log_ratio(self, released: torch.Tensor) -> torch.Tensor:
        """log p_in / p_out of one release's values on the m reserved coordinates (a sampled canary: mean
        ``shift``; an unsampled or excluded one: 0)."""
        x = released.detach().reshape(self.m).to(self.canaries.score_dtype)
        return (x * self.shift - 0.5 * self.shift ** 2) / self.score_std ** 2

    def observe(self, released: torch.Tensor) -> None:
        """Score one release's values on the m reserved coordinates (released noisy values, as the mechanism
        output them)."""
        self.observe_log_ratio(self.log_ratio(released))

    def observe_log_ratio(self, log_ratio: torch.Tensor, events: int = 1) -> None:
        """Add one release's log-likelihood ratios; ``events`` > 1: the summed ratios of that many unsampled
        events (rate 1) of a channel with a group of its own (G-PATE's queries of one aggregation)."""
        self._pending += log_ratio
        self.releases += 1
        self.pending_releases += 1
        if self.own_group:
            self.group.close(events)

    def take_pending(self) -> torch.Tensor:
        """The open event's log-likelihood ratio of a sampled canary, reset for the next event; how many of the
        event's releases a canary reached is kept for the event's signature."""
        out = self._pending
        self.last_releases = max(1, self.pending_releases // self.parts)
        self._pending, self.pending_releases = self._empty_pending(), 0
        return out

    def describe(self) -> dict:
        return {"channel": self.name, "kind": self.kind, "where": self.where, "shift": self.shift,
                "noise_std": self.noise_std, "sensitivity": self.sensitivity, "strength": round(self.strength, 6),
                "canary_noise_multiplier": self.canary_multiplier, "ledger_noise_multipliers": self.ledger_multipliers,
                "sampling_rate": self.group.rate, "parts": self.parts, "releases_observed": self.releases}


class PoissonCanaries:
    """Which included canaries each Poisson sample of rate q holds, drawn from the secret ``audit.<name>``
    (the channel's scorer never sees it: it sums over every step). Drawn :data:`CHUNK` steps at a time by
    :class:`~dpgen.privacy.sampling.PoissonSampler`: one host sync per chunk, not per step."""

    CHUNK = 64

    def __init__(self, canaries: Canaries, name: str, q: float) -> None:
        from dpgen.privacy.sampling import PoissonSampler

        if not 0.0 < float(q) <= 1.0:
            raise ValueError(f"sampling rate must be in (0, 1], got {q}")
        self.canaries, self.q = canaries, float(q)
        generator = require_secret(canaries.stream(name), "audit canary sampling")
        self.sampler = PoissonSampler(len(canaries.members), self.q, generator, self.CHUNK, canaries.device)
        self.steps = 0

    def draw(self) -> torch.Tensor:
        """Indices of the included canaries in the next step's sample."""
        idx = self.canaries.members[self.sampler(self.steps)]
        self.steps += 1
        return idx
