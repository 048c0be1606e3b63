"""Training loop of the DP-SGD conditional GAN (see package docstring)."""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from opacus import GradSampleModule

from dpgen.audit.hooks import DpsgdCanaries
from dpgen.core.compile import compile_enabled
from dpgen.core.run import Run
from dpgen.data.base import ImageDataset
from dpgen.data.torch_utils import image_train_tensors
from dpgen.dpgan.compiled import GeneratorLoss, PerSampleD, set_grad_samples
from dpgen.errors import DpgenError
from dpgen.nets.dcgan import CondGenerator, ProjectionDiscriminator
from dpgen.privacy import LedgerEntry, PrivacyLedger, calibrate_noise_multiplier
from dpgen.privacy.ghost import GhostClipper
from dpgen.privacy.optimizer import DPSGDOptimizer
from dpgen.privacy.sampling import poisson_batch

log = logging.getLogger("dpgen")
ENTRY = "dpgan.discriminator"


def plan_noise(hp: DictConfig, ledger: PrivacyLedger, q: float, steps: int) -> float:
    """σ of the discriminator's DP-SGD: given, or calibrated so that all planned steps meet ε."""
    if hp.noise_multiplier is not None:
        return float(hp.noise_multiplier)
    return calibrate_noise_multiplier(
        ledger.target_epsilon, ledger.delta,
        lambda z: [LedgerEntry(ENTRY, [z], "poisson", q, count=steps)], base=ledger.entries,
        accountant=ledger.accountant,
    )


def discriminator_step(d_net: GradSampleModule, opt_d: DPSGDOptimizer, x_real: torch.Tensor, y_real: torch.Tensor,
                       x_fake: torch.Tensor, y_fake: torch.Tensor,
                       per_sample: PerSampleD | None = None, ghost: GhostClipper | None = None) -> torch.Tensor:
    """One DP-SGD step of D (Abadi et al. 2016, Alg. 1 lines 5–9) on real + fake rows.

    Real rows come from a Poisson batch; the fake rows have a fixed, data-independent count,
    so adding or removing one record adds or removes one clipped per-sample gradient:
    ℓ2 sensitivity C, noise N(0, σ²C²) added by the DP-SGD optimizer from the secret stream.
    ``per_sample`` (``compile=true`` with ``grad_backend=opacus``): the per-sample gradients from
    :class:`PerSampleD` (compiled torch.func on a padded bucket) instead of opacus' hooks; ``ghost``
    (``grad_backend=ghost``): the per-sample norms and the clipped sum from ghost norms and book-keeping
    (:class:`~dpgen.privacy.ghost.GhostClipper` of ``d_net``'s module). The optimizer's clipping factors and
    noise are the same.
    """
    xb, yb = torch.cat([x_real, x_fake]), torch.cat([y_real, y_fake])
    target = torch.cat([torch.ones(len(x_real), device=xb.device), torch.zeros(len(x_fake), device=xb.device)])
    opt_d.zero_grad(set_to_none=True)
    if ghost is not None:
        rec = ghost.record(lambda: F.binary_cross_entropy_with_logits(ghost.module(xb, yb), target, reduction="none"))
        opt_d.record(rec)
        opt_d.step()
        return rec.losses.sum()
    if per_sample is not None:
        grads, loss = per_sample(xb, yb, target)
        set_grad_samples(opt_d.model_params, grads)
        opt_d.step()
        return loss.detach()
    loss = F.binary_cross_entropy_with_logits(d_net(xb, yb), target, reduction="sum")
    loss.backward()
    opt_d.step()
    return loss.detach()


def generator_loss(g_net: CondGenerator, d_net: torch.nn.Module, batch: int, k: int, ms_weight: float,
                   generator: torch.Generator) -> torch.Tensor:
    """Non-saturating G loss plus the mode-seeking term of Mao et al. 2019 (MSGAN, Eq. 3).

    Two latent codes per label: the term rewards |G(z1,y) − G(z2,y)| / |z1 − z2|, which keeps G
    from ignoring z (per-class mode collapse). It involves G only, so it is free post-processing.
    """
    z, y = generator_draws(g_net, batch, k, generator)
    return generator_loss_at(g_net, d_net, z, y, ms_weight)


