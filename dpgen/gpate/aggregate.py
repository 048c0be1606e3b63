"""DPGradAgg (G-PATE Alg. 2): random projection, discretisation, Confident-GNMax, back-projection.

The only paths from the teachers to the generator are :func:`confident_gnmax`'s noisy outputs.
Everything before it (projection, clipping, binning, the vote histogram) is the private input;
everything after (bin mid-points, back-projection) is post-processing of the noisy answers.
All of it stays on the device: nothing here reads a value back to the host.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

import torch

from dpgen.privacy.randomness import SecretGenerator, gaussian_noise, require_secret

if TYPE_CHECKING:
    from dpgen.audit.hooks import VoteCanaries


def projection_matrices(m: int, d: int, k: int, generator: torch.Generator, device: torch.device,
                        basis: torch.Tensor | None = None) -> torch.Tensor:
    """Alg. 2 line 3: one fresh d×k matrix per synthetic sample, drawn without data.

    ``basis`` None (the paper): entries N(0, 1/k).  ``basis`` (d, L) with orthonormal columns (research
    option, :func:`dpgen.nets.dct.dct_basis`): R = basis · W · √(d/L) with W (L, k) entries N(0, 1/k), i.e. a random
    projection restricted to span(basis), scaled so that E‖R_j‖² = d/k as in the paper's case (the clip
    constant c keeps its meaning).  With L = d it has the paper's distribution.
    """
    if basis is None:
        return torch.randn(m, d, k, generator=generator, device=device) / math.sqrt(k)
    n_basis = basis.shape[1]
    w = torch.randn(m, n_basis, k, generator=generator, device=device) / math.sqrt(k)
    return torch.einsum("dl,mlk->mdk", basis, w) * math.sqrt(d / n_basis)


def bin_index(u: torch.Tensor, c: float, bins: int) -> torch.Tensor:
    """Alg. 2 lines 6–7: clip to (-c, c) and map to one of ``bins`` bins of width 2c/B."""
    width = 2.0 * c / bins
    return ((u.clamp(-c, c) + c) / width).floor().long().clamp_(0, bins - 1)


def bin_midpoints(c: float, bins: int, device: torch.device | None = None) -> torch.Tensor:
    """Mid-point of every bin: -c + (b + 1/2)·2c/B (the value an answered query releases)."""
    width = 2.0 * c / bins
    return -c + (torch.arange(bins, device=device, dtype=torch.float32) + 0.5) * width


def project(grads: torch.Tensor, proj: torch.Tensor) -> torch.Tensor:
    """Alg. 2 line 4, ΔU = ΔX R: grads (t, m, ...) of t teachers, proj (m, d, k) → (t, m, k)."""
    return torch.einsum("tmd,mdk->tmk", grads.flatten(2), proj)


def vote_histogram(grad_chunks: Iterable[tuple[int, int, torch.Tensor]], proj: torch.Tensor, c: float,
                   bins: int, reduce: Callable[[list[torch.Tensor]], None] | None = None) -> torch.Tensor:
    """Counts (m, k, B): how many teachers vote for each bin of each projected dimension of each sample.

    ``grad_chunks`` yields (a, b, Δx) with Δx (b-a, m, ...) for teachers a..b-1 (Alg. 1 line 11);
    each teacher casts exactly one vote per (sample, dimension), so one teacher changing its vote
    moves one count down and one up: ℓ2 sensitivity √2, max-count sensitivity ≤ 1.

    ``reduce``: sums the histogram over the ranks of a sharded ensemble in place (``Dist.all_reduce_``); the
    counts are integers, so the total is the unsharded histogram bit for bit.
    """
    m, _, k = proj.shape
    hist = torch.zeros((m, k, bins), dtype=torch.long, device=proj.device)
    for _, _, g in grad_chunks:
        idx = bin_index(project(g, proj), c, bins)
        hist += torch.nn.functional.one_hot(idx, bins).sum(0)  # (m, k, B)
    if reduce is not None:
        reduce([hist])
    return hist


@dataclass
class GNMaxResult:
    """Outputs of Confident-GNMax on a batch of queries (all released except ``counts``)."""

    answered: torch.Tensor  # (Q,) bool: passed the noisy threshold check
    winner: torch.Tensor  # (Q,) long: noisy argmax (meaningful where answered)
    reserved: torch.Tensor | None = None  # (Q, R): an audit's noisy reserved bins (``reserved`` R > 0)


def confident_gnmax(counts: torch.Tensor, threshold: float | None, sigma1: float, sigma2: float,
                    generator: SecretGenerator, reserved: int = 0) -> GNMaxResult:
    """Confident-GNMax (Papernot et al. 2018, Alg. 1), one query per row of ``counts`` (Q, B).

    Answer iff max_i n_i + N(0, σ1²) ≥ T; then release argmax_i n_i + N(0, σ2²).  The argmax
    noise is drawn for every query (unanswered ones included) so RNG use is data-independent.
    ``threshold`` None: no threshold check (plain GNMax, every query answered, σ1 unused). Both noises come
    from the secret ``generator``.

    ``reserved`` R > 0 (an audit run, :mod:`dpgen.audit`): the last R columns of ``counts`` are the canaries'
    reserved bins. They get the argmax noise with the real bins (the same draw) and are returned noisy, but
    take no part in the threshold check or the argmax, which see the B − R real bins only.
    """
    require_secret(generator, "Confident-GNMax")
    counts = counts.to(torch.float32)
    q = counts.shape[0]
    real = counts[:, :counts.shape[1] - int(reserved)]
    if threshold is None:
        answered = torch.ones(q, dtype=torch.bool, device=counts.device)
    else:
        noisy_max = real.max(dim=1).values + gaussian_noise((q,), sigma1, generator, device=counts.device,
                                                            mechanism="Confident-GNMax threshold")
        answered = noisy_max >= threshold
    noisy = counts + gaussian_noise(counts.shape, sigma2, generator, device=counts.device, mechanism="GNMax argmax")
    winner = noisy[:, :real.shape[1]].argmax(dim=1)
    return GNMaxResult(answered=answered, winner=winner, reserved=noisy[:, real.shape[1]:] if reserved else None)


def dp_grad_agg(grad_chunks: Iterable[tuple[int, int, torch.Tensor]], shape: tuple[int, ...], c: float, bins: int,
                k: int, sigma1: float, sigma2: float, threshold: float | None, proj_gen: torch.Generator,
                noise_gen: SecretGenerator, m: int, device: torch.device,
                basis: torch.Tensor | None = None,
                reduce: Callable[[list[torch.Tensor]], None] | None = None,
                canaries: VoteCanaries | None = None) -> tuple[torch.Tensor, dict]:
    """Alg. 2: the private aggregate Δx_priv (m, *shape) of the teachers' gradients for m samples.

    Returns Δx_priv and side information (NOT released, all device tensors): the vote counts and
    answer mask the data-dependent analysis needs, the teachers' agreement rate on the top bin
    and the answer rate. ``reduce``: see :func:`vote_histogram`; every rank then holds the same counts and draws
    the same noise from the run's shared secret stream, so the noise enters once and all ranks take one step.
    ``canaries`` (an audit run): their teachers' votes join every query's histogram in reserved bins
    (:class:`~dpgen.audit.hooks.VoteCanaries`), whose noisy values go back to the audit.
    """
    d = int(math.prod(shape))
    proj = projection_matrices(m, d, k, proj_gen, device, basis)
    hist = vote_histogram(grad_chunks, proj, c, bins, reduce)  # (m, k, B)
    counts = hist.reshape(m * k, bins)
    if canaries is None:
        res = confident_gnmax(counts, threshold, sigma1, sigma2, noise_gen)
    else:
        votes = torch.cat([counts.to(torch.float32), canaries.votes(m * k)], dim=1)
        res = confident_gnmax(votes, threshold, sigma1, sigma2, noise_gen, reserved=canaries.bins)
        canaries.observe_queries(res.reserved)
    mids = bin_midpoints(c, bins, device)
    u_priv = torch.where(res.answered, mids[res.winner], torch.zeros((), device=device)).view(m, k)  # line 9
    dx = torch.einsum("mk,mdk->md", u_priv, proj).view(m, *shape)  # Alg. 2 line 11, Δx = Δu Rᵀ
    top = counts.max(dim=1).values.float()
    side = {
        "counts": counts,
        "answered": res.answered,
        "agreement": (top / counts.sum(dim=1).float()).mean(),
        "answer_rate": res.answered.float().mean(),
    }
    return dx, side
