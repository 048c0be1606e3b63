"""dpgan's hot steps under ``compile=true`` (:mod:`dpgen.core.compile`).

* :class:`PerSampleD`: the discriminator's per-sample gradients (torch.func's vmap(grad) instead of opacus'
  hooks, which torch.compile cannot trace), compiled, on rows padded to a bucket. They are handed to the
  :class:`~dpgen.privacy.optimizer.DPSGDOptimizer` as each parameter's ``grad_sample``, so the clipping, the noise
  (secret stream), an audit's canary rows and the optimizer step are exactly the eager path's (Abadi et al. 2016,
  Alg. 1 lines 5–9). Padded rows get weight 0 on their loss (their gradient is exactly zero) and are sliced off
  before the optimizer sees them: they reach neither the clipped sum nor the ledger.
* :class:`GeneratorLoss`: the generator's loss (G forward, D forward, the MSGAN term), compiled; its backward
  runs through the compiled graph. Its random draws are made outside, in the eager order.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from dpgen.core.compile import bucket_size, maybe_compile
from dpgen.privacy.per_sample import pad_rows, per_record_grads

__all__ = ["PerSampleD", "GeneratorLoss"]


def _row_loss(call: Callable[..., torch.Tensor], x: torch.Tensor, y: torch.Tensor, t: torch.Tensor,
              w: torch.Tensor) -> torch.Tensor:
    """One row's BCE (the summed loss of the eager step, split by row), times its weight (0: a padded row)."""
    return F.binary_cross_entropy_with_logits(call(x[None], y[None]), t[None], reduction="sum") * w


class PerSampleD:
    """Per-row gradients of the discriminator's BCE on real + fake rows, padded to a bucket and compiled."""

    def __init__(self, d: nn.Module, compile: bool = True, backend: Any = "inductor") -> None:
        self.d, self.compiled = d, bool(compile)
        self.fn = maybe_compile(self._grads, self.compiled, backend)

    def _grads(self, x: torch.Tensor, y: torch.Tensor, t: torch.Tensor,
               w: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        grads, losses = per_record_grads(self.d, _row_loss, (x, y, t, w))
        return grads, losses.sum()

    def __call__(self, x: torch.Tensor, y: torch.Tensor, t: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(per-row gradients of the trainable parameters, each (rows, *shape), in fp32; the summed loss)."""
        rows = x.shape[0]
        (xp, yp, tp), w = pad_rows((x, y, t), bucket_size(rows) if self.compiled else rows)
        grads, loss = self.fn(xp, yp, tp, w)
        return [g[:rows] for g in grads], loss


def set_grad_samples(params: list[nn.Parameter], grads: list[torch.Tensor]) -> None:
    """Hand per-sample gradients to opacus' optimizer as if its hooks had computed them."""
    for p, g in zip(params, grads):
        p.grad_sample = g


class GeneratorLoss:
    """``loss(z, y)``: the non-saturating G loss plus the MSGAN term (:func:`dpgen.dpgan.train.generator_loss_at`),
    compiled when ``compile``."""

    def __init__(self, fn: Callable[..., torch.Tensor], compile: bool = True, backend: Any = "inductor") -> None:
        self.fn = maybe_compile(fn, compile, backend)

    def __call__(self, *args: Any) -> torch.Tensor:
        return self.fn(*args)
