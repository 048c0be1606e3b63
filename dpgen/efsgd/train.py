"""EFSGD (Ma & Zhang): DP-GAN-DPAC + error-feedback sanitisation, noise injection and a reconstruction loss.

Built on :mod:`dpgen.dpac` (generator, discriminator ensemble and pre-training, classifier,
sanitiser, both accounting modes). One generator iteration (Alg. 2):

1. draw partition k ~ U[1, K]; ``critic_iters`` WGAN-GP steps of D_k on batches of partition k;
2. (``recon``) ``encoder.steps`` steps of the partition's encoder E_k on D's last real batch
   (x, y) — "the same samples and labels as the discriminator" — minimising
   ‖G(u(x, y)) − x‖² + kl·½‖μ‖² with G fixed;
3. (from t_c, λ_c > 0) DPAC's classifier: re-initialised, n_f fake then n_r real steps;
4. G descends Eq. 15, −D_k(G(z, y)) − λ_c·C(G(z, y), y) + γ_recon·‖G(u) − x‖², where every
   data-dependent gradient w.r.t. G's output goes through its own :class:`ErrorFeedbackSanitizer`
   (e_d, e_c, e_e) and λ_c, γ_recon weight the *sanitised* gradients (post-processing).

Reconstruction privacy. G's parameter gradient on the reconstruction path is J_θG(u)ᵀ·g̃: the
Jacobian is evaluated at u, which depends on the private (x, y). Sanitising g alone (as the paper
describes) therefore leaks u. ``encoder.code=private`` (default) releases u through a Gaussian
mechanism — u = clip([μ(x), onehot(y)], C_z) + N(0, (2·C_z·z)²) — recorded as a further path in
the same sampled event; ``encoder.code=raw`` feeds the exact [μ(x), onehot(y)] as the paper does and
is allowed only with ``privacy.accounting=paper``.

Nothing but the EMA generator is released: D_k, C, E_k, the latent codes and the error states
stay in this function and in the private checkpoint.
"""
from __future__ import annotations

import logging
import math
from functools import partial

import torch
from omegaconf import DictConfig

from dpgen.audit.hooks import SanitizerCanaries
from dpgen.core.run import Run
from dpgen.data.base import ImageDataset
from dpgen.data.torch_utils import image_train_tensors
from dpgen.dpac.accounting import paper_max_iters
from dpgen.dpac.classifier import ORDERS
from dpgen.ensemble import NetStack
from dpgen.dpac.nets import clf_forward, disc_forward
from dpgen.nets.spectral import power_iteration, sn_init
from dpgen.dpac.nets import onehot
from dpgen.dpac.train import (PRETRAIN_NOTE, EnsembleSetup, IterationBudget, check_classifier_reuse,
                              check_ensemble_hparams, classifier_phase, critic_phase, ema_update,
                              refresh_phase)
from dpgen.dpac.train import plan_noise as dpac_plan_noise
from dpgen.efsgd.accounting import ENTRY, iteration_entries, paper_epsilon_fn, paths_at
from dpgen.efsgd.nets import NoiseInjectionGenerator, enc_forward, enc_init
from dpgen.efsgd.sanitizer import ErrorFeedbackSanitizer, ef_noise_std, row_sensitivity
from dpgen.errors import DpgenError
from dpgen.privacy import PrivacyLedger, clip_rows
from dpgen.privacy.randomness import SecretGenerator, gaussian_noise
from dpgen.privacy.sampling import uniform_member

log = logging.getLogger("dpgen")

CODES = ("private", "raw")
EFSGD_NOTE = (
    "efsgd: the per-partition encoders E_k (trained without DP, like D_k), the latent codes and the "
    "error-feedback states e_d, e_c, e_e are never released; e holds raw unclipped gradient information "
    "and lives only in memory and in the private checkpoint, never in generator.pt."
)
EF_NOTE = (
    "error feedback (EFSGD Eq. 7-11, DiceSGD): each path releases clip(g, C1) + clip(e[k, y], C2) + noise per "
    "generated sample, with one error state per partition k and class y, so a state used with partition k holds "
    "only partition k's residuals. sound: a record of partition k moves a released row by at most 2*(C1+C2), "
    "the noise std is 2*(C1+C2)*z and the ledger records the Gaussian at z (the same per-partition argument as "
    "for D_k; DiceSGD's theorem is not needed)."
)
EF_PAPER_NOTE = (
    "error feedback, paper: noise std 2*C1*z*sqrt(1+2*C2/C1) as the paper and DiceSGD's code, whose theorem "
    "(proved for DP-SGD on model parameters) charges it as the plain Gaussian at z; the ledger's entries "
    "record std / (2*(C1+C2)), what the per-row sensitivity argument allows, so sound_epsilon stays truthful."
)
CODE_NOTE = (
    "reconstruction: G's Jacobian on the reconstruction path is evaluated at the encoder input u(x, y), so u "
    "is released as clip([mu(x), onehot(y)], C_z) + N(0, (2*C_z*z)^2) and counted as one more path."
)
RAW_CODE_NOTE = (
    "reconstruction with encoder.code=raw (as the paper): G is run at the exact encoder output of private "
    "records and their private labels; only the gradient w.r.t. G's output is sanitised, so the "
    "reconstruction path leaks through G's Jacobian. Not a valid DP guarantee."
)


