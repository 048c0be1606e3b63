"""DPAF's private building blocks: DPAGG (Eq. 4), per-sample gradient compression, the DP-SGD optimizer
and the asymmetric schedule of Fig. 7."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dpgen.core.precision import at_least_fp32, full_precision
from dpgen.privacy.optimizer import DPSGDOptimizer
from dpgen.privacy.randomness import SecretGenerator, gaussian_noise, require_secret

if TYPE_CHECKING:
    from dpgen.audit.hooks import FeatureCanaries


def dpagg(feats: torch.Tensor, sensitivity: float, noise_multiplier: float, scale: float,
          generator: SecretGenerator, canaries: FeatureCanaries | None = None, part: int = 0) -> torch.Tensor:
    """DPAGG: ``(Σ_i feats[i] + N(0, (z·√m·p)² I)) / scale`` (Sec. IV-B, Eq. 4; Theorem 6).

    ``feats`` are SIN-normalized, so each row has ℓ2 norm ≤ ``sensitivity`` = √m·p and adding or removing
    one sample moves the sum by at most that much. Dividing by a data-independent ``scale`` (the expected
    batch size) is post-processing. The caller records the release in the ledger. The noise comes from the
    secret ``generator``. The sum and the noise are fp32 at least (:mod:`dpgen.core.precision`).

    ``canaries`` (an audit run, :class:`~dpgen.audit.hooks.FeatureCanaries`): sub-batch ``part``'s canary rows
    are summed on reserved coordinates after the flattened features, noised with them, and their release goes
    back to the audit; the features' aggregate is returned as without them.
    """
    require_secret(generator, "DPAGG")
    with full_precision():
        total = at_least_fp32(feats).sum(dim=0, keepdim=True)
        if canaries is not None:
            total = torch.cat([total.flatten(1), canaries.summed(part).unsqueeze(0).to(total.dtype)], 1)
        noise = gaussian_noise(total.shape, noise_multiplier * sensitivity, generator, device=total.device,
                               dtype=total.dtype, mechanism="DPAGG")
        released = (total + noise) / scale
    if canaries is None:
        return released
    canaries.observe(released[0, -canaries.m:] * scale)
    return released[:, :-canaries.m].reshape(1, *feats.shape[1:])


def compress_top(per_sample: torch.Tensor, keep: float, generator: torch.Generator | None = None,
                 max_exact: int = 2048) -> torch.Tensor:
    """Gradient compression (Sec. VI-B7, [62]): keep the ``keep`` fraction of largest-magnitude entries
    of each per-sample gradient (rows of ``per_sample``), zero the rest. Done before clipping, so the
    clipped norm, hence DP-SGD's sensitivity, is unaffected.

    Rows longer than ``max_exact`` use a threshold estimated from ``max_exact`` coordinates drawn at random
    (data-independently) instead of an exact sort, which is far too slow on a CPU (the kept fraction is then
    ``keep`` ± ~0.7% for 2048 draws); each row's threshold still depends on that row only, so this remains
    a per-sample map. The coordinates come from ``generator`` (the optimizer's stream, on the device of
    ``per_sample``).
    """
    if keep >= 1.0 or per_sample.numel() == 0:
        return per_sample
    d = per_sample.shape[1]
    if d > max_exact:  # index_select then abs: never materialise |g| of the full matrix twice
        cols = torch.randint(0, d, (max_exact,), generator=generator, device=per_sample.device)
        sub = per_sample.index_select(1, cols).abs()
    else:
        sub = per_sample.abs()
    drop = int(round((1.0 - keep) * sub.shape[1]))
    if drop < 1:
        return per_sample
    thr = sub.kthvalue(drop, dim=1, keepdim=True).values
    return per_sample * (per_sample.abs() > thr)


class CompressedDPOptimizer(DPSGDOptimizer):
    """The DP-SGD optimizer (per-sample clipping to C, noise N(0, σ²C²) from a secret stream; Abadi et al. 2016
    Alg. 1) that first applies :func:`compress_top` to each sample's gradient across all of its parameters.

    With ``track = True`` the next step also keeps, as device tensors (no host sync), the median per-sample
    gradient norm before clipping and the norm of the clipped sum (the signal the noise N(0, σ²C² I_d) is
    added to): :meth:`signal_to_noise` divides the latter by the expected noise norm σ·C·√d.
    """

    def __init__(self, *args, keep: float = 1.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.keep = float(keep)
        self.track = False
        self.stats: dict[str, torch.Tensor] = {}
        self.dim = sum(p.numel() for p in self.model_params)

    def clip_and_accumulate(self) -> None:
        # the model's parameters only: an audit's reserved coordinates hold zero rows for the records (its
        # canaries, Dirac rows whose one entry is their largest, pass compress_top unchanged and are clipped apart)
        model = self.model_params
        gs = [self._get_flat_grad_sample(p) for p in model]
        if self.keep < 1.0 and len(gs[0]) > 0:
            b = len(gs[0])
            flat = compress_top(torch.cat([g.reshape(b, -1) for g in gs], dim=1), self.keep, self.generator)
            off = 0
            for p, g in zip(model, gs):
                p.grad_sample = flat[:, off:off + g[0].numel()].reshape(g.shape).to(g.dtype)
                off += g[0].numel()
        rows = [self._get_flat_grad_sample(p) for p in model] if self.track else []
        if rows and len(rows[0]) > 0:
            norms = torch.stack([g.reshape(len(g), -1).norm(dim=1) for g in rows], 1).norm(dim=1)
            self.stats["grad_norm_median"] = norms.median()
        super().clip_and_accumulate()
        if self.track:
            self.stats["signal"] = torch.stack([p.summed_grad.norm() for p in self.model_params]).norm()

    def empty_step(self) -> None:
        """The release of an empty Poisson batch: the clipped sum is 0, the output pure noise. Skipping the
        step instead would reveal that the batch was empty."""
        for p in self.params:
            p.grad_sample = torch.zeros((0, *p.shape), device=p.device, dtype=p.dtype)
        self.step()

    def signal_to_noise(self) -> torch.Tensor | None:
        """‖Σ clipped gradients‖ / (σ·C·√d) of the last tracked step (None if none; inf when σ = 0)."""
        if "signal" not in self.stats:
            return None
        return self.stats["signal"] / (self.noise_multiplier * self.max_grad_norm * self.dim ** 0.5)


def schedule(batch: int, mu: int, n_critic: int) -> set[str]:
    """Updates after the ``batch``-th D batch (1-based), Alg. 1 lines 8–16 / Fig. 7: conv3*+FC* every batch,
    conv2* when μ | i, G when n_critic | i."""
    ups = {"conv3_fc"}
    if batch % mu == 0:
        ups.add("conv2")
    if batch % n_critic == 0:
        ups.add("G")
    return ups


def split_group(idx: torch.Tensor, mu: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Randomly split one Poisson sample into μ disjoint sub-batches (the μ batches of Fig. 7).

    Disjointness means each record reaches at most one DPAGG release and one conv2* gradient per group. The
    split is part of the sampling (a secret stream), though the bound holds for any split.
    """
    perm = idx[torch.randperm(len(idx), generator=generator, device=generator.device).to(idx.device)]
    return [perm[j::mu] for j in range(mu)]
