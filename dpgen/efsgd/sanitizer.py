"""Error-feedback gradient sanitiser (EFSGD Sec. 3.3/4.1, Eq. 7–11; DiceSGD, Zhang, Bu, Wu & Hong, ICLR 2024).

Per generator iteration each component c ∈ {d (discriminator), c (classifier), e (encoder)} sends
G the per-sample gradients g ∈ R^{B×d} w.r.t. its generated images. With error feedback the
released direction is (rows = generated-sample slots, clipping per row as in dpac)::

    v = clip(g, C1) + clip(e, C2)          (Eq. 7)
    e ← e + g − v                          (Eq. 8–11, one e per component)
    release = v + N(0, (2·C1·z·sqrt(1 + 2·C2/C1))² I),   then ÷B

The noise factor sqrt(1 + 2·C2/C1) is DiceSGD's (Theorem on the privacy of DiceSGD, ICLR 2024;
official code ``optimizers_utils.py``: ``sigma·C1·sqrt(1 + 2·C2)`` with C2 given as the ratio
C2/C1, accounting.md §5). Under that theorem the step costs what an ordinary (subsampled)
Gaussian step with multiplier z costs, which is what the ledger records. 2·C1 is dpac's per-sample
sensitivity (changing a record moves D_k/C/E, so a clipped row can move anywhere in the C1-ball).
``e`` holds raw, unclipped gradient information: it lives only here and in the (private)
checkpoint, never in generator.pt.
"""
from __future__ import annotations

import math

import torch

from dpgen.dpac.sanitizer import Sanitizer
from dpgen.privacy import clip_rows


def ef_noise_std(clip: float, clip_error: float, noise_multiplier: float, error_feedback: bool = True) -> float:
    """Per-coordinate noise std 2·C1·z·sqrt(1 + 2·C2/C1) (DiceSGD), or dpac's 2·C1·z without error feedback."""
    base = 2.0 * clip * noise_multiplier
    return base * math.sqrt(1.0 + 2.0 * clip_error / clip) if error_feedback else base


class ErrorFeedbackSanitizer(Sanitizer):
    """dpac's :class:`Sanitizer` plus one error state ``error`` [B, ...] and a post-sanitisation weight.

    ``weight`` multiplies the released (clipped + noised) gradient — post-processing, so the loss
    weights of Eq. 15 (λ_c, γ_recon) act on G's update instead of being undone by clipping.
    ``last_clipped`` is clip(g, C1), ``last_error_clipped`` clip(e, C2), ``last_direction`` v,
    ``last_release`` v + noise (before weight and ÷B).
    """

    def __init__(self, clip: float, noise_multiplier: float, clip_error: float, error_feedback: bool = True,
                 weight: float = 1.0, generator: torch.Generator | None = None) -> None:
        super().__init__(clip, noise_multiplier, generator)
        if clip_error < clip:
            raise ValueError(f"error clip C2={clip_error} must be >= C1={clip} (DiceSGD)")
        self.clip_error, self.error_feedback, self.weight = float(clip_error), bool(error_feedback), float(weight)
        self.error: torch.Tensor | None = None
        self.last_error_clipped: torch.Tensor | None = None
        self.last_direction: torch.Tensor | None = None

    @property
    def noise_std(self) -> float:
        return ef_noise_std(self.clip, self.clip_error, self.noise_multiplier, self.error_feedback)

    def update(self, g: torch.Tensor) -> torch.Tensor:
        """v = clip(g, C1) + clip(e, C2); e ← e + g − v. Returns v (no noise). Without error feedback v = clip(g, C1)."""
        g = g.detach()
        self.last_norms = g.flatten(1).norm(dim=1)
        clipped = clip_rows(g, self.clip)
        self.last_clipped = clipped
        if not self.error_feedback:
            self.last_direction = clipped
            return clipped
        if self.error is None or self.error.shape != g.shape:
            self.error = torch.zeros_like(g)
        e_clipped = clip_rows(self.error, self.clip_error)
        v = clipped + e_clipped
        self.error = self.error + g - v
        self.last_error_clipped, self.last_direction = e_clipped, v
        return v

    def sanitize(self, g: torch.Tensor) -> torch.Tensor:
        v = self.update(g)
        noise = torch.randn(g.shape, generator=self.generator, device=g.device, dtype=g.dtype) * self.noise_std
        self.last_release = (v + noise).detach()
        self.calls += 1
        return self.weight * (v + noise) / g.shape[0]

    def state_dict(self) -> dict:
        return {"error": self.error}

    def load_state_dict(self, d: dict) -> None:
        self.error = d.get("error")
