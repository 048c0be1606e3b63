"""``dpac:`` block (configs/method/dpac.yaml and gswgan.yaml): GS-WGAN and DP-GAN-DPAC; the shared
GS-WGAN part is :class:`EnsembleHparams` (efsgd builds on it too)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Optional

from dpgen.core.checks import (CheckContext, bad, check_batch_le_n, check_betas, check_max_image_size, nested,
                               spec)
from dpgen.errors import DpgenError


@dataclass
class ClassifierHparams:
    """DPAC's auxiliary classifier C."""

    enabled: bool = spec()
    start: int = spec(ge=0)                     # t_c
    n_fake: int = spec(ge=0)
    n_real: int = spec(ge=0)
    fake_batch: int = spec(ge=1)
    reinit: bool = spec()
    order: str = spec(choices=("sequential", "parallel"))
    loss: str = spec(choices=("wgan", "ce"))   # C's score: the papers' WGAN-style class score | ce (log-probability)
    lr: Optional[float] = spec(gt=0.0)          # C's Adam rate (null: lr, as the papers)
    real_batch: Optional[int] = spec(ge=1)      # real images per C step (null: batch_size, as the papers)


@dataclass
class EnsembleHparams:
    """K discriminators on disjoint partitions and the sanitised generator (GS-WGAN)."""

    num_discriminators: int = spec(ge=1)        # K (<= N)
    iters: int = spec(ge=1)
    batch_size: int = spec(ge=1)
    critic_iters: int = spec(ge=1)
    pretrain_iters: int = spec(ge=0)
    pretrain_chunk: int = spec(ge=1)
    pretrain_g_width: Optional[int] = spec(ge=1)  # throw-away warm-up generators' width (null: g_width)
    sampling: str = spec(choices=("poisson", "uniform"))  # partitions per iteration: Poisson at m/K | one, uniform (the paper; paper accounting only)
    partitions_per_iter: int = spec(ge=1)       # m: expected partitions per iteration (Poisson; 1 for uniform)
    refresh_chunk: int = spec(ge=0)             # extra critic steps of unsampled D_j on partition j (not in the papers)
    shared_init: bool = spec()                  # one data-independent initial draw for every D (not in the papers)
    gp_weight: float = spec(ge=0.0)
    drift: float = spec(ge=0.0)
    lr: float = spec(gt=0.0)
    g_lr: Optional[float] = spec(gt=0.0)
    g_lr_decay_start: Optional[float] = spec(ge=0.0, lt=1.0)  # fraction of T after which G's lr is a cosine to 0 (null: constant)
    betas: List[float] = spec(length=2)
    ema: float = spec(ge=0.0, lt=1.0)
    z_dim: int = spec(ge=1)
    g_width: int = spec(ge=1)
    d_width: int = spec(ge=1)
    clip: float = spec(gt=0.0)
    noise_multiplier: Optional[float] = spec(gt=0.0)

    @staticmethod
    def cross_check(node: Any, key: str, ctx: CheckContext) -> None:
        check_max_image_size(ctx, 32, str(ctx.cfg.method.name))
        check_betas(node, key)
        check_batch_le_n(node, key, ctx, "num_discriminators")
        check_partition_sampling(node, key, ctx)
        check_classifier_reuse(node, key, ctx)


def _privacy_on(ctx: CheckContext) -> bool:
    """True when the run's ledger must be a valid bound (sound accounting, finite eps)."""
    from dpgen.privacy.validation import parse_epsilon

    if ctx.cfg.privacy.accounting != "sound":
        return False
    try:
        return parse_epsilon(ctx.cfg.eps) != float("inf")
    except Exception:  # a bad eps has its own one-line error
        return False


def check_partition_sampling(node: Any, key: str, ctx: CheckContext) -> None:
    """``partitions_per_iter`` within 1..K, exactly 1 for the uniform draw, and the uniform draw only where no
    valid bound is claimed (dpgen.gswgan.train repeats these checks at training time)."""
    m, k = int(node.partitions_per_iter), int(node.num_discriminators)
    if m > k:
        raise bad(f"{key}.partitions_per_iter", m, f"an integer between 1 and {key}.num_discriminators={k}")
    if node.sampling == "uniform" and m != 1:
        raise bad(f"{key}.partitions_per_iter", m, f"1 with {key}.sampling=uniform (one partition per iteration)")
    if node.sampling == "uniform" and _privacy_on(ctx):
        raise DpgenError(f"{key}.sampling=uniform (one partition per iteration, as the paper) has no valid sound "
                         f"bound: the unsampled discriminators depend on earlier draws; use {key}.sampling=poisson "
                         "or privacy.accounting=paper")


def check_classifier_reuse(node: Any, key: str, ctx: CheckContext) -> None:
    """``classifier.reinit=false`` carries earlier partitions into C: refused under sound accounting (before any
    run directory exists; dpgen.gswgan.train.check_classifier_reuse repeats it at training time)."""
    clf = node.get("classifier")
    if clf is None or not bool(clf.enabled) or bool(clf.reinit):
        return
    if _privacy_on(ctx):
        raise DpgenError(f"{key}.classifier.reinit=false carries earlier partitions into C, which the sound ledger "
                         f"cannot charge at rate 1/K; use {key}.classifier.reinit=true or privacy.accounting=paper")
    if node.get("sampling") == "poisson":
        raise bad(f"{key}.classifier.reinit", False, f"true with {key}.sampling=poisson (one classifier kept across "
                  f"iterations needs one partition per iteration: {key}.sampling=uniform)")


@dataclass
class DpacHparams(EnsembleHparams):
    beta: float = spec(ge=0.0, le=1.0)          # weight of D in G's loss (1: GS-WGAN)
    sanitize: str = spec(choices=("joint", "per_path"))  # Eq. 9 (one sanitiser) | the official code (one per path)
    grad_basis: Optional[int] = spec(ge=1)      # sanitise the L lowest 2-D DCT coefficients (null: every pixel; not in the papers)
    classifier: ClassifierHparams = nested(ClassifierHparams)

    @staticmethod
    def cross_check(node: Any, key: str, ctx: CheckContext) -> None:
        EnsembleHparams.cross_check(node, key, ctx)
        shape, basis = ctx.facts.shape, node.get("grad_basis")
        if basis is not None and shape is not None and len(shape) == 3 and int(basis) > math.prod(shape):
            raise bad(f"{key}.grad_basis", basis, f"at most the image size {math.prod(shape)} (or null)")
