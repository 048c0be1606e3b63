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

Per-sample gradients in ``grad_sample`` (opacus' hooks, or torch.func's handed over by dpgan's compiled step) are
clipped by opacus. Ghost norms and book-keeping (:mod:`dpgen.privacy.ghost`) hand over no per-sample gradient:
:meth:`DPSGDOptimizer.record` gives the step a :class:`~dpgen.privacy.ghost.Recorded` batch instead, whose
per-sample norms get opacus' clipping factors min(1, C/(‖g_i‖ + 10⁻⁶)) and whose clipped sum (one product per
layer) becomes ``summed_grad``; the noise, the scaling and the wrapped optimizer's step are opacus' own.

Audit runs (:mod:`dpgen.audit`) hand the optimizer a :class:`~dpgen.audit.hooks.DpsgdCanaries`: its reserved
coordinates join :attr:`DPSGDOptimizer.params` (so opacus noises them with the model's; the records' rows
are zero there), each step the sampled canaries' per-sample rows, clipped by the factors the records get
(:meth:`DPSGDOptimizer.clip_factors`: a canary's gradient is zero on the model, so its norm over all parameters
is its row's), are added to the clipped sum on the coordinates before the noise, and the released noisy sum
on the coordinates goes back to the hook. The canaries' rows are Dirac vectors, summed sparsely
(:meth:`~dpgen.audit.hooks.DpsgdCanaries.clipped_sum`), so an audit holds tens of thousands of canaries. Without canaries (every other run) nothing of this runs and the step
is opacus' own.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

import torch
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

from dpgen.core.precision import full_precision
from dpgen.privacy.randomness import gaussian_noise, require_secret

if TYPE_CHECKING:
    from dpgen.audit.hooks import DpsgdCanaries
    from dpgen.privacy.ghost import Recorded

__all__ = ["DPSGDOptimizer"]


class DPSGDOptimizer(DPOptimizer):
    """opacus' DPOptimizer whose noise N(0, (noise_multiplier·max_grad_norm)² I) is drawn by
    :func:`gaussian_noise` from the secret ``generator`` (required)."""

    def __init__(self, *args, generator, canaries: "DpsgdCanaries | None" = None, **kwargs) -> None:
        require_secret(generator, "DP-SGD noise")
        self.canaries = canaries  # before opacus' __init__, which reads self.params
        #: rows of the last step that are real records (the canaries' rows follow them); None: all
        self.real_rows: int | None = None
        #: the next step's batch as ghost norms and book-keeping (:meth:`record`); None: per-sample gradients
        self.recorded: "Recorded | None" = None
        super().__init__(*args, generator=generator, **kwargs)

    @property
    def params(self) -> list[torch.nn.Parameter]:
        """The parameters opacus clips and noises: the model's, then an audit's reserved coordinates."""
        ps = super().params
        return ps if getattr(self, "canaries", None) is None else ps + [self.canaries.coordinates]

    @property
    def model_params(self) -> list[torch.nn.Parameter]:
        """The model's parameters only (no audit coordinates): what diagnostics may look at."""
        return super().params

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """opacus' step (clip, accumulate, noise, scale, the wrapped optimizer's update) with autocast off."""
        with full_precision():
            return super().step(closure)

    def record(self, recorded: "Recorded") -> None:
        """The next :meth:`step` clips and noises this batch of ghost norms and book-keeping (no ``grad_sample``)."""
        self.recorded = recorded

    def clip_factors(self, norms: torch.Tensor) -> torch.Tensor:
        """opacus' per-sample clipping factors min(1, C/(‖g_i‖ + 10⁻⁶)) (``DPOptimizer.clip_and_accumulate``)."""
        return (self.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)

    def clip_and_accumulate(self) -> None:
        """opacus' clipping of ``grad_sample``, or, for a :meth:`record` ed batch, Σ_i c_i g_i by book-keeping with
        the same factors c_i; then an audit's canary rows, clipped by the same factors, on the reserved
        coordinates (the records' rows are zero there)."""
        if self.recorded is None:
            super().clip_and_accumulate()
        else:
            rec, self.recorded = self.recorded, None
            by_param = dict(zip(map(id, rec.params), rec.clipped_sum(self.clip_factors(rec.norms))))
            if self.canaries is not None:
                coords = self.canaries.coordinates
                by_param[id(coords)] = torch.zeros_like(coords.detach())
                self.real_rows = len(rec.losses)
            if set(by_param) != {id(p) for p in self.params}:
                raise ValueError("the recorded batch covers other parameters than the optimizer's")
            for p in self.params:
                s = by_param[id(p)]
                p.summed_grad = s if p.summed_grad is None else p.summed_grad + s
        if self.canaries is not None:
            coords = self.canaries.coordinates
            coords.summed_grad.add_(self.canaries.clipped_sum(self.clip_factors).to(coords.summed_grad.dtype))

    def pre_step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """Per-sample gradients in the parameters' dtype before opacus computes their norms (see the module
        docstring), then opacus' clipping and noise, with autocast off."""
        with full_precision():
            if self.recorded is not None:
                return self._recorded_pre_step()
            for p in self.params:
                if getattr(p, "grad_sample", None) is not None:  # opacus explains a missing one itself
                    p.grad_sample = _in_dtype(p.grad_sample, p.dtype)
            if self.canaries is None:
                return super().pre_step(closure)
            self._zero_coordinate_rows()
            released = super().pre_step(closure)
            if released:
                self.canaries.observe_release()
            return released

    def _recorded_pre_step(self) -> bool:
        """opacus' ``pre_step`` for a :meth:`record` ed batch: clip and sum, then (unless a skip was signalled)
        noise, scale and the step hook; an audit reads the release on its coordinates."""
        self.clip_and_accumulate()
        if self._check_skip_next_step():
            self._is_last_step_skipped = True
            return False
        self.add_noise()
        self.scale_grad()
        if self.step_hook:
            self.step_hook(self)
        self._is_last_step_skipped = False
        if self.canaries is not None:
            self.canaries.observe_release()
        return True

    def _zero_coordinate_rows(self) -> None:
        """The records' rows on the reserved coordinates, before opacus clips: zero (a broadcast zero, no (b, m)
        buffer), so that opacus' per-sample norms and clipped sums see the coordinates as a parameter with zero
        per-sample gradients; the canaries' own rows are clipped and added in :meth:`clip_and_accumulate`."""
        model = self.model_params
        self.real_rows = b = len(self._get_flat_grad_sample(model[0])) if model else 0
        coords = self.canaries.coordinates
        coords.grad_sample = coords.detach().new_zeros(()).expand(b, *coords.shape)

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
