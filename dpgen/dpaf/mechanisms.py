"""DPAF's private building blocks: DPAGG (Eq. 4), per-sample gradient compression, the DP-SGD optimizer
and the asymmetric schedule of Fig. 7."""
from __future__ import annotations

import torch
from opacus.optimizers import DPOptimizer


def dpagg(feats: torch.Tensor, sensitivity: float, noise_multiplier: float, scale: float,
          generator: torch.Generator | None = None) -> torch.Tensor:
    """DPAGG: ``(Σ_i feats[i] + N(0, (z·√m·p)² I)) / scale`` (Sec. IV-B, Eq. 4; Theorem 6).

    ``feats`` are SIN-normalized, so each row has ℓ2 norm ≤ ``sensitivity`` = √m·p and adding or removing
    one sample moves the sum by at most that much. Dividing by a data-independent ``scale`` (the expected
    batch size) is post-processing. The caller records the release in the ledger.
    """
    total = feats.sum(dim=0, keepdim=True)
    noise = torch.randn(total.shape, generator=generator, device=total.device, dtype=total.dtype)
    return (total + noise * (noise_multiplier * sensitivity)) / scale


def compress_top(per_sample: torch.Tensor, keep: float, max_exact: int = 2048) -> torch.Tensor:
    """Gradient compression (Sec. VI-B7, [62]): keep the ``keep`` fraction of largest-magnitude entries
    of each per-sample gradient (rows of ``per_sample``), zero the rest. Done before clipping, so the
    clipped norm, hence DP-SGD's sensitivity, is unaffected.

    Rows longer than ``max_exact`` use a threshold estimated from ``max_exact`` coordinates drawn at random
    (data-independently) instead of an exact sort, which is far too slow on a CPU (the kept fraction is then
    ``keep`` ± ~0.7% for 2048 draws); each row's threshold still depends on that row only, so this remains
    a per-sample map.
    """
    if keep >= 1.0 or per_sample.numel() == 0:
        return per_sample
    d = per_sample.shape[1]
    if d > max_exact:  # index_select then abs: never materialise |g| of the full matrix twice
        sub = per_sample.index_select(1, torch.randint(0, d, (max_exact,), device=per_sample.device)).abs()
    else:
        sub = per_sample.abs()
    drop = int(round((1.0 - keep) * sub.shape[1]))
    if drop < 1:
        return per_sample
    thr = sub.kthvalue(drop, dim=1, keepdim=True).values
    return per_sample * (per_sample.abs() > thr)


class CompressedDPOptimizer(DPOptimizer):
    """opacus' DPOptimizer (per-sample clipping to C, noise N(0, σ²C²); Abadi et al. 2016 Alg. 1) that first
    applies :func:`compress_top` to each sample's gradient across all of its parameters."""

    def __init__(self, *args, keep: float = 1.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.keep = float(keep)

    def clip_and_accumulate(self) -> None:
        if self.keep < 1.0 and len(self.grad_samples[0]) > 0:
            gs = self.grad_samples
            b = len(gs[0])
            flat = compress_top(torch.cat([g.reshape(b, -1) for g in gs], dim=1), self.keep)
            off = 0
            for p, g in zip(self.params, gs):
                p.grad_sample = flat[:, off:off + g[0].numel()].reshape(g.shape).to(g.dtype)
                off += g[0].numel()
        super().clip_and_accumulate()


def schedule(batch: int, mu: int, n_critic: int) -> set[str]:
    """Updates after the ``batch``-th D batch (1-based), Alg. 1 lines 8–16 / Fig. 7: conv3*+FC* every batch,
    conv2* when μ | i, G when n_critic | i."""
    ups = {"conv3_fc"}
    if batch % mu == 0:
        ups.add("conv2")
    if batch % n_critic == 0:
        ups.add("G")
    return ups


def poisson_indices(n: int, q: float, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Each record joins independently with probability q (the sampling the ledger accounts)."""
    return (torch.rand(n, generator=generator, device=device) < q).nonzero().squeeze(1)


def split_group(idx: torch.Tensor, mu: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Randomly split one Poisson sample into μ disjoint sub-batches (the μ batches of Fig. 7).

    Disjointness means each record reaches at most one DPAGG release and one conv2* gradient per group.
    """
    perm = idx[torch.randperm(len(idx), generator=generator, device=generator.device).to(idx.device)]
    return [perm[j::mu] for j in range(mu)]
