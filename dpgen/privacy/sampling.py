"""Sampling that privacy analyses amplify over: Poisson batches and the uniform draw of a partition.

Every sampler requires a secret stream (:func:`dpgen.privacy.randomness.require_secret`): amplification
by subsampling holds only if the attacker cannot tell which records were drawn.
"""
from __future__ import annotations

import torch

from dpgen.privacy.randomness import SecretGenerator, require_secret

__all__ = ["poisson_batch", "poisson_chunk", "PoissonSampler", "uniform_member"]


def poisson_batch(n: int, q: float, generator: SecretGenerator, device: torch.device) -> torch.Tensor:
    """Indices of a Poisson-sampled batch: each record joins independently with probability q (Abadi et al.
    2016; the sampling the ledger's ``"poisson"`` entries account).

    The batch size is random, so its indices need one host sync (``nonzero``) per call."""
    g = require_secret(generator, "Poisson sampling")
    return (torch.rand(n, generator=g, device=device) < q).nonzero().squeeze(1)


def poisson_chunk(n: int, q: float, steps: int, generator: SecretGenerator,
                  device: torch.device) -> list[torch.Tensor]:
    """``steps`` independent Poisson samples of rate q from n records, on ``device``.

    Drawn together so that a training loop reads the batch sizes back from the device once per chunk (one
    ``tolist``) instead of once per step; the draw is data-independent, so drawing ahead changes nothing. A
    stable sort puts each row's members first, in index order, so no ``nonzero`` (a second sync) is needed.
    """
    g = require_secret(generator, "Poisson sampling")
    mask = torch.rand(steps, n, generator=g, device=device) < q
    counts = mask.sum(1).tolist()
    order = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)
    return [order[r, :c] for r, c in enumerate(counts)]


class PoissonSampler:
    """The Poisson samples of one training phase, step by step, ``chunk`` steps per device round trip.

    Chunk c is drawn from ``generator.fork(c)``, so the sample of step s depends only on (the secret stream,
    s): a resumed run draws exactly the batches of the uninterrupted one.
    """

    def __init__(self, n: int, q: float, generator: SecretGenerator, chunk: int, device: torch.device) -> None:
        self.n, self.q, self.chunk, self.device = n, float(q), max(1, int(chunk)), device
        self.generator = require_secret(generator, "Poisson sampling")
        self._cached: tuple[int, list[torch.Tensor]] | None = None

    def __call__(self, step: int) -> torch.Tensor:
        """The sample of the phase's ``step``-th (0-based) step."""
        c = step // self.chunk
        if self._cached is None or self._cached[0] != c:
            self._cached = (c, poisson_chunk(self.n, self.q, self.chunk, self.generator.fork(c), self.device))
        return self._cached[1][step % self.chunk]


def uniform_member(k: int, generator: SecretGenerator, device: torch.device) -> torch.Tensor:
    """One member index ~ U{0, ..., k-1} as a one-element device tensor (no host sync): the discriminator /
    partition an ensemble iteration samples (GS-WGAN Alg. 1, DPAC Alg. 1 line 2), which the ledger models as
    sampling at rate 1/k."""
    g = require_secret(generator, "partition sampling")
    return torch.randint(0, int(k), (1,), generator=g, device=device)
