"""Stage II of DP-FETA / DPDM: DP-SGD with noise multiplicity and gradient accumulation (DP-FETA Eq. 9).

One logical step: a Poisson batch (rate q, expected size B*) is processed in micro-batches; each
record is replicated K times with independent diffusion noise, its per-record gradient is the MEAN
of the K per-draw gradients (DPDM's noise multiplicity: averaging happens BEFORE clipping, so one
record still contributes one vector of norm ≤ C and the privacy cost is unchanged), it is clipped
to C, the clipped vectors are summed over all micro-batches, Gaussian noise N(0, σ²C²I) is added
ONCE, and the result is divided by the expected batch size B* (Eq. 9).
Per-record gradients come from torch.func (``backend="torch_func"``, the default: faster for the UNet in
bench/dpsgd_overhead.py) or from opacus' GradSampleModule hooks (``backend="opacus"``).

Several processes (:mod:`dpgen.core.dist`, torch.func backend): every rank holds the same Poisson batch (drawn
from a secret stream all ranks share); rank r computes the clipped per-record gradients of the micro-batches
j with j mod W = r, the sums are all-reduced, and every rank adds the SAME noise draw (the shared secret
stream) once to the same total: the noise is added once, as opacus' DistributedDPOptimizer and DPDM do.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Callable

import torch
from opacus import GradSampleModule

from dpgen.core.dist import SINGLE, Dist
from dpgen.core.precision import full_precision
from dpgen.nets.edm import edm_draws, edm_loss_at
from dpgen.privacy.per_sample import per_record_grads
from dpgen.privacy.randomness import SecretGenerator, gaussian_noise, require_secret

if TYPE_CHECKING:
    from dpgen.audit.hooks import DpsgdCanaries


def clipped_grad_sum(gsm: GradSampleModule, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                     x: torch.Tensor, y: torch.Tensor, multiplicity: int, clip: float,
                     micro_batch: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Σ_i clip(mean_k ∇ℓ(x_i, draw k), C) over the batch, in micro-batches of ``micro_batch`` records.

    ``loss_fn(x_rep, y_rep)`` returns one loss per row of the K-fold replicated batch
    (``repeat_interleave``: rows i*K..i*K+K−1 belong to record i). Returns the per-parameter sums and
    the mean loss (a 0-d tensor for logging: reading it is left to the caller, so no host sync per micro-batch).
    """
    params = [p for p in gsm.parameters() if p.requires_grad]
    acc = [torch.zeros_like(p) for p in params]
    k = int(multiplicity)
    loss_total, rows = torch.zeros((), device=x.device), 0
    for s in range(0, x.shape[0], max(1, int(micro_batch))):
        xb, yb = x[s:s + micro_batch], y[s:s + micro_batch]
        m = xb.shape[0]
        losses = loss_fn(xb.repeat_interleave(k, 0), yb.repeat_interleave(k, 0))
        # 1/K: the per-row gradient sampled by opacus is then (1/K)∇ℓ_ik, and summing over k averages
        with warnings.catch_warnings():  # opacus' full backward hooks warn when the input needs no grad
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            (losses.sum() / k).backward()
        add_clipped(acc, [p.grad_sample.reshape(m, k, *p.shape).sum(1) for p in params], clip)
        for p in params:
            p.grad_sample = None
            p.grad = None
        loss_total = loss_total + losses.detach().sum()
        rows += losses.shape[0]
    return acc, loss_total / max(rows, 1)


