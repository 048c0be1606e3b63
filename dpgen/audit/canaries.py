"""Canaries, their coins and their scores: the state of one audit run (Steinke, Nasr & Jagielski 2023, Alg. 1).

m canaries, each included by an independent fair coin drawn from the run's secret stream ``audit.coins``.
Mechanisms see them through a :class:`Channel` (one per mechanism, :mod:`dpgen.audit.hooks`): the channel
puts the included canaries into the mechanism's input where records enter it, and reads the mechanism's
*released* values on the canaries' reserved coordinates back into one score per canary. After the run the
auditor guesses "in" for the k+ highest scores and "out" for the k− lowest (k± fixed in the config, never
chosen from the scores) and counts the correct guesses (:meth:`Canaries.guess`).

A run with several mechanisms (dpaf: conv1's and conv2*'s DP-SGD and DPAGG) has one channel each. Their
scores combine into one matched-filter score (each release weighted by 1/noise², so the noisiest channel
counts least), and each channel is also ranked on its own: a channel whose noise is missing stands out on its
own even where the claimed noise gives it almost no weight in the combination. These are several tests on the
same coins, so :func:`dpgen.audit.report.run_tests` splits the confidence among them (Bonferroni).

What a score may depend on (the threat model of the audit): the released outputs of every step (white box:
every intermediate noisy release, as DP-SGD's analysis assumes) and public values (clip norms, noise
multipliers, the canaries' reserved coordinates). Never the secret randomness the accounting amplifies over:
which records a Poisson batch holds, which partition an iteration draws, how a group is split. A score that
used it would measure the mechanism without its amplification and could exceed a correctly claimed ε. So a
channel draws its canaries' sampling from secret streams of its own (``audit.<channel>``) and scores sum
over *every* release, sampled or not.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from dpgen.privacy.randomness import SecretGenerator, require_secret

__all__ = ["Canaries", "Channel", "Guesses", "PoissonCanaries"]


class Canaries:
    """m canaries: secret coins and the channels that score them (one running score per canary and channel).

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

    def stream(self, name: str) -> SecretGenerator:
        """The secret stream ``audit.<name>`` (a channel's own sampling draws)."""
        return self._secret(f"audit.{name}")

    def register(self, channel: "Channel") -> None:
        if channel.name in self.channels:
            raise ValueError(f"audit channel {channel.name!r} registered twice")
        self.channels[channel.name] = channel

    def poisson(self, name: str, q: float) -> "PoissonCanaries":
        """Poisson sampling of the included canaries at rate ``q`` from ``audit.<name>``."""
        return PoissonCanaries(self, name, q)

    @property
    def num_included(self) -> int:
        return len(self.members)

    def coins_host(self) -> np.ndarray:
        return self.included.cpu().numpy().astype(np.uint8)

    def scores_host(self, channel: str | None = None) -> np.ndarray:
        """One channel's scores, or (None) the sum of all channels' weighted scores."""
        chosen = [self.channels[channel]] if channel is not None else list(self.channels.values())
        total = torch.zeros(self.m, dtype=self.score_dtype, device=self.device)
        for ch in chosen:
            total += ch.scores
        return total.cpu().numpy().astype(np.float64)

    def guess(self, k_in: int, k_out: int, channel: str | None = None) -> "Guesses":
        """"in" for the ``k_in`` highest scores, "out" for the ``k_out`` lowest (of one channel, or of all
        combined); ties are broken by canary index (public and independent of the coins), as a stable sort does."""
        if k_in < 0 or k_out < 0 or k_in + k_out > self.m:
            raise ValueError(f"need 0 <= k+ ({k_in}), k- ({k_out}) and k+ + k- <= {self.m} canaries")
        return Guesses.from_scores(self.scores_host(channel), self.coins_host(), k_in, k_out)


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


class Channel:
    """The hook one mechanism implements: where its canaries enter and how its release is read.

    A subclass (:mod:`dpgen.audit.hooks`) puts the included canaries into the mechanism's input before the
    mechanism bounds it (clipping, one vote per teacher, ...) on coordinates no real record touches, and passes
    the mechanism's released values on those coordinates to :meth:`observe`. ``unit`` is what one included
    canary adds to its coordinate in one release when the mechanism works (e.g. the clip norm C), ``noise`` the
    noise multiplier of that coordinate (noise std / unit), ``per_event`` how many releases share one sampling
    event (a canary reaches at most one of them). A release is scored as released / unit, weighted
    1 / (per_event · noise²) (the matched filter for a shift of one unit): channels with more noise count less
    when a run has several.
    """

    kind = "abstract"

    def __init__(self, canaries: Canaries, name: str, unit: float, noise: float, per_event: int = 1,
                 where: str = "") -> None:
        if not unit > 0:
            raise ValueError(f"channel {name}: unit must be > 0, got {unit}")
        self.canaries, self.name, self.unit = canaries, str(name), float(unit)
        self.noise, self.per_event, self.where = float(noise), int(per_event), where
        self.weight = 1.0 / (self.unit * self.per_event * max(self.noise, 1e-3) ** 2)
        self.releases = 0
        #: the running weighted score of every canary from this channel's releases
        self.scores = torch.zeros(canaries.m, dtype=canaries.score_dtype, device=canaries.device)
        canaries.register(self)

    @property
    def m(self) -> int:
        return self.canaries.m

    def observe(self, released: torch.Tensor) -> None:
        """Add one release's values on the m reserved coordinates (released noisy values, as the mechanism
        output them) to the scores."""
        self.scores.add_(released.detach().reshape(self.m).to(self.scores.dtype), alpha=self.weight)
        self.releases += 1

    def describe(self) -> dict:
        return {"channel": self.name, "kind": self.kind, "where": self.where, "unit": self.unit,
                "noise_multiplier": self.noise, "releases_per_sampling_event": self.per_event,
                "releases_observed": self.releases}


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
