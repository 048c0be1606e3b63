"""DP-SGD's optimizer: opacus' :class:`~opacus.optimizers.DPOptimizer` with dpgen's noise.

opacus clips per-sample gradients to C and adds N(0, σ²C²) to their sum (Abadi et al. 2016, Alg. 1). This
subclass only changes where the noise comes from: the secret stream it is given, through
:func:`dpgen.privacy.randomness.gaussian_noise` (the run's ``privacy.secure_noise``), so every Gaussian
mechanism in dpgen draws its noise the same way.
"""
from __future__ import annotations

from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

from dpgen.privacy.randomness import gaussian_noise, require_secret

__all__ = ["DPSGDOptimizer"]


class DPSGDOptimizer(DPOptimizer):
    """opacus' DPOptimizer whose noise N(0, (noise_multiplier·max_grad_norm)² I) is drawn by
    :func:`gaussian_noise` from the secret ``generator`` (required)."""

    def __init__(self, *args, generator, **kwargs) -> None:
        require_secret(generator, "DP-SGD noise")
        super().__init__(*args, generator=generator, **kwargs)

    def add_noise(self) -> None:
        std = self.noise_multiplier * self.max_grad_norm
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            s = p.summed_grad
            noise = gaussian_noise(s.shape, std, self.generator, device=s.device, dtype=s.dtype,
                                   mechanism="DP-SGD noise")
            p.grad = (s + noise).view_as(p)
            _mark_as_processed(p.summed_grad)
