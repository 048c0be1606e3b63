"""DPGradAgg (G-PATE Alg. 2): random projection, discretisation, Confident-GNMax, back-projection.

The only paths from the teachers to the generator are :func:`confident_gnmax`'s noisy outputs.
Everything before it (projection, clipping, binning, the vote histogram) is the private input;
everything after (bin mid-points, back-projection) is post-processing of the noisy answers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import torch


def projection_matrices(m: int, d: int, k: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Alg. 2 line 3: one fresh d×k matrix per synthetic sample, entries N(0, 1/k), drawn without data."""
    return torch.randn(m, d, k, generator=generator, device=device) / math.sqrt(k)


def bin_index(u: torch.Tensor, c: float, bins: int) -> torch.Tensor:
    """Alg. 2 lines 6–7: clip to (-c, c) and map to one of ``bins`` bins of width 2c/B."""
    width = 2.0 * c / bins
    return ((u.clamp(-c, c) + c) / width).floor().long().clamp_(0, bins - 1)


def bin_midpoints(c: float, bins: int, device: torch.device | None = None) -> torch.Tensor:
    """Mid-point of every bin: -c + (b + 1/2)·2c/B (the value an answered query releases)."""
    width = 2.0 * c / bins
    return -c + (torch.arange(bins, device=device, dtype=torch.float32) + 0.5) * width


def vote_histogram(grad_chunks: Iterable[tuple[int, int, torch.Tensor]], proj: torch.Tensor, c: float,
                   bins: int) -> torch.Tensor:
    """Counts (m, k, B): how many teachers vote for each bin of each projected dimension of each sample.

    ``grad_chunks`` yields (a, b, Δx) with Δx (b-a, m, ...) for teachers a..b-1 (Alg. 1 line 11);
    each teacher casts exactly one vote per (sample, dimension), so one teacher changing its vote
    moves one count down and one up: ℓ2 sensitivity √2, max-count sensitivity ≤ 1.
    """
    hist = None
    for _, _, g in grad_chunks:
        u = torch.einsum("tmd,mdk->tmk", g.flatten(2), proj)  # Alg. 2 line 4, ΔU = ΔX R
        idx = bin_index(u, c, bins)
        part = torch.nn.functional.one_hot(idx, bins).sum(0)  # (m, k, B)
        hist = part if hist is None else hist + part
    assert hist is not None, "no teachers"
    return hist


@dataclass
class GNMaxResult:
    """Outputs of Confident-GNMax on a batch of queries (all released except ``counts``)."""

    answered: torch.Tensor  # (Q,) bool: passed the noisy threshold check
    winner: torch.Tensor  # (Q,) long: noisy argmax (meaningful where answered)


def confident_gnmax(counts: torch.Tensor, threshold: float, sigma1: float, sigma2: float,
                    generator: torch.Generator) -> GNMaxResult:
    """Confident-GNMax (Papernot et al. 2018, Alg. 1), one query per row of ``counts`` (Q, B).

    Answer iff max_i n_i + N(0, σ1²) ≥ T; then release argmax_i n_i + N(0, σ2²).  The argmax
    noise is drawn for every query (unanswered ones included) so RNG use is data-independent.
    """
    counts = counts.to(torch.float32)
    noisy_max = counts.max(dim=1).values + sigma1 * torch.randn(counts.shape[0], generator=generator,
                                                                 device=counts.device)
    answered = noisy_max >= threshold
    noisy = counts + sigma2 * torch.randn(counts.shape, generator=generator, device=counts.device)
    return GNMaxResult(answered=answered, winner=noisy.argmax(dim=1))


def dp_grad_agg(grad_chunks: Iterable[tuple[int, int, torch.Tensor]], shape: tuple[int, ...], c: float, bins: int,
                k: int, sigma1: float, sigma2: float, threshold: float, proj_gen: torch.Generator,
                noise_gen: torch.Generator, m: int, device: torch.device) -> tuple[torch.Tensor, dict]:
    """Alg. 2: the private aggregate Δx_priv (m, *shape) of the teachers' gradients for m samples.

    Returns Δx_priv and side information (NOT released): the vote counts and answer mask the
    data-dependent analysis needs, and the teachers' agreement rate on the top bin.
    """
    d = int(math.prod(shape))
    proj = projection_matrices(m, d, k, proj_gen, device)
    hist = vote_histogram(grad_chunks, proj, c, bins)  # (m, k, B)
    n_teachers = int(hist[0, 0].sum())
    res = confident_gnmax(hist.reshape(m * k, bins), threshold, sigma1, sigma2, noise_gen)
    mids = bin_midpoints(c, bins, device)
    u_priv = torch.where(res.answered, mids[res.winner], torch.zeros((), device=device)).view(m, k)  # line 9
    dx = torch.einsum("mk,mdk->md", u_priv, proj).view(m, *shape)  # Alg. 2 line 11, Δx = Δu Rᵀ
    side = {
        "counts": hist.reshape(m * k, bins).cpu(),
        "answered": res.answered.cpu(),
        "agreement": float(hist.max(dim=2).values.float().mean() / n_teachers),
        "answer_rate": float(res.answered.float().mean()),
    }
    return dx, side
