"""``gswgan:`` block (configs/method/gswgan.yaml): GS-WGAN. Its keys without ``grad_basis``,
:class:`EnsembleHparams`, are the GS-WGAN base that the ``dpac`` and ``efsgd`` blocks build on
(:mod:`dpgen.core.hparams.dpac`, :mod:`dpgen.core.hparams.efsgd`).

Runs saved before GS-WGAN had its own block kept these keys under ``dpac:``;
:func:`gswgan_block_from_dpac` reads such a block as this one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Optional

from dpgen.core.checks import CheckContext, bad, check_batch_le_n, check_betas, check_max_image_size, spec
from dpgen.errors import DpgenError


@dataclass
class EnsembleHparams:
    """K discriminators on disjoint partitions and the sanitised generator (GS-WGAN)."""

    num_discriminators: int = spec(ge=1)        # K (<= N)
    iters: int = spec(ge=1)
    batch_size: int = spec(ge=1)
    critic_iters: int = spec(ge=1)
    pretrain_iters: int = spec(ge=0)
    pretrain_chunk: Optional[int] = spec(ge=1)  # pairs pre-trained at once; null: sized from device memory
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


def privacy_on(ctx: CheckContext) -> bool:
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
    if node.sampling == "uniform" and privacy_on(ctx):
        raise DpgenError(f"{key}.sampling=uniform (one partition per iteration, as the paper) has no valid sound "
                         f"bound: the unsampled discriminators depend on earlier draws; use {key}.sampling=poisson "
                         "or privacy.accounting=paper")


@dataclass
class GswganHparams(EnsembleHparams):
    """GS-WGAN (Chen et al. 2020): the ensemble's keys and the sanitiser's basis."""

    grad_basis: Optional[int] = spec(ge=1)      # sanitise the L lowest 2-D DCT coefficients (null: every pixel; not in the papers)

    @staticmethod
    def cross_check(node: Any, key: str, ctx: CheckContext) -> None:
        EnsembleHparams.cross_check(node, key, ctx)
        shape, basis = ctx.facts.shape, node.get("grad_basis")
        if basis is not None and shape is not None and len(shape) == 3 and int(basis) > math.prod(shape):
            raise bad(f"{key}.grad_basis", basis, f"at most the image size {math.prod(shape)} (or null)")


#: the DPAC keys a ``method=gswgan`` run saved under ``dpac:`` also carried, with the value GS-WGAN ran with (None:
#: any value; GS-WGAN has no classifier, so its settings and the sanitiser mode of its one path had no effect)
DPAC_ONLY_KEYS: dict[str, Any] = {"beta": 1.0, "sanitize": None, "classifier": None}


def gswgan_block_from_dpac(block: dict) -> dict:
    """A ``method=gswgan`` run's ``dpac:`` block (saved before GS-WGAN had its own) as its ``gswgan:`` block: the
    same keys less DPAC's own (:data:`DPAC_ONLY_KEYS`). A β other than 1 weighted G's loss: no longer GS-WGAN (a
    one-line DpgenError)."""
    out = dict(block)
    for name, value in DPAC_ONLY_KEYS.items():
        saved = out.pop(name, value)
        if value is not None and not _equals(saved, value):
            raise DpgenError(f"a method=gswgan run saved with dpac.{name}={saved} is not GS-WGAN, which trains with "
                             f"{name}={value:g} (its generator loss is D alone); it cannot be read as one")
    return out


def _equals(saved: Any, value: float) -> bool:
    try:
        return not isinstance(saved, bool) and float(saved) == value
    except (TypeError, ValueError):  # an untrusted file's string, or an interpolation: not the value GS-WGAN ran with
        return False