def check_hparams(hp: DictConfig, n: int, shape: tuple[int, ...], accounting: str) -> None:
    """One-line DpgenErrors for bad user input."""
    check_ensemble_hparams(hp, n, "efsgd")
    if float(hp.clip) <= 0 or float(hp.C2) < float(hp.clip):
        raise DpgenError(f"efsgd needs 0 < clip (C1) <= C2, got clip={hp.clip}, C2={hp.C2}")
    for key in ("sigma_noise", "gamma_recon", "lambda_c"):
        if float(hp[key]) < 0:
            raise DpgenError(f"efsgd.{key} must be >= 0, got {hp[key]}")
    if hp.classifier.order not in ORDERS:
        raise DpgenError(f"efsgd.classifier.order must be one of {', '.join(ORDERS)}, got {hp.classifier.order!r}")
    if hp.encoder.code not in CODES:
        raise DpgenError(f"efsgd.encoder.code must be one of {', '.join(CODES)}, got {hp.encoder.code!r}")
    if int(hp.encoder.steps) < 0 or float(hp.encoder.code_clip) <= 0:
        raise DpgenError("efsgd.encoder.steps must be >= 0 and efsgd.encoder.code_clip > 0")
    if recon_on(hp) and hp.encoder.code == "raw" and accounting == "sound":
        raise DpgenError("efsgd.encoder.code=raw leaks the encoder input through G's Jacobian; "
                         "use privacy.accounting=paper or efsgd.encoder.code=private")
    if len(shape) != 3 or shape[1] > 32 or shape[2] > 32:
        raise DpgenError(f"efsgd generates images up to 32x32; this dataset has shape {shape}")


def classifier_start(hp: DictConfig) -> int | None:
    """t_c, or None when the classifier is off (classifier.enabled=false or λ_c = 0)."""
    if not bool(hp.classifier.enabled) or float(hp.lambda_c) == 0.0:
        return None
    return int(hp.classifier.start)


def recon_on(hp: DictConfig) -> bool:
    return bool(hp.recon) and float(hp.gamma_recon) > 0.0


def plan_noise(hp: DictConfig, ledger: PrivacyLedger, k: int, c_start: int | None, recon: bool,
               private_code: bool) -> float:
    """dpac's noise plan with efsgd's per-iteration entries (the encoder paths and code release count too)."""
    b, t = int(hp.batch_size), int(hp.iters)
    return dpac_plan_noise(hp, ledger, k, c_start,
                           lambda z: iteration_entries(z, k, b, t, c_start, recon, private_code))


def encoder_input(mu: torch.Tensor, y: torch.Tensor, ncls: int, private: bool, code_clip: float, code_std: float,
                  g: SecretGenerator) -> torch.Tensor:
    """G's input on the reconstruction path: [μ, onehot(y)], privatised (clip to C_z + Gaussian noise from the
    secret ``g``) unless raw."""
    u = torch.cat([mu, onehot(y, ncls, mu.dtype)], dim=1)
    if not private:
        return u
    return clip_rows(u, code_clip) + gaussian_noise(u.shape, code_std, g, device=u.device, dtype=u.dtype,
                                                    mechanism="efsgd code release")


def encoder_step(enc: NetStack, k: torch.Tensor, xr: torch.Tensor, yr: torch.Tensor, g_net: NoiseInjectionGenerator,
                 ncls: int, private: bool, code_clip: float, code_std: float, kl: float, lr: float,
                 betas: tuple[float, float], g: torch.Generator, code_gen: SecretGenerator) -> torch.Tensor:
    """One Adam step of E_k on ‖G(u(x, y)) − x‖² + kl·½‖μ‖² (G fixed; its own noise injection on, from ``g``;
    the code's noise, as in the release, from the secret ``code_gen``)."""
    p, u = enc.gather(k)
    u = {n: t for n, t in torch.func.vmap(power_iteration)(p, u).items()}
    for n in u:
        enc.u[n][k] = u[n]
    leaves = {n: t[0].detach().requires_grad_(True) for n, t in p.items()}
    mu = enc_forward(leaves, {n: t[0] for n, t in u.items()}, xr)
    xh = g_net.forward_input(encoder_input(mu, yr, ncls, private, code_clip, code_std, code_gen), g)
    loss = (xh - xr).pow(2).flatten(1).sum(1).mean() + kl * 0.5 * mu.pow(2).sum(1).mean()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    enc.adam_step(k, {n: gr.unsqueeze(0) for n, gr in zip(leaves, grads)}, lr, betas)
    return loss.detach()


