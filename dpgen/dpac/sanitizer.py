"""The GS-WGAN gradient sanitiser (Chen et al. 2020, Alg. 1; DPAC paper eq. 5 and 9).

G's update needs ∇_{G(z)} L_G (data dependent: it goes through D_k / C, trained on partition k)
times the local Jacobian J_θ G(z) (data independent). A :class:`Sanitizer` is an identity on the
generated batch whose *backward* replaces each sample's incoming gradient g_i = ∂ℓ_i/∂x_i by
``clip(g_i, C) + N(0, (2·C·z)² I)`` and then averages over the batch (÷B, post-processing).
2C is the per-sample sensitivity: changing one record changes D_k (and C), so g_i may move
anywhere in the C-ball. Nothing else that depends on the data reaches G.

Under ``precision=bf16`` the generated batch, hence g, may be bf16: the clipping, the noise and the release are
computed in fp32 with autocast off (:mod:`dpgen.core.precision`), and only the released gradient is cast back
to g's dtype for G's backward pass (autograd requires a hook to keep the dtype; rounding the noisy release
is post-processing).
"""
from __future__ import annotations

import torch

from dpgen.core.precision import at_least_fp32, full_precision
from dpgen.privacy import clip_rows
from dpgen.privacy.randomness import SecretGenerator, gaussian_noise, require_secret


class Sanitizer:
    """Backward hook that clips and noises per-sample gradients w.r.t. the generated images.

    ``noise_multiplier`` z is per sample: noise std ``2·clip·z`` per coordinate. ``last_norms``
    (pre-clip norms), ``last_clipped`` and ``last_release`` (what leaves the hook, before ÷B)
    are kept for tests and logging. The noise comes from the secret ``generator``.
    """

    def __init__(self, clip: float, noise_multiplier: float, generator: SecretGenerator) -> None:
        if clip <= 0 or noise_multiplier < 0:
            raise ValueError(f"sanitizer needs clip > 0 and noise_multiplier >= 0, got {clip}, {noise_multiplier}")
        self.clip, self.noise_multiplier = float(clip), float(noise_multiplier)
        self.generator = require_secret(generator, f"{type(self).__name__} noise")
        self.last_norms: torch.Tensor | None = None
        self.last_clipped: torch.Tensor | None = None
        self.last_release: torch.Tensor | None = None
        self.calls = 0

    @property
    def noise_std(self) -> float:
        return 2.0 * self.clip * self.noise_multiplier

    def sanitize(self, g: torch.Tensor) -> torch.Tensor:
        """Eq. (5) on every row of ``g`` [B, ...]: clip each row to ``clip``, add Gaussian noise; then ÷B.
        In at least fp32; the result in g's dtype (see the module docstring)."""
        dtype = g.dtype
        with full_precision():
            g = at_least_fp32(g)
            self.last_norms = g.detach().flatten(1).norm(dim=1)
            clipped = clip_rows(g, self.clip)
            noise = gaussian_noise(g.shape, self.noise_std, self.generator, device=g.device, dtype=g.dtype,
                                   mechanism="sanitizer noise")
            self.last_clipped = clipped.detach()
            self.last_release = (clipped + noise).detach()
            self.calls += 1
            return ((clipped + noise) / g.shape[0]).to(dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Identity in the forward pass; the backward pass of the returned tensor is sanitised."""
        out = x.view_as(x)
        out.register_hook(self.sanitize)
        return out
