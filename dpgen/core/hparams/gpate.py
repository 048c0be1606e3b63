"""``gpate:`` block (configs/method/gpate.yaml): teacher ensemble and DPGradAgg (G-PATE)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

from dpgen.core.checks import CheckContext, bad, check_betas, spec
from dpgen.errors import DpgenError


@dataclass
class GpateHparams:
    teachers: Optional[int] = spec(ge=2)        # null: 4000 (eps <= 1) / 2000
    noise: str = spec(choices=("readme", "calibrate"))
    sigma1: Optional[float] = spec(gt=0.0)      # threshold-check noise std
    sigma2: Optional[float] = spec(gt=0.0)      # argmax noise std
    thresh: Optional[float] = spec(ge=0.0, le=1.0)  # threshold as a fraction of the teacher count; null: no check
    sigma_ratio: Optional[float] = spec(gt=0.0)  # noise=calibrate: sigma1/sigma2 (null: the README ratio)
    step_size: float = spec(gt=0.0)             # clipping constant c
    bins: int = spec(ge=2)
    proj_dim: int = spec(ge=1)
    batch_size: int = spec(ge=1)
    iters: int = spec(ge=1)
    teacher_warmup: int = spec(ge=0)
    d_steps: int = spec(ge=1)
    lr: float = spec(gt=0.0)
    betas: List[float] = spec(length=2)
    z_dim: Optional[int] = spec(ge=1)
    gf_dim: int = spec(ge=1)
    gfc_dim: int = spec(ge=1)
    df_dim: int = spec(ge=1)
    dfc_dim: int = spec(ge=1)
    g_hidden: int = spec(ge=1)
    t_hidden: int = spec(ge=1)
    teacher_norm: str = spec(choices=("none", "layer", "batch"))
    teacher_fakes: str = spec(choices=("official", "shared"))
    g_sample_stats: str = spec(choices=("batch", "running"))
    projection: str = spec(choices=("gaussian", "dct"))
    proj_basis: Optional[int] = spec(ge=1)      # projection=dct: number of DCT atoms
    work_size: Optional[int] = spec(ge=4)       # G and teachers' resolution (not in the paper)
    chunk: Optional[int] = spec(ge=1)
    dp_class_prior: bool = spec()
    prior_eps: float = spec(gt=0.0)

    @staticmethod
    def cross_check(node: Any, key: str, ctx: CheckContext) -> None:
        check_betas(node, key)
        if (node.sigma1 is None) != (node.sigma2 is None):
            raise DpgenError(f"set both {key}.sigma1 and {key}.sigma2, or neither "
                             f"(got sigma1={node.sigma1}, sigma2={node.sigma2})")
        n = ctx.facts.n_train
        if n is not None and node.teachers is not None and int(node.teachers) > n:
            raise bad(f"{key}.teachers", node.teachers, f"at most N={n} (more would leave fewer than one record per teacher)")