def generator_step(g_net: NoiseInjectionGenerator, opt_g: torch.optim.Optimizer, disc: NetStack,
                   clf: NetStack | None, k: torch.Tensor, san: dict[str, ErrorFeedbackSanitizer], b: int, ncls: int,
                   g: torch.Generator, recon: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
                   ) -> torch.Tensor:
    """Eq. 15 through the sanitisers. ``recon`` = (u, x, y): the (released) encoder input, the real batch and
    its labels (which key the reconstruction path's error states). ``k``: the sampled partition.

    Per-sample losses are summed so each sanitiser sees ∂ℓ_i/∂x̂_i; λ_c and γ_recon are the
    sanitisers' ``weight`` (applied after clipping and noise). D_k and C are detached.
    """
    dev = next(g_net.parameters()).device
    y = torch.randint(0, ncls, (b,), generator=g, device=dev)
    u_in = g_net.input_code(g_net.sample_z(b, g, dev), y)
    if recon is not None:  # one forward (one spectral-norm power iteration) for both batches
        u_in = torch.cat([u_in, recon[0].to(u_in.dtype)])
    out = g_net.forward_input(u_in, g)
    x = out[:b]
    p, u = disc.member(k)
    loss = -disc_forward(p, u, san["d"](x, k, y), y).sum()
    if clf is not None:
        pc, uc = clf.member(0)
        loss = loss - clf_forward(pc, uc, san["c"](x, k, y), y).sum()
    if recon is not None:
        loss = loss + (san["e"](out[b:], k, recon[2]) - recon[1]).pow(2).sum()
    opt_g.zero_grad(set_to_none=True)
    loss.backward()
    opt_g.step()
    return loss.detach() / b


