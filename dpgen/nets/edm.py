"""EDM preconditioning, loss and samplers (Karras et al. 2022, "Elucidating the design space", EDM).

Used by DPDM / DP-FETA: σ_data = √(1/3) (DPDM ``denoiser.py``), ln σ ~ N(P_mean, P_std²) with
(−1.2, 1.2), loss weight λ(σ) = (σ² + σ_d²)/(σ σ_d)² (EDM Table 1), data scaled to [−1, 1].
"""
from __future__ import annotations

import math

import torch
from torch import nn

from dpgen.errors import DpgenError

SIGMA_DATA = math.sqrt(1.0 / 3.0)


class EDMDenoiser(nn.Module):
    """D(x; σ, y) = c_skip x + c_out F(c_in x, c_noise, y) (EDM Table 1, "Ours" column, c_noise = ¼ ln σ)."""

    def __init__(self, net: nn.Module, sigma_data: float = SIGMA_DATA) -> None:
        super().__init__()
        self.net = net
        self.sigma_data = float(sigma_data)

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        sigma = sigma.reshape(-1, 1, 1, 1).to(x.dtype)
        sd2 = self.sigma_data ** 2
        c_skip = sd2 / (sigma ** 2 + sd2)
        c_out = sigma * self.sigma_data / (sigma ** 2 + sd2).sqrt()
        c_in = 1.0 / (sigma ** 2 + sd2).sqrt()
        c_noise = sigma.log().flatten() / 4.0
        return c_skip * x + c_out * self.net(c_in * x, c_noise, labels)


def edm_draws(x: torch.Tensor, generator: torch.Generator | None, p_mean: float = -1.2,
              p_std: float = 1.2) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss's randomness: ln σ ~ N(p_mean, p_std²) per row and n ~ N(0, σ²I) (EDM Table 1)."""
    sigma = (torch.randn(x.shape[0], generator=generator, device=x.device) * p_std + p_mean).exp()
    noise = torch.randn(x.shape, generator=generator, device=x.device) * sigma.reshape(-1, 1, 1, 1)
    return sigma, noise


def edm_loss_at(denoiser, x: torch.Tensor, labels: torch.Tensor, sigma: torch.Tensor, noise: torch.Tensor,
                sigma_data: float = SIGMA_DATA) -> torch.Tensor:
    """λ(σ)·mean‖D(x+n; σ) − x‖² per row for given draws (EDM Eq. 2); pure, so torch.func can vmap it."""
    sd = float(sigma_data)
    weight = (sigma ** 2 + sd ** 2) / (sigma * sd) ** 2
    err = (denoiser(x + noise, sigma, labels) - x) ** 2
    return weight * err.flatten(1).mean(1)


def edm_loss(denoiser: nn.Module, x: torch.Tensor, labels: torch.Tensor, generator: torch.Generator | None,
             p_mean: float = -1.2, p_std: float = 1.2, sigma_data: float = SIGMA_DATA) -> torch.Tensor:
    """Per-example EDM loss λ(σ)·mean‖D(x+n; σ) − x‖² with ln σ ~ N(p_mean, p_std²) (EDM Eq. 2, Table 1).

    ``x`` in [−1, 1]; returns a vector with one loss per row (pixel-averaged). ``denoiser`` may be an
    :class:`EDMDenoiser` wrapped by opacus, hence ``sigma_data`` is passed explicitly.
    """
    sigma, noise = edm_draws(x, generator, p_mean, p_std)
    return edm_loss_at(denoiser, x, labels, sigma, noise, sigma_data)


def edm_sigma_grid(steps: int, sigma_min: float = 0.002, sigma_max: float = 80.0, rho: float = 7.0,
                   device: torch.device | None = None) -> torch.Tensor:
    """t_i = (σ_max^{1/ρ} + i/(N−1)(σ_min^{1/ρ} − σ_max^{1/ρ}))^ρ, i < N, plus t_N = 0 (EDM Eq. 5)."""
    if steps < 1:
        raise DpgenError(f"sampler steps must be >= 1, got {steps}")
    i = torch.arange(steps, dtype=torch.float64, device=device)
    frac = i / max(steps - 1, 1)
    t = (sigma_max ** (1 / rho) + frac * (sigma_min ** (1 / rho) - sigma_max ** (1 / rho))) ** rho
    return torch.cat([t, torch.zeros(1, dtype=torch.float64, device=device)])


def _guided(denoiser: EDMDenoiser, x: torch.Tensor, t: float, labels: torch.Tensor, null: int,
            guidance: float) -> torch.Tensor:
    """Classifier-free guidance (Ho & Salimans 2022): (1+w) D(x|y) − w D(x|∅); w = 0 is plain conditional.
    With guidance both denoiser calls run as one batch of 2n (one launch per layer on a GPU)."""
    if not guidance:
        return denoiser(x, torch.full((x.shape[0],), t, device=x.device, dtype=x.dtype), labels)
    n = x.shape[0]
    sig = torch.full((2 * n,), t, device=x.device, dtype=x.dtype)
    both = denoiser(torch.cat([x, x]), sig, torch.cat([labels, torch.full_like(labels, null)]))
    return (1 + guidance) * both[:n] - guidance * both[n:]


@torch.no_grad()
def sample(denoiser: EDMDenoiser, labels: torch.Tensor, shape: tuple[int, ...], generator: torch.Generator | None,
           *, name: str = "ddim", steps: int = 50, sigma_min: float = 0.002, sigma_max: float = 80.0,
           rho: float = 7.0, churn: float = 0.0, s_min: float = 0.0, s_max: float = float("inf"),
           s_noise: float = 1.0, guidance: float = 0.0, null_label: int | None = None) -> torch.Tensor:
    """Draw samples in [−1, 1].

    ``name="ddim"``: deterministic first-order Euler on the EDM grid (DPDM's default "ddim" sampler).
    ``name="edm"``: EDM Alg. 2, Heun's 2nd-order method with stochastic churn γ_i = min(S_churn/N, √2−1)
    for t_i in [S_min, S_max].
    """
    if name not in ("ddim", "edm"):
        raise DpgenError(f"sampler must be ddim or edm, got {name!r}")
    null = int(null_label if null_label is not None else 0)
    device = labels.device
    ts = edm_sigma_grid(int(steps), sigma_min, sigma_max, rho, device=device).tolist()
    x = torch.randn((labels.shape[0], *shape), generator=generator, device=device) * ts[0]
    for i in range(int(steps)):
        t, t_next = ts[i], ts[i + 1]
        if name == "edm" and churn > 0 and s_min <= t <= s_max:
            gamma = min(churn / steps, math.sqrt(2.0) - 1.0)
            t_hat = t * (1 + gamma)
            x = x + math.sqrt(t_hat ** 2 - t ** 2) * s_noise * torch.randn(x.shape, generator=generator, device=device)
            t = t_hat
        d = (x - _guided(denoiser, x, t, labels, null, guidance)) / t
        x_next = x + (t_next - t) * d
        if name == "edm" and t_next > 0:
            d2 = (x_next - _guided(denoiser, x_next, t_next, labels, null, guidance)) / t_next
            x_next = x + (t_next - t) * 0.5 * (d + d2)
        x = x_next
    return x
