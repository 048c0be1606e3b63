"""DP-GAN-DPAC (Chen et al., CVPR 2023, Alg. 1): GS-WGAN plus the dual-purpose auxiliary classifier C.

:class:`Dpac` is :class:`dpgen.gswgan.train.GsWgan` through its extension points: C is extra per-partition state
(one per sampled partition k, re-initialised and trained on partition k at every iteration from t_c on,
:func:`classifier_phase`),
its gradient ∇_{G(z)} C is an extra loss path of G's step (weight 1 − β), and, with ``dpac.sanitize=per_path`` (the
official code), an extra release path with its own sanitiser; ``dpac.sanitize=joint`` (Eq. 9) releases the
gradient of β·D + (1 − β)·C through ONE sanitiser, one path. C is never released.
"""
from __future__ import annotations

import torch
from omegaconf import DictConfig

from dpgen.core.run import Run
from dpgen.data.base import ImageDataset
from dpgen.dpac.classifier import (LOSSES, ORDERS, classifier_lr, classifier_real_batch, describe_classifier,
                                   train_classifier)
from dpgen.ensemble import NetStack
from dpgen.errors import DpgenError
from dpgen.gswgan.accounting import iteration_entries
from dpgen.gswgan.nets import CLF_SCORES, Forward, ResNetGenerator
from dpgen.gswgan.sanitizer import Sanitizer
from dpgen.gswgan.train import GsWgan, Partitions, check_uniform_sampling, generator_step
from dpgen.gswgan.train import check_hparams as gswgan_check_hparams
from dpgen.nets.spectral import sn_init
from dpgen.privacy import PrivacyLedger
from dpgen.privacy.randomness import SecretGenerator

KEPT_CLASSIFIER_NOTE = (
    "classifier.reinit=false: C keeps what it learned on earlier partitions, so its gradients at an iteration "
    "depend on every partition sampled since t_c, not only on the sampled one; the C path is not a 1/K-sampled "
    "release and the paper analysis does not cover it."
)

def check_classifier_reuse(hp: DictConfig, ledger: PrivacyLedger, prefix: str, c_start: int | None) -> None:
    """``classifier.reinit=false`` breaks the per-partition argument of the C path (C carries partition j into
    the release of an iteration that sampled k): refused when the ledger must be a valid bound."""
    if c_start is None or bool(hp.classifier.reinit):
        return
    if ledger.accounting == "sound" and not ledger.privacy_off:
        raise DpgenError(f"{prefix}.classifier.reinit=false carries earlier partitions into C, which the sound "
                         f"ledger cannot charge at rate 1/K; use {prefix}.classifier.reinit=true or "
                         "privacy.accounting=paper")
    if str(hp.get("sampling", "poisson")) != "uniform":
        raise DpgenError(f"{prefix}.classifier.reinit=false keeps one classifier across iterations, which needs "
                         f"one partition per iteration: use {prefix}.sampling=uniform")
    if KEPT_CLASSIFIER_NOTE not in ledger.notes:
        ledger.notes.append(KEPT_CLASSIFIER_NOTE)

def check_hparams(hp: DictConfig, n: int, shape: tuple[int, ...]) -> None:
    """One-line DpgenErrors for bad user input: GS-WGAN's keys, β and the classifier's order."""
    gswgan_check_hparams(hp, n, shape, "dpac")
    if not 0.0 <= float(hp.beta) <= 1.0:
        raise DpgenError(f"dpac.beta={hp.beta} must be in [0, 1]")
    if hp.classifier.order not in ORDERS:
        raise DpgenError(f"dpac.classifier.order must be one of {', '.join(ORDERS)}, got {hp.classifier.order!r}")
    if hp.classifier.loss not in LOSSES:
        raise DpgenError(f"dpac.classifier.loss must be one of {', '.join(LOSSES)}, got {hp.classifier.loss!r}")


def classifier_start(hp: DictConfig) -> int | None:
    """t_c, or None when C is off (GS-WGAN baseline: β = 1 or classifier.enabled = false)."""
    if not bool(hp.classifier.enabled) or float(hp.beta) >= 1.0:
        return None
    return int(hp.classifier.start)

def classifier_phase(clf: NetStack, parts: "Partitions", k: torch.Tensor, x_all: torch.Tensor, y_all: torch.Tensor,
                     fake, hp: DictConfig, ncls: int, reset: bool, init_fn, lr: float, betas: tuple,
                     init_gen: torch.Generator, data_gen: SecretGenerator) -> NetStack:
    """DPAC Alg. 1 lines 10–19 for every sampled partition k (``k``: M members): C_k, (re-)initialised, takes n_f
    fake steps and then n_r real steps on partition k (``classifier.real_batch`` images each; null: B). Returns
    the M classifiers as a stack (row j: C_{k_j}).

    As the official code, ONE fake batch of ``fake_batch`` samples with balanced labels is drawn per iteration
    and reused by every fake step; each real step draws a fresh batch of partition k (from the secret
    ``data_gen``; the re-initialisation draws from the public ``init_gen``). ``clf`` is the one-member template:
    the M classifiers start from the same public draw and see the same public fakes, so with the sequential
    order the fake steps run once, on the template, before it is copied to the M members (the same result as M
    separate runs); only the real steps differ per partition. With ``reinit=false`` (paper accounting, one
    uniform partition) the template itself is trained and kept, as the official code's single C.
    """
    if reset:
        clf.reset(init_fn, sn_init, init_gen)
    loss = str(hp.classifier.loss)
    lr = classifier_lr(hp, lr)
    dev, b, cb = x_all.device, classifier_real_batch(hp), int(hp.classifier.fake_batch)
    fixed = fake(cb, torch.arange(cb, device=dev) % ncls)
    n_fake, n_real, order = int(hp.classifier.n_fake), int(hp.classifier.n_real), hp.classifier.order
    lam, drift = float(hp.gp_weight), float(hp.drift)
    kept = not bool(hp.classifier.reinit)
    if kept and k.shape[0] != 1:
        raise DpgenError("dpac.classifier.reinit=false keeps one classifier: it needs dpac.sampling=uniform")
    if kept:  # the official code's one C, trained on the one drawn partition and kept
        def one_real() -> tuple[torch.Tensor, torch.Tensor]:
            i = parts.sample(k, b, data_gen)[0]
            return x_all[i], y_all[i]

        train_classifier(clf, lambda: fixed, one_real, n_fake, n_real, order, lam, lr, betas, drift, loss=loss)
        return clf
    if order == "sequential":
        train_classifier(clf, lambda: fixed, lambda: None, n_fake, 0, "sequential", lam, lr, betas, drift,
                         loss=loss)
        n_fake = 0
    stack = clf.replicate(k.shape[0])
    if k.shape[0] == 0:
        return stack

    def real_batch() -> tuple[torch.Tensor, torch.Tensor]:
        i = parts.sample(k, b, data_gen)
        return x_all[i], y_all[i]

    def fake_batch() -> tuple[torch.Tensor, torch.Tensor]:
        m = k.shape[0]
        return fixed[0].unsqueeze(0).expand(m, *fixed[0].shape), fixed[1].unsqueeze(0).expand(m, -1)

    train_classifier(stack, fake_batch, real_batch, n_fake, n_real, order, lam, lr, betas, drift, stacked=True,
                     loss=loss)
    return stack