def generator_draws(g_net: CondGenerator, batch: int, k: int,
                    generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The G step's latent codes and labels: each label twice, with two codes (the MSGAN pair)."""
    dev = next(g_net.parameters()).device
    half = batch // 2
    y = torch.randint(0, k, (half,), generator=generator, device=dev).repeat(2)
    z = torch.randn(2 * half, g_net.z_dim, generator=generator, device=dev)
    return z, y


def generator_loss_at(g_net: CondGenerator, d_net: torch.nn.Module, z: torch.Tensor, y: torch.Tensor,
                      ms_weight: float) -> torch.Tensor:
    """:func:`generator_loss` for given draws (pure: ``compile=true`` compiles it)."""
    half = z.shape[0] // 2
    x = g_net(z, y)
    loss = F.binary_cross_entropy_with_logits(d_net(x, y), torch.ones(2 * half, device=z.device))
    if ms_weight > 0:
        dx = (x[:half] - x[half:]).abs().flatten(1).mean(1)
        dz = (z[:half] - z[half:]).abs().mean(1)
        loss = loss + ms_weight / ((dx / dz).mean() + 1e-5)
    return loss


def train(hp: DictConfig, data: ImageDataset, ledger: PrivacyLedger, run: Run) -> CondGenerator:
    dev = run.device
    x_all, y_all = image_train_tensors(data, dev, "dpgan")
    n, k, shape = len(x_all), data.num_classes, list(data.shape)
    batch = int(hp.batch_size)
    q = batch / n
    if not 0 < q <= 1:
        raise DpgenError(f"dpgan.batch_size={batch} must be between 1 and N={n}")
    d_steps = int(hp.iters) * int(hp.n_critic)

    g_net = CondGenerator(k, shape, z_dim=int(hp.z_dim), width=int(hp.g_width)).to(dev)
    d_net = GradSampleModule(ProjectionDiscriminator(k, shape, width=int(hp.d_width)).to(dev), loss_reduction="sum")
    opt_g = torch.optim.Adam(g_net.parameters(), lr=float(hp.lr_g), betas=tuple(hp.betas))
    g_sample, g_noise, g_fake = run.secret_rng("sample"), run.secret_rng("noise"), run.rng("fake")

    state = run.resume_state["state"] if run.resume_state else None
    sigma = float(state["sigma"]) if state else plan_noise(hp, ledger, q, d_steps)
    # an audit run's canaries: Poisson-sampled like the records, clipped and noised with them (dpgen.audit)
    canaries = DpsgdCanaries.poisson(run.audit, ENTRY, float(hp.clip), sigma, q) if run.audit else None
    opt_d = DPSGDOptimizer(torch.optim.Adam(d_net.parameters(), lr=float(hp.lr_d), betas=tuple(hp.betas)),
                           noise_multiplier=sigma, max_grad_norm=float(hp.clip), expected_batch_size=batch,
                           loss_reduction="sum", generator=g_noise, canaries=canaries)
    if state:
        g_net.load_state_dict(state["g"])
        d_net._module.load_state_dict(state["d"])
        opt_g.load_state_dict(state["opt_g"])
        opt_d.original_optimizer.load_state_dict(state["opt_d"])
        run.restore_rngs()
    # D's per-sample norms and clipped sum: ghost norms and book-keeping (eager), or opacus' hooks; compile=true
    # compiles G's loss and, for grad_backend=opacus, D's per-sample gradients (torch.func instead of the hooks)
    compiled = compile_enabled()
    ghost = GhostClipper(d_net._module) if str(hp.get("grad_backend", "ghost")) == "ghost" else None
    per_sample = PerSampleD(d_net._module) if compiled and ghost is None else None
    g_loss = GeneratorLoss(generator_loss_at) if compiled else None
    compiled_d = {"per_sample": per_sample} if per_sample else {"ghost": ghost} if ghost else {}  # opacus eager: {}
    if per_sample is not None or ghost is not None:
        d_net.remove_hooks()  # PerSampleD (torch.func refuses opacus' hooks) or the ghost path replace the hooks
    guard = ledger.budget_guard(ENTRY, [sigma], "poisson", q)
    log.info("dpgan: q=%.5f sigma=%.4f clip=%g, %d discriminator steps allowed", q, sigma, hp.clip, guard.remaining)

    def fake(m: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, k, (m,), generator=g_fake, device=dev)
        z = torch.randn(m, g_net.z_dim, generator=g_fake, device=dev)
        return g_net(z, y), y

    def snapshot() -> dict:
        return {"g": g_net.state_dict(), "d": d_net._module.state_dict(), "opt_g": opt_g.state_dict(),
                "opt_d": opt_d.original_optimizer.state_dict(), "sigma": sigma}

    run.start(int(hp.iters), desc=f"dpgan eps<={ledger.target_epsilon:g}")
    it = run.start_step
    loss_d = loss_g = torch.zeros((), device=dev)
    while it < int(hp.iters):
        for _ in range(int(hp.n_critic)):
            if not guard.allows():
                break
            idx = poisson_batch(n, q, g_sample, dev)  # one host sync per step (opacus needs a concrete batch)
            with torch.no_grad():
                xf, yf = fake(batch)
            loss_d = discriminator_step(d_net, opt_d, x_all[idx], y_all[idx], xf, yf, **compiled_d)
            guard.step()
        else:
            # Generator step: gradients reach G only through the DP-trained D (post-processing).
            d_net.disable_hooks()
            opt_g.zero_grad(set_to_none=True)
            if g_loss is None:
                loss_g = generator_loss(g_net, d_net, batch, k, float(hp.mode_seeking), g_fake)
            else:
                z, y = generator_draws(g_net, batch, k, g_fake)
                loss_g = g_loss(g_net, d_net._module, z, y, float(hp.mode_seeking))
            loss_g.backward()
            opt_g.step()
            if not compiled_d:
                d_net.enable_hooks()
            it += 1
            # tensors: Run converts them to floats only on log steps (no host sync per step)
            run.step_done(it, {"loss_d": loss_d / (2 * batch), "loss_g": loss_g.detach()}, snapshot)
            continue
        log.info("privacy budget reached after %d generator iterations", it)
        break
    run.finish(it, snapshot())
    return g_net.eval()
