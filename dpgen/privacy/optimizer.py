"""DP-SGD's optimizer: opacus' :class:`~opacus.optimizers.DPOptimizer` with dpgen's noise.

opacus clips per-sample gradients to C and adds N(0, σ²C²) to their sum (Abadi et al. 2016, Alg. 1). This
subclass only changes where the noise comes from: the secret stream it is given, through
:func:`dpgen.privacy.randomness.gaussian_noise` (the run's ``privacy.secure_noise``), so every Gaussian
mechanism in dpgen draws its noise the same way.

Under ``precision=bf16`` (:mod:`dpgen.core.precision`) the per-sample gradients opacus' hooks compute in the
backward pass may be bf16. :meth:`DPSGDOptimizer.step` runs with autocast off and first casts them to the
parameters' dtype (fp32), so the per-sample norms, the clipping factors, the clipped sum, the noise and the
wrapped optimizer's state are fp32: opacus computes the norms in the gradients' own dtype, and a bf16 norm
can understate the true one by 2^-8 relative, so the clipped sum could exceed C.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

from dpgen.core.precision import full_precision
from dpgen.privacy.randomness import gaussian_noise, require_secret

__all__ = ["DPSGDOptimizer"]


class DPSGDOptimizer(DPOptimizer):
    """opacus' DPOptimizer whose noise N(0, (noise_multiplier·max_grad_norm)² I) is drawn by
    :func:`gaussian_noise` from the secret ``generator`` (required)."""

    def __init__(self, *args, generator, **kwargs) -> None:
        require_secret(generator, "DP-SGD noise")
        super().__init__(*args, generator=generator, **kwargs)

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """opacus' step (clip, accumulate, noise, scale, the wrapped optimizer's update) with autocast off."""
        with full_precision():
            return super().step(closure)

    def pre_step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """Per-sample gradients in the parameters' dtype before opacus computes their norms (see the module
        docstring), then opacus' clipping and noise, with autocast off."""
        with full_precision():
            for p in self.params:
                if getattr(p, "grad_sample", None) is not None:  # opacus explains a missing one itself
                    p.grad_sample = _in_dtype(p.grad_sample, p.dtype)
            return super().pre_step(closure)

    def add_noise(self) -> None:
        std = self.noise_multiplier * self.max_grad_norm
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            s = p.summed_grad
            noise = gaussian_noise(s.shape, std, self.generator, device=s.device, dtype=s.dtype,
                                   mechanism="DP-SGD noise")
            p.grad = (s + noise).view_as(p)
            _mark_as_processed(p.summed_grad)


def _in_dtype(grad_sample: torch.Tensor | list, dtype: torch.dtype) -> torch.Tensor | list:
    """A parameter's ``grad_sample`` (a tensor, or a list of them when several backward passes accumulated
    into it) in ``dtype``: the same object where it already is; a cast copy keeps opacus' ``_processed`` flag
    (its guard against a second step on the same per-sample gradients)."""
    if isinstance(grad_sample, list):
        return [_in_dtype(g, dtype) for g in grad_sample]
    if grad_sample.dtype == dtype:
        return grad_sample
    cast = grad_sample.to(dtype)
    if hasattr(grad_sample, "_processed"):
        cast._processed = grad_sample._processed
    return cast
