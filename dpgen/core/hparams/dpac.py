"""``dpac:`` block (configs/method/dpac.yaml): DP-GAN-DPAC, GS-WGAN's keys (:mod:`dpgen.core.hparams.gswgan`) plus
the auxiliary classifier (:class:`ClassifierHparams`, which efsgd's block shares)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from dpgen.core.checks import CheckContext, bad, nested, spec
from dpgen.core.hparams.gswgan import GswganHparams, privacy_on
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


def check_classifier_reuse(node: Any, key: str, ctx: CheckContext) -> None:
    """``classifier.reinit=false`` carries earlier partitions into C: refused under sound accounting (before any
    run directory exists; dpgen.gswgan.train.check_classifier_reuse repeats it at training time)."""
    clf = node.get("classifier")
    if clf is None or not bool(clf.enabled) or bool(clf.reinit):
        return
    if privacy_on(ctx):
        raise DpgenError(f"{key}.classifier.reinit=false carries earlier partitions into C, which the sound ledger "
                         f"cannot charge at rate 1/K; use {key}.classifier.reinit=true or privacy.accounting=paper")
    if node.get("sampling") == "poisson":
        raise bad(f"{key}.classifier.reinit", False, f"true with {key}.sampling=poisson (one classifier kept across "
                  f"iterations needs one partition per iteration: {key}.sampling=uniform)")


@dataclass
class DpacHparams(GswganHparams):
    """DPAC (Chen et al. 2023): GS-WGAN's keys, β, the sanitiser mode and the classifier C."""

    beta: float = spec(ge=0.0, le=1.0)          # weight of D in G's loss (1: GS-WGAN)
    sanitize: str = spec(choices=("joint", "per_path"))  # Eq. 9 (one sanitiser) | the official code (one per path)
    classifier: ClassifierHparams = nested(ClassifierHparams)

    @staticmethod
    def cross_check(node: Any, key: str, ctx: CheckContext) -> None:
        GswganHparams.cross_check(node, key, ctx)
        check_classifier_reuse(node, key, ctx)