def clipped_grad_sum_func(denoiser: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, multiplicity: int,
                          clip: float, micro_batch: int, generator: torch.Generator,
                          dist: Dist = SINGLE) -> tuple[list[torch.Tensor], torch.Tensor]:
    """:func:`clipped_grad_sum` for the EDM loss with torch.func: the same Σ_i clip(mean_k ∇ℓ_ik, C).

    The K diffusion draws of every record are made first (:func:`edm_draws`), then each record's loss is
    the mean over its K rows, so vmap(grad) returns the K-averaged gradient before clipping directly.
    With ``dist`` (several ranks, the same ``x``, ``y`` and ``generator`` state on each) this rank computes the
    micro-batches it owns; the draws of every micro-batch are made on every rank, so the ranks' streams stay
    equal; the sums and the loss are all-reduced, so every rank returns the whole batch's.
    """
    params = [p for p in denoiser.parameters() if p.requires_grad]
    acc = [torch.zeros_like(p) for p in params]
    k = int(multiplicity)
    loss_total, rows = torch.zeros((), device=x.device), 0

    def record_loss(call, xr, yr, sr, nr):
        return edm_loss_at(call, xr, yr, sr, nr).mean()

    for j, s in enumerate(range(0, x.shape[0], max(1, int(micro_batch)))):
        xb, yb = x[s:s + micro_batch], y[s:s + micro_batch]
        m = xb.shape[0]
        xr, yr = xb.repeat_interleave(k, 0), yb.repeat_interleave(k, 0)
        sigma, noise = edm_draws(xr, generator)
        if not dist.owns(j):
            continue
        grads, losses = per_record_grads(denoiser, record_loss, (
            xr.reshape(m, k, *xb.shape[1:]), yr.reshape(m, k), sigma.reshape(m, k), noise.reshape(m, k, *xb.shape[1:])))
        add_clipped(acc, grads, clip)
        loss_total = loss_total + losses.detach().sum() * k
        rows += m * k
    if dist.active:
        counts = torch.stack([loss_total, torch.tensor(float(rows), device=x.device)])
        dist.all_reduce_(acc + [counts])
        return acc, counts[0] / counts[1].clamp_min(1.0)
    return acc, loss_total / max(rows, 1)


def add_clipped(acc: list[torch.Tensor], per_record: list[torch.Tensor], clip: float) -> None:
    """acc += Σ_i g_i·min(1, C/‖g_i‖) with ‖g_i‖ the norm over ALL parameters of record i (flat clipping).

    In the accumulators' dtype (fp32) with autocast off: under ``precision=bf16`` autocast would run the
    einsum in bf16, and per-record gradients may arrive in bf16 (opacus' hooks); a bf16 norm or clipped sum
    can exceed C by 2^-8 relative (:mod:`dpgen.core.precision`)."""
    with full_precision():
        per_record = [g.to(a.dtype) for a, g in zip(acc, per_record)]
        norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in per_record))
        factor = (clip / norms.clamp_min(1e-12)).clamp(max=1.0)
        for a, g in zip(acc, per_record):
            a.add_(torch.einsum("i,i...->...", factor, g))


def canary_sum(canaries: "DpsgdCanaries", clip: float) -> torch.Tensor:
    """An audit run's step (:mod:`dpgen.audit`): the sampled canaries' per-record gradients on their reserved
    coordinates, clipped by :func:`add_clipped` exactly as the records' are (a canary's gradient is zero on the
    model, so its norm over all parameters is its norm there) and summed; the caller adds the coordinates to
    the parameters :func:`set_noisy_grads` noises."""
    acc = torch.zeros_like(canaries.coordinates.detach())
    add_clipped([acc], [canaries.rows()], clip)
    return acc


def set_noisy_grads(params: list[torch.nn.Parameter], sums: list[torch.Tensor], sigma: float, clip: float,
                    expected_batch: float, generator: SecretGenerator) -> None:
    """p.grad = (Σ clipped + N(0, σ²C²I)) / B* (Eq. 9; the noise, from the secret ``generator``, is the only
    randomness added)."""
    require_secret(generator, "DP-SGD noise")
    for p, s in zip(params, sums):
        noise = gaussian_noise(s.shape, sigma * clip, generator, device=s.device, dtype=s.dtype,
                               mechanism="DP-SGD noise")
        p.grad = (s + noise) / expected_batch