class Dpac(GsWgan):
    """DPAC's extension of GS-WGAN (module docstring): the classifier phase, the C loss path and its release."""

    prefix = "dpac"

    def __init__(self, hp: DictConfig, data: ImageDataset, ledger: PrivacyLedger, run: Run) -> None:
        super().__init__(hp, data, ledger, run)
        self.c_start = classifier_start(hp)
        self.beta = float(hp.beta)
        self.joint = str(hp.sanitize) == "joint"  # Eq. (9): one sanitiser on the gradient of the whole loss L_G

    @property
    def name(self) -> str:  # type: ignore[override]
        return "dpac" if self.c_start is not None else "gswgan"

    @property
    def c_score(self) -> Forward:  # type: ignore[override]
        """C's score in G's loss (``classifier.loss``)."""
        return CLF_SCORES[str(self.hp.classifier.loss)]

    def check(self, n: int, shape: tuple[int, ...]) -> None:
        check_hparams(self.hp, n, shape)
        check_uniform_sampling(self.hp, self.ledger, self.prefix)
        check_classifier_reuse(self.hp, self.ledger, self.prefix, self.c_start)

    def plan_entries(self, z: float) -> list:
        """The C path is a second Gaussian from t_c on unless it is sanitised jointly with D's (Eq. 9)."""
        return iteration_entries(z, self.K, self.B, self.T, None if self.joint else self.c_start,
                                 per_iter=self.per_iter)

    def build_sanitizers(self, z_noise: float, basis: torch.Tensor | None) -> None:
        hp, base, joint = self.hp, self.base, self.joint
        san_d = Sanitizer(float(hp.clip), z_noise, base.noise_gen, basis)
        san_c = None if joint else Sanitizer(float(hp.clip), z_noise, base.noise_gen, basis)
        self.san_d, self.san_c = san_d, san_c

    def audited_sanitizers(self) -> dict[str, Sanitizer | None]:
        on_c = self.san_c if self.c_start is not None else None
        return {"sanitizer" if self.joint else "sanitizer.D": self.san_d, "sanitizer.C": on_c}

    def with_c(self, it: int) -> bool:
        return self.c_start is not None and it >= self.c_start

    def classifier_note(self) -> str:
        return "" if self.c_start is None else f" ({describe_classifier(self.hp, float(self.hp.lr))})"

    def release_paths(self, it: int) -> tuple[float, ...]:
        # D, and C from t_c with per-path sanitisers (official code): noise 2Cz per row, sensitivity 2C per row;
        # one path when the gradient of β·D + (1−β)·C is sanitised at once (Eq. 9)
        zp, with_c, joint = self.zp, self.with_c(it), self.joint
        paths = (zp, zp) if with_c and not joint else (zp,)
        return paths

    def partition_phase(self, it: int, k: torch.Tensor, xr: torch.Tensor, yr: torch.Tensor) -> None:
        self.clfs = None
        if self.with_c(it):
            hp, base = self.hp, self.base
            self.clfs = classifier_phase(base.clf, base.parts, k, self.x_all, self.y_all, self.fake, hp, self.ncls,
                                         bool(hp.classifier.reinit) or it == self.c_start, base.clf_init,
                                         float(hp.lr), tuple(hp.betas), base.init_gen, base.data_gen)

    def generator_step(self, it: int, k: torch.Tensor) -> torch.Tensor:
        b, clfs = self.base, self.clfs if self.with_c(it) else None
        kept = clfs is b.clf  # reinit=false: the one kept classifier (member 0) for the one partition
        c_idx = None if clfs is None or kept else torch.arange(k.shape[0], device=k.device)
        return generator_step(b.g_net, b.opt_g, b.disc, clfs, k, self.san_d, self.san_c, self.beta,
                              self.B, self.ncls, b.gen_gen, scale=self.per_iter, clf_members=c_idx,
                              c_score=self.c_score)


def train(hp: DictConfig, data: ImageDataset, ledger: PrivacyLedger, run: Run) -> ResNetGenerator:
    """``method=dpac``: GS-WGAN's loop with DPAC's classifier (with β = 1 or the classifier off: GS-WGAN)."""
    return Dpac(hp, data, ledger, run).train()
