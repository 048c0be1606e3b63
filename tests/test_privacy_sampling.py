"""The Poisson samplers of dpgen/privacy/sampling.py (dpgan, feta, the GS-WGAN family's partition draw, dpaf and the
audit's canaries): the batches the ledger's ``"poisson"`` entries account for.

* sizes: Binomial(n, q), checked on the mean (within a few standard errors of n·q) and on the variance, so a
  doubled rate, a fixed-size batch or the complement of the sample (size ≈ n·(1 − q)) fails;
* members: exactly the records whose uniform draw is below q, sorted, unique and within [0, n), reproduced here
  from the same secret stream;
* ``PoissonSampler``: chunk c comes from ``generator.fork(c)``, so step s is the same whichever step the sampler
  starts from (a resumed run draws the uninterrupted run's batches), the steps of a chunk are its rows in order,
  two chunks differ, and the parent stream is never drawn from.
"""
from __future__ import annotations

import math

import pytest
import torch

from dpgen.privacy.randomness import secret_generator
from dpgen.privacy.sampling import PoissonSampler, poisson_batch, poisson_chunk

CPU = torch.device("cpu")
N, Q, STEPS = 2_000, 0.1, 200


def _gen(seed: int = 0):
    return secret_generator(CPU, seed=seed)


def _check_binomial(sizes: list[int], n: int, q: float) -> None:
    """Batch sizes consistent with Binomial(n, q): the mean within 4 standard errors of n·q, the sample variance
    within [0.6, 1.6] of n·q·(1 − q) (its relative standard error is √(2 / (len − 1)) ≈ 0.1 for 200 sizes)."""
    sizes_t = torch.tensor(sizes, dtype=torch.float64)
    mean, var = n * q, n * q * (1 - q)
    se = math.sqrt(var / len(sizes))
    assert abs(sizes_t.mean().item() - mean) < 4 * se, f"mean batch size {sizes_t.mean():.1f}, expected {mean:.1f}"
    assert 0.6 < sizes_t.var().item() / var < 1.6, f"batch-size variance {sizes_t.var():.1f}, Binomial's {var:.1f}"


def _check_indices(idx: torch.Tensor, n: int) -> None:
    assert idx.dtype == torch.long and idx.dim() == 1
    if len(idx):
        assert 0 <= idx.min().item() and idx.max().item() < n
        assert (idx[1:] > idx[:-1]).all(), "indices sorted and unique"


def test_poisson_batch_sizes_are_binomial_and_members_are_the_draws_below_q():
    g, replay = _gen(1), _gen(1)
    sizes = []
    for _ in range(STEPS):
        idx = poisson_batch(N, Q, g, CPU)
        _check_indices(idx, N)
        u = torch.rand(N, generator=replay)
        assert torch.equal(idx, (u < Q).nonzero().squeeze(1)), "members are the records whose uniform is below q"
        sizes.append(len(idx))
    _check_binomial(sizes, N, Q)


def test_poisson_chunk_sizes_are_binomial_and_members_are_the_draws_below_q():
    rows = poisson_chunk(N, Q, STEPS, _gen(2), CPU)
    assert len(rows) == STEPS
    u = torch.rand(STEPS, N, generator=_gen(2))  # the chunk's draw, replayed from the same stream
    for r, idx in enumerate(rows):
        _check_indices(idx, N)
        assert torch.equal(idx, (u[r] < Q).nonzero().squeeze(1)), f"row {r}: not the records whose uniform is below q"
    _check_binomial([len(r) for r in rows], N, Q)
    # rows are independent samples, not one sample repeated
    assert len({tuple(r.tolist()) for r in rows}) == STEPS


@pytest.mark.parametrize("q", [0.0, 1.0])
def test_poisson_chunk_edge_rates(q):
    rows = poisson_chunk(50, q, 3, _gen(3), CPU)
    want = torch.arange(50) if q == 1.0 else torch.zeros(0, dtype=torch.long)
    assert all(torch.equal(r, want) for r in rows)


@pytest.mark.parametrize("chunk", [1, 7])
def test_poisson_sampler_step_s_is_row_s_mod_chunk_of_fork_s_div_chunk(chunk):
    g = _gen(4)
    before = g.get_state()
    sampler = PoissonSampler(N, Q, g, chunk, CPU)
    steps = 3 * chunk + 2
    walked = [sampler(s) for s in range(steps)]
    for s, idx in enumerate(walked):
        _check_indices(idx, N)
        own = poisson_chunk(N, Q, chunk, g.fork(s // chunk), CPU)[s % chunk]
        assert torch.equal(idx, own), f"step {s} is not row {s % chunk} of fork({s // chunk})"
    assert torch.equal(g.get_state(), before), "the sampler draws from forks, never from the stream itself"
    assert len({tuple(i.tolist()) for i in walked}) == steps, "every step its own sample"
    assert not torch.equal(walked[0], walked[chunk]), "chunk 1 is not a replay of chunk 0"

    # a fresh sampler on the same stream (a resumed run) draws the same batch at every step, in any order
    for s in (steps - 1, chunk, 0, 2 * chunk + 1):
        assert torch.equal(PoissonSampler(N, Q, g, chunk, CPU)(s), walked[s])
    back_and_forth = PoissonSampler(N, Q, g, chunk, CPU)
    for s in (2 * chunk, 0, 2 * chunk + 1, 1, chunk):
        assert torch.equal(back_and_forth(s), walked[s])
    # another stream draws other batches
    assert not torch.equal(PoissonSampler(N, Q, _gen(5), chunk, CPU)(0), walked[0])


def test_poisson_sampler_sizes_are_binomial_at_its_rate():
    sampler = PoissonSampler(N, Q, _gen(6), 16, CPU)
    _check_binomial([len(sampler(s)) for s in range(STEPS)], N, Q)
