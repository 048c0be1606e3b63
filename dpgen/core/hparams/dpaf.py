"""``dpaf:`` block (configs/method/dpaf.yaml): DPAF's C/D split, budget split and training schedule."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

from dpgen.core.checks import CheckContext, check_batch_le_n, check_betas, spec
from dpgen.errors import DpgenError


@dataclass
class DpafHparams:
    layers: Optional[List[int]] = spec(ge=0, length=3)  # [x1, x2, x3]; null: the paper's split for the resolution
    width: int = spec(ge=1)
    fc_hidden: int = spec(ge=1)
    activation: str = spec(choices=("lrelu", "tanh"))
    conv1: str = spec(choices=("transfer", "random", "joint"))
    split: List[Optional[float]] = spec(ge=0.0, length=3)  # (x1, x2, x3) budgets; null = the rest
    split_unit: str = spec(choices=("eps", "fraction"))
    noise_multipliers: Optional[List[Optional[float]]] = spec(ge=0.0, length=3)  # [z1, z2, z3] fixed; null: calibrated
    batch_size: int = spec(ge=1)
    c_batch_size: int = spec(ge=1)
    mu: int = spec(ge=1)
    n_critic: int = spec(ge=1)
    c_epochs: float = spec(gt=0.0)
    d_epochs: float = spec(gt=0.0)
    clip_c: float = spec(gt=0.0)
    clip_d: float = spec(gt=0.0)
    gc_keep: float = spec(gt=0.0, le=1.0)
    sin_eps: float = spec(gt=0.0)
    lr_c: float = spec(gt=0.0)
    lr_d: float = spec(gt=0.0)
    lr_g: float = spec(gt=0.0)
    betas: List[float] = spec(length=2)
    z_dim: int = spec(ge=1)
    g_width: int = spec(ge=1)
    mode_seeking: float = spec(ge=0.0)

    @staticmethod
    def cross_check(node: Any, key: str, ctx: CheckContext) -> None:
        check_betas(node, key)
        check_batch_le_n(node, key, ctx, "batch_size", "c_batch_size")
        if ctx.facts.tabular:
            raise DpgenError(f"dataset={ctx.cfg.dataset.name} is invalid for method=dpaf: dpaf trains image GANs "
                             "and this dataset is tabular (use method=gpate)")
