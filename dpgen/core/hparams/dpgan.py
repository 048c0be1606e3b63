"""``dpgan:`` block (configs/method/dpgan.yaml): the DP-SGD conditional DCGAN baseline."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

from dpgen.core.checks import CheckContext, check_batch_le_n, check_betas, spec


@dataclass
class DpganHparams:
    iters: int = spec(ge=1)                     # generator iterations
    n_critic: int = spec(ge=1)                  # DP-SGD discriminator steps per generator step
    batch_size: int = spec(ge=1)                # expected Poisson batch (<= N)
    clip: float = spec(gt=0.0)                  # per-sample L2 clipping norm C
    grad_backend: str = spec(choices=("ghost", "opacus"))  # per-sample norms and clipped sum
    noise_multiplier: Optional[float] = spec(gt=0.0)  # null: calibrated to eps
    lr_d: float = spec(gt=0.0)
    lr_g: float = spec(gt=0.0)
    betas: List[float] = spec(length=2)
    mode_seeking: float = spec(ge=0.0)
    z_dim: int = spec(ge=1)
    g_width: int = spec(ge=1)
    d_width: int = spec(ge=1)

    @staticmethod
    def cross_check(node: Any, key: str, ctx: CheckContext) -> None:
        check_betas(node, key)
        check_batch_le_n(node, key, ctx, "batch_size")
