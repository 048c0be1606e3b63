"""DPAC's dual-purpose auxiliary classifier C (Alg. 1 lines 3 and 11–20; paper §4.3).

At every generator iteration from t_c on, C is re-initialised (ablation: ``reinit=false`` keeps it)
and trained *sequentially*: n_f steps on fake samples, then n_r steps on real samples of the
currently sampled discriminator's partition (one C per sampled partition when several are sampled) (ablation: ``order=parallel`` averages the two losses
in each of max(n_f, n_r) steps). Each step minimises −E[C(x, y)] + λ·E[(‖∇ₓC(x, y)‖ − 1)²] + ε·E[C(x, y)²],
the gradient penalty taken at x itself and the drift ε = 1e-3 as in the official code. C is never released; its only path to
G is the sanitised gradient (see :mod:`dpgen.gswgan.sanitizer`).

Research option ``classifier.loss=ce`` (not in the papers): C maximises its log-probability of y instead (cross-entropy,
no penalty; :data:`dpgen.gswgan.nets.CLF_SCORES`), and G's C path ascends the same score. The papers' class score
is linear in the logits, so a re-initialised C trained for a few steps barely ranks the classes (on real F-MNIST,
20 Adam steps of 64 images: test accuracy 0.11–0.22 at any rate tried; cross-entropy: 0.61–0.67;
:mod:`dpgen.dpac.classifier_probe`).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.func import grad

from dpgen.ensemble import NetStack, functional_step
from dpgen.gswgan.nets import CLF_SCORES, Params, clf_forward

Batch = Callable[[], tuple[torch.Tensor, torch.Tensor]]
ORDERS = ("sequential", "parallel")
LOSSES = tuple(CLF_SCORES)


def classifier_lr(hp, lr: float) -> float:
    """C's Adam rate: ``classifier.lr``, or ``lr`` (D's, as the papers) when it is null."""
    return lr if hp.classifier.lr is None else float(hp.classifier.lr)


def classifier_real_batch(hp) -> int:
    """Real images per C step: ``classifier.real_batch``, or ``batch_size`` (B, as the papers) when it is null."""
    rb = hp.classifier.get("real_batch")
    return int(hp.batch_size) if rb is None else int(rb)


def describe_classifier(hp, lr: float) -> str:
    """C's score, rate and real batch, for a run's setup line."""
    return (f"{hp.classifier.loss} score, C lr {classifier_lr(hp, lr):g}, "
            f"{classifier_real_batch(hp)} real images per C step")


def classifier_loss(p: Params, u: Params, x: torch.Tensor, y: torch.Tensor, lam: float,
                    drift: float = 0.0, loss: str = "wgan") -> torch.Tensor:
    """−E[C(x, y)] + λ·GP(x) + drift·E[C(x, y)²] (WGAN-style class score, official ClassifierDCGAN and main.py);
    ``loss="ce"``: the cross-entropy −E[log p_C(y | x)] alone."""
    if loss == "ce":
        return -CLF_SCORES["ce"](p, u, x, y).mean()
    gx = grad(lambda z: clf_forward(p, u, z, y).sum())(x)
    gp = ((gx.flatten(1).norm(dim=1) - 1) ** 2).mean()
    score = clf_forward(p, u, x, y)
    return -score.mean() + lam * gp + drift * (score ** 2).mean()


def train_classifier(clf: NetStack, fake: Batch, real: Batch, n_fake: int, n_real: int, order: str, lam: float,
                     lr: float, betas: tuple[float, float], drift: float = 0.0, stacked: bool = False,
                     loss: str = "wgan") -> list[str]:
    """Train C in place; returns the sequence of phases run ("fake"/"real"/"both"), for tests and logs.

    ``stacked``: every member of ``clf`` trains at once on its own batches, which ``fake``/``real`` return with a
    leading member dim [M, b, ...]; otherwise ``clf`` has one member and the batches have none."""
    members = torch.arange(len(clf), dtype=torch.long, device=clf.t.device)
    phases: list[str] = []

    def step(objective: Callable[..., torch.Tensor], *xs: torch.Tensor) -> None:
        functional_step(clf, objective, members, *(x if stacked else x.unsqueeze(0) for x in xs), lr=lr, betas=betas,
                        sampled=stacked)  # stacked: one classifier per sampled partition

    single = lambda p, u, x, y: classifier_loss(p, u, x, y, lam, drift, loss)  # noqa: E731
    if order == "sequential":
        for _ in range(n_fake):
            step(single, *fake())
            phases.append("fake")
        for _ in range(n_real):
            step(single, *real())
            phases.append("real")
    elif order == "parallel":
        mixed = lambda p, u, xf, yf, xr, yr: 0.5 * (single(p, u, xf, yf) + single(p, u, xr, yr))  # noqa: E731
        for _ in range(max(n_fake, n_real)):
            xf, yf = fake()
            xr, yr = real()
            step(mixed, xf, yf, xr, yr)
            phases.append("both")
    else:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    return phases