def train(hp: DictConfig, data: ImageDataset, ledger: PrivacyLedger, run: Run) -> NoiseInjectionGenerator:
    dev = run.device
    x_all, y_all = image_train_tensors(data, dev, "efsgd")
    n, ncls, shape = len(x_all), data.num_classes, list(data.shape)
    check_hparams(hp, n, tuple(shape), ledger.accounting)
    K, B, T = int(hp.num_discriminators), int(hp.batch_size), int(hp.iters)
    c_start, recon = classifier_start(hp), recon_on(hp)
    check_classifier_reuse(hp, ledger, "efsgd", c_start)
    private_code = hp.encoder.code == "private"
    betas, lr = tuple(hp.betas), float(hp.lr)
    base = EnsembleSetup(hp, data, run, partial(NoiseInjectionGenerator, ncls, shape, int(hp.z_dim),
                                                int(hp.g_width), bool(hp.noise_injection), float(hp.sigma_noise)))
    parts, g_net, g_ema, opt_g = base.parts, base.g_net, base.g_ema, base.opt_g
    data_gen, gen_gen, noise_gen = base.data_gen, base.gen_gen, base.noise_gen
    disc, clf, clf_init_fn = base.disc, base.clf, base.clf_init
    enc = (NetStack(partial(enc_init, shape, int(hp.encoder.width), int(hp.z_dim)), sn_init, K, base.init_gen, dev,
                    shared_init=bool(hp.get("shared_init", False)))
           if recon else None)

    state = run.resume_state["state"] if run.resume_state else None
    z_noise = float(state["noise_multiplier"]) if state else plan_noise(hp, ledger, K, c_start, recon, private_code)
    ef, c1, c2 = bool(hp.error_feedback), float(hp.clip), float(hp.C2)
    rule = "sensitivity" if ledger.accounting == "sound" else "dicesgd"
    san = {name: ErrorFeedbackSanitizer(c1, z_noise, c2, ef, weight, noise_gen, K, ncls, rule)
           for name, weight in (("d", 1.0), ("c", float(hp.lambda_c)), ("e", float(hp.gamma_recon)))}
    # an audit run's canaries: records of the partitions, one channel per sanitiser path (dpgen.audit)
    live = {"d": True, "c": c_start is not None, "e": recon}  # the paths this run releases through
    canaries = SanitizerCanaries.attach(run.audit, K, B, {f"sanitizer.{n}": s for n, s in san.items() if live[n]}
                                        ) if run.audit else None
    zp = z_noise / math.sqrt(B)
    # what one error-feedback path costs: noise std / row sensitivity (= z under the sound rule), from the config
    zp_ef = ef_noise_std(c1, c2, z_noise, ef, rule) / row_sensitivity(c1, c2, ef) / math.sqrt(B)
    if ledger.accounting == "paper":
        ledger.paper_epsilon = paper_epsilon_fn(B, zp / zp_ef if zp_ef > 0 else 1.0)
    notes = [PRETRAIN_NOTE, EFSGD_NOTE]
    if ef:
        notes.append(EF_NOTE if ledger.accounting == "sound" else EF_PAPER_NOTE)
    if recon:
        notes.append(CODE_NOTE if private_code else RAW_CODE_NOTE)
    for note in notes:
        if note not in ledger.notes:
            ledger.notes.append(note)
    code_clip = float(hp.encoder.code_clip)
    code_std = 2.0 * code_clip * z_noise
    base.resume_or_pretrain(state, run, x_all, y_all, hp, ncls)
    if state:
        if enc is not None:
            enc.load_state_dict(state["enc"])
        for name, s in san.items():
            s.load_state_dict(state["errors"][name], dev)
    paper_cap = (paper_max_iters(z_noise, K, B, ledger.delta, ledger.target_epsilon, T)
                 if ledger.accounting == "paper" else T)
    budget = IterationBudget(ledger, ENTRY, K, paper_cap)
    log.info("efsgd: K=%d B=%d T=%d z=%.4f (per path %.4f) noise std %.4f, error_feedback=%s C2=%g, "
             "noise_injection=%s (%g), recon=%s (%s code), classifier from %s, %s accounting", K, B, T, z_noise, zp,
             san["d"].noise_std, ef, c2, bool(hp.noise_injection), float(hp.sigma_noise), recon, hp.encoder.code,
             c_start, ledger.accounting)

    def snapshot() -> dict:
        return {**base.state_dict(), "enc": enc.state_dict() if enc is not None else None,
                "errors": {k: s.state_dict() for k, s in san.items()}, "noise_multiplier": z_noise}

    def fake(m: int, y: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if y is None:
            y = torch.randint(0, ncls, (m,), generator=gen_gen, device=dev)
        with torch.no_grad():
            return g_net(g_net.sample_z(m, gen_gen, dev), y, gen_gen), y

    run.start(T, desc=f"efsgd eps<={ledger.target_epsilon:g}")
    it = run.start_step
    loss_e = torch.full((), float("nan"), device=dev)
    while it < T:
        with_c = c_start is not None and it >= c_start
        # one Gaussian per path (paths_at counts them): D, C from t_c, reconstruction gradient, released code
        paths = (zp_ef,) + (zp_ef,) * with_c + ((zp_ef,) + (zp,) * private_code if recon else ())
        assert len(paths) == paths_at(it, c_start, recon, private_code)
        if not budget.allows(it, paths):
            break
        k = uniform_member(K, data_gen, dev)
        if canaries is not None:
            canaries.start_iteration(k)
        loss_d, xr, yr = critic_phase(disc, parts, k, x_all, y_all, fake, hp, lr, betas, data_gen)
        refresh_phase(disc, parts, it, x_all, y_all, fake, hp, lr, betas, data_gen)
        recon_batch = None
        if recon:  # E_k on D's last real batch (same samples and labels), then the released code
            x_rec, y_rec = xr[0], yr[0]
            for _ in range(int(hp.encoder.steps)):
                loss_e = encoder_step(enc, k, x_rec, y_rec, g_net, ncls, private_code, code_clip, code_std,
                                      float(hp.encoder.kl_weight), lr, betas, gen_gen, noise_gen)
            with torch.no_grad():
                pe, ue = enc.member(k)
                code = encoder_input(enc_forward(pe, ue, x_rec), y_rec, ncls, private_code, code_clip, code_std,
                                     noise_gen)
            recon_batch = (code, x_rec, y_rec)
        if with_c:
            classifier_phase(clf, parts, k, x_all, y_all, fake, hp, ncls, bool(hp.classifier.reinit) or it == c_start,
                             clf_init_fn, lr, betas, base.init_gen, data_gen)
        loss_g = generator_step(g_net, opt_g, disc, clf if with_c else None, k, san, B, ncls, gen_gen,
                                recon_batch)
        budget.record(paths)
        ema_update(g_ema, g_net, float(hp.ema), it)
        it += 1
        scalars = {"loss_d": loss_d.mean(), "loss_g": loss_g}  # tensors: Run syncs them at log time only
        if recon:
            scalars["loss_e"] = loss_e
        run.step_done(it, scalars, snapshot)
    run.finish(it, snapshot())
    return g_ema.eval()
