"""EFSGD (Ma & Zhang): DP-GAN-DPAC + error-feedback sanitisation, noise injection and a reconstruction loss.

Built on :mod:`dpgen.dpac` (generator, discriminator ensemble and pre-training, classifier,
sanitiser, both accounting modes). One generator iteration (Alg. 2):

1. draw the partitions (Poisson at m/K, or one k ~ U[1, K] under paper accounting); ``critic_iters``
   WGAN-GP steps of each sampled D_k on batches of partition k;
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

from dpgen.core.run import Run
from dpgen.data.base import ImageDataset
from dpgen.dpac.classifier import LOSSES, ORDERS, describe_classifier
from dpgen.dpac.method import check_classifier_reuse, classifier_phase
from dpgen.ensemble import NetStack
from dpgen.gswgan.nets import CLF_SCORES, Forward, clf_forward, disc_forward, onehot
from dpgen.gswgan.train import (PRETRAIN_NOTE, GsWgan, check_ensemble_hparams, check_uniform_sampling, member_rows,
                                partition_sampling)
from dpgen.gswgan.train import plan_noise as gswgan_plan_noise
from dpgen.nets.spectral import power_iteration, sn_init
from dpgen.efsgd.accounting import ENTRY, iteration_entries, paper_epsilon_fn, paths_at
from dpgen.efsgd.nets import NoiseInjectionGenerator, enc_forward, enc_init
from dpgen.efsgd.sanitizer import ErrorFeedbackSanitizer, ef_noise_std, row_sensitivity
from dpgen.errors import DpgenError
from dpgen.privacy import PrivacyLedger, clip_rows
from dpgen.privacy.randomness import SecretGenerator, gaussian_noise

log = logging.getLogger("dpgen")

CODES = ("private", "raw", "prior")
SANITIZE = ("joint", "per_path")
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
PRIOR_CODE_NOTE = (
    "reconstruction with encoder.code=prior (Eq. 14 as written, z ~ P_z): G's input on the reconstruction path is "
    "a code from G's prior with a label, both from the public stream, so the Jacobian there releases nothing; "
    "row i's target is a record of the sampled partition with that label (rows without one carry no gradient), "
    "and only the sanitised gradient, one path, depends on the data. The encoder is not used."
)
JOINT_NOTE = (
    "efsgd.sanitize=joint: the per-sample gradient of -D_k - lambda_c*C w.r.t. the generated images (Eq. 15's "
    "first two terms, one batch of images) is released through ONE error-feedback sanitiser, one path with one "
    "error state, as DPAC's Eq. 9; the paper keeps e_d and e_c apart (efsgd.sanitize=per_path)."
)
RAW_CODE_NOTE = (
    "reconstruction with encoder.code=raw (as the paper): G is run at the exact encoder output of private "
    "records and their private labels; only the gradient w.r.t. G's output is sanitised, so the "
    "reconstruction path leaks through G's Jacobian. Not a valid DP guarantee."
)


def check_hparams(hp: DictConfig, n: int, shape: tuple[int, ...], accounting: str) -> None:
    """One-line DpgenErrors for bad user input."""
    check_ensemble_hparams(hp, n, "efsgd")
    if float(hp.clip) <= 0 or float(hp.C2) <= 0:
        raise DpgenError(f"efsgd needs clip (C1) > 0 and C2 > 0, got clip={hp.clip}, C2={hp.C2}")
    if accounting == "paper" and float(hp.C2) < float(hp.clip):  # the paper's (DiceSGD's) noise rule assumes it
        raise DpgenError(f"efsgd needs C2 >= clip (C1) under privacy.accounting=paper (DiceSGD), got clip={hp.clip}, "
                         f"C2={hp.C2}")
    if str(hp.get("sanitize", "per_path")) not in SANITIZE:
        raise DpgenError(f"efsgd.sanitize must be one of {', '.join(SANITIZE)}, got {hp.sanitize!r}")
    for key in ("sigma_noise", "gamma_recon", "lambda_c"):
        if float(hp[key]) < 0:
            raise DpgenError(f"efsgd.{key} must be >= 0, got {hp[key]}")
    if hp.classifier.order not in ORDERS:
        raise DpgenError(f"efsgd.classifier.order must be one of {', '.join(ORDERS)}, got {hp.classifier.order!r}")
    if hp.classifier.loss not in LOSSES:
        raise DpgenError(f"efsgd.classifier.loss must be one of {', '.join(LOSSES)}, got {hp.classifier.loss!r}")
    if hp.encoder.code not in CODES:
        raise DpgenError(f"efsgd.encoder.code must be one of {', '.join(CODES)}, got {hp.encoder.code!r}")
    if str(hp.encoder.get("match", "first")) not in MATCHES:
        raise DpgenError(f"efsgd.encoder.match must be one of {', '.join(MATCHES)}, got {hp.encoder.match!r}")
    if int(hp.encoder.steps) < 0 or float(hp.encoder.code_clip) <= 0:
        raise DpgenError("efsgd.encoder.steps must be >= 0 and efsgd.encoder.code_clip > 0")
    if recon_on(hp) and hp.encoder.code == "raw" and accounting == "sound":
        raise DpgenError("efsgd.encoder.code=raw leaks the encoder input through G's Jacobian; "
                         "use privacy.accounting=paper or efsgd.encoder.code=prior")
    if recon_on(hp) and hp.encoder.code != "prior" and partition_sampling(hp)[0] == "poisson":
        raise DpgenError(f"efsgd.encoder.code={hp.encoder.code} runs G at each sampled partition's own codes, whose "
                         "number Poisson sampling must keep secret; use efsgd.encoder.code=prior or "
                         "efsgd.sampling=uniform (privacy.accounting=paper)")
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
    b, t, m = int(hp.batch_size), int(hp.iters), partition_sampling(hp)[1]
    return gswgan_plan_noise(hp, ledger, k, c_start,
                             lambda z: iteration_entries(z, k, b, t, c_start, recon, private_code, per_iter=m))


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


MATCHES = ("first", "nearest")


def prior_recon_batch(g_net: NoiseInjectionGenerator, xr: torch.Tensor, yr: torch.Tensor, ncls: int,
                      g: torch.Generator, match: str = "first"
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``encoder.code=prior`` (Eq. 14 as written, L_En = E_{z~P_z}‖G(z) − x‖²): G's input on the reconstruction path
    is a code from G's own prior with a label, both drawn from the PUBLIC stream ``g``, so G's Jacobian there
    releases nothing and no code path is needed. For every sampled partition j (``xr``, ``yr`` [M, b, ...]: D_j's
    last real batch), row i's target is a record of partition j's batch with row i's label, if any (mask 0
    otherwise): the first one (``match="first"``), or the one nearest to G's current image G(u_i) (``"nearest"``:
    Eq. 14's x paired with the z it is closest to, so that different codes keep different targets instead of all
    being pulled to one record). Only the gradient depends on the data, and the sanitiser bounds it per partition
    and row. Returns (u [B], targets [M, B, ...], labels [B], mask [M, B]); the labels (public) key the error
    states."""
    b, dev = xr.shape[1], xr.device
    y = torch.randint(0, ncls, (b,), generator=g, device=dev)
    u = g_net.input_code(g_net.sample_z(b, g, dev), y)
    match_ = yr.unsqueeze(1) == y.view(1, -1, 1)  # [member, generated row, real record]
    if match == "nearest":  # G's forward draws its injected noise from g whatever M is (the public stream's count)
        was_training = g_net.training
        g_net.eval()  # no spectral-norm power iteration: choosing the targets leaves G as it is
        try:
            with torch.no_grad():
                xg = g_net.forward_input(u, g).flatten(1)
        finally:
            g_net.train(was_training)
        dist = torch.cdist(xg.unsqueeze(0).expand(xr.shape[0], -1, -1), xr.flatten(2))  # [member, row, record]
        j = dist.masked_fill(~match_, float("inf")).argmin(2)  # the nearest record of the row's class
    else:
        j = match_.to(torch.int8).argmax(2)  # the first real record of the row's class (0 when none: masked)
    targets = torch.gather(xr, 1, j.view(*j.shape, *([1] * (xr.dim() - 2))).expand(-1, -1, *xr.shape[2:]))
    return u, targets, y, match_.any(2).to(xr.dtype)


def generator_step(g_net: NoiseInjectionGenerator, opt_g: torch.optim.Optimizer, disc: NetStack,
                   clf: NetStack | None, k: torch.Tensor, san: dict[str, ErrorFeedbackSanitizer], b: int, ncls: int,
                   g: torch.Generator, recon: tuple[torch.Tensor, ...] | None = None, joint: bool = False,
                   scale: float = 1.0, clf_members: torch.Tensor | None = None,
                   c_score: Forward = clf_forward) -> torch.Tensor:
    """Eq. 15 through the sanitisers, for every sampled partition (``k``: M members of ``disc``; the classifier of
    member j is row ``clf_members[j]`` of ``clf``, default row 0; ``c_score``: C's score, ``classifier.loss``). ``recon`` = (u, targets [M, B, ...], y[, mask
    [M, B]]): G's input on the reconstruction path (released or public), each member's real targets, their
    labels (which key the reconstruction path's error states), and with ``encoder.code=prior`` a 0/1 mask (rows
    without a real record of their class carry no gradient).

    Each sanitiser gets every member's per-sample gradient w.r.t. G's output (:func:`member_rows` for −D and
    −λ_c·C; 2·(G(u) − x) for the reconstruction), clips each, adds the error feedback of the member's partition,
    sums over the members, adds noise and divides by ``scale`` (the expected M) and B
    (:meth:`ErrorFeedbackSanitizer.sanitize_sum`). λ_c and γ_recon are the sanitisers' ``weight`` (applied after
    clipping and noise), except that ``joint`` (``efsgd.sanitize=joint``) releases the per-sample gradient of
    −D − λ_c·C through the D sanitiser once (Eq. 15's first two terms, as DPAC's Eq. 9), with one error state.
    """
    dev = next(g_net.parameters()).device
    members = torch.as_tensor(k, device=dev).reshape(-1)
    m = members.shape[0]
    y = torch.randint(0, ncls, (b,), generator=g, device=dev)
    u_in = g_net.input_code(g_net.sample_z(b, g, dev), y)
    if recon is not None:  # one forward (one spectral-norm power iteration) for both batches
        u_in = torch.cat([u_in, recon[0].to(u_in.dtype)])
    out = g_net.forward_input(u_in, g)
    x = out[:b]
    d_term = (disc, disc_forward, members, 1.0)
    c_term = None
    if clf is not None:
        c_idx = torch.zeros_like(members) if clf_members is None else clf_members
        c_term = (clf, c_score, c_idx, san["c"].weight if joint else 1.0)
    if c_term is not None and joint:  # λ_c weights C's gradient BEFORE the one sanitiser clips the sum
        rows, loss = member_rows(x, y, [d_term, c_term])
        release = san["d"].sanitize_sum(rows, members, y, scale)
    else:
        rows, loss = member_rows(x, y, [d_term])
        release = san["d"].sanitize_sum(rows, members, y, scale)
        if c_term is not None:
            rows_c, loss_c = member_rows(x, y, [c_term])
            release, loss = release + san["c"].sanitize_sum(rows_c, members, y, scale), loss + loss_c
    grads = [release]
    if recon is not None:
        xg = out[b:].detach()
        diff = xg.unsqueeze(0) - recon[1][:m]  # [M, B, ...]: G(u) − x for every member's targets
        if len(recon) > 3:  # encoder.code=prior: the row mask
            diff = diff * recon[3][:m].view(*recon[3][:m].shape, *([1] * (diff.dim() - 2)))
        grads.append(san["e"].sanitize_sum(2.0 * diff, members, recon[2], scale))
        loss = loss + diff.pow(2).sum()
    opt_g.zero_grad(set_to_none=True)
    out.backward(torch.cat(grads).to(out.dtype))
    opt_g.step()
    return loss / (b * float(scale))


class Efsgd(GsWgan):
    """EFSGD through GS-WGAN's extension points (module docstring): the noise-injection generator, the
    per-partition encoders E_k and error states (extra per-partition state), the reconstruction path and the
    released code (extra release paths), λ_c·C and γ_recon·‖G(u) − x‖² (extra loss paths)."""

    name = "efsgd"
    prefix = "efsgd"
    entry = ENTRY
    data_name = "efsgd"

    def __init__(self, hp: DictConfig, data: ImageDataset, ledger: PrivacyLedger, run: Run) -> None:
        super().__init__(hp, data, ledger, run)
        self.c_start, self.recon = classifier_start(hp), recon_on(hp)
        self.private_code = hp.encoder.code == "private"
        self.prior_code = hp.encoder.code == "prior"  # a public code: no encoder, no code path
        self.joint = str(hp.get("sanitize", "per_path")) == "joint"  # D and λ_c·C through one sanitiser
        self.ef, self.c1, self.c2 = bool(hp.error_feedback), float(hp.clip), float(hp.C2)
        self.rule = "sensitivity" if ledger.accounting == "sound" else "dicesgd"

    @property
    def c_score(self) -> Forward:  # type: ignore[override]
        """C's score in G's loss (``classifier.loss``)."""
        return CLF_SCORES[str(self.hp.classifier.loss)]

    def check(self, n: int, shape: tuple[int, ...]) -> None:
        check_hparams(self.hp, n, shape, self.ledger.accounting)
        check_uniform_sampling(self.hp, self.ledger, "efsgd")
        check_classifier_reuse(self.hp, self.ledger, "efsgd", self.c_start)

    def make_generator(self) -> NoiseInjectionGenerator:
        hp = self.hp
        return NoiseInjectionGenerator(self.ncls, self.shape, int(hp.z_dim), int(hp.g_width), bool(hp.noise_injection),
                                       float(hp.sigma_noise))

    def fake(self, m: int, y: torch.Tensor | None = None,
             g: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        g_net, dev = self.base.g_net, self.run.device
        gen = self.base.gen_gen if g is None else g
        if y is None:
            y = torch.randint(0, self.ncls, (m,), generator=gen, device=dev)
        with torch.no_grad():
            return g_net(g_net.sample_z(m, gen, dev), y, gen), y

    def build_state(self) -> None:
        hp, base = self.hp, self.base
        self.enc = (NetStack(partial(enc_init, self.shape, int(hp.encoder.width), int(hp.z_dim)), sn_init, self.K,
                             base.init_gen, self.run.device, shared_init=bool(hp.get("shared_init", False)))
                    if self.recon and not self.prior_code else None)
        self.loss_e = torch.full((), float("nan"), device=self.run.device)

    def plan_entries(self, z: float) -> list:
        return iteration_entries(z, self.K, self.B, self.T, self.c_path_start, self.recon, self.private_code,
                                 per_iter=self.per_iter)

    @property
    def c_path_start(self) -> int | None:
        """When C's gradient becomes a release path of its own: t_c per path, never when joint (it is in D's)."""
        return None if self.joint else self.c_start

    def setup_ledger(self, z_noise: float) -> None:
        ledger, ef, c1, c2 = self.ledger, self.ef, self.c1, self.c2
        # what one error-feedback path costs: noise std / row sensitivity (= z under the sound rule), from the config
        self.zp_ef = ef_noise_std(c1, c2, z_noise, ef, self.rule) / row_sensitivity(c1, c2, ef) / math.sqrt(self.B)
        zp, zp_ef = self.zp, self.zp_ef
        if ledger.accounting == "paper":
            ledger.paper_epsilon = paper_epsilon_fn(self.B, zp / zp_ef if zp_ef > 0 else 1.0, self.per_iter)
        notes = [PRETRAIN_NOTE, EFSGD_NOTE]
        if ef:
            notes.append(EF_NOTE if ledger.accounting == "sound" else EF_PAPER_NOTE)
        if self.joint and self.c_start is not None:
            notes.append(JOINT_NOTE)
        if self.recon:
            notes.append(CODE_NOTE if self.private_code else PRIOR_CODE_NOTE if self.prior_code else RAW_CODE_NOTE)
        for note in notes:
            if note not in ledger.notes:
                ledger.notes.append(note)
        self.code_clip = float(self.hp.encoder.code_clip)
        self.code_std = 2.0 * self.code_clip * z_noise

    def build_sanitizers(self, z_noise: float, basis: torch.Tensor | None) -> None:
        hp, K, ncls, ef, c1, c2, rule = self.hp, self.K, self.ncls, self.ef, self.c1, self.c2, self.rule
        noise_gen = self.base.noise_gen
        san = {name: ErrorFeedbackSanitizer(c1, z_noise, c2, ef, weight, noise_gen, K, ncls, rule)
               for name, weight in (("d", 1.0), ("c", float(hp.lambda_c)), ("e", float(hp.gamma_recon)))}
        self.san = san

    def audited_sanitizers(self) -> dict[str, ErrorFeedbackSanitizer | None]:
        # the paths this run releases through (C's own only per path; E's with the reconstruction)
        live = {"d": True, "c": self.c_path_start is not None, "e": self.recon}
        return {f"sanitizer.{n}": s for n, s in self.san.items() if live[n]}

    def load_state_dict(self, state: dict) -> None:
        if self.enc is not None:
            self.enc.load_state_dict(state["enc"])
        for name, s in self.san.items():
            s.load_state_dict(state["errors"][name], self.run.device)

    def state_dict(self) -> dict:
        return {"enc": self.enc.state_dict() if self.enc is not None else None,
                "errors": {k: s.state_dict() for k, s in self.san.items()}}

    def describe(self, z_noise: float, basis: torch.Tensor | None) -> str:
        hp = self.hp
        return (f"efsgd: K={self.K} B={self.B} T={self.T} z={z_noise:.4f} (per path {self.zp:.4f}) noise std "
                f"{self.san['d'].noise_std:.4f}, error_feedback={self.ef} C2={self.c2:g}, noise_injection="
                f"{bool(hp.noise_injection)} ({float(hp.sigma_noise):g}), recon={self.recon} ({hp.encoder.code} code), "
                f"classifier from {self.c_start}"
                f"{'' if self.c_start is None else f' ({describe_classifier(hp, float(hp.lr))})'}, "
                f"{self.ledger.accounting} accounting")

    def with_c(self, it: int) -> bool:
        return self.c_start is not None and it >= self.c_start

    def release_paths(self, it: int) -> tuple[float, ...]:
        # one Gaussian per path (paths_at counts them): D, C from t_c, reconstruction gradient, released code
        zp, zp_ef, recon, private_code = self.zp, self.zp_ef, self.recon, self.private_code
        c_path = self.with_c(it) and not self.joint
        paths = (zp_ef,) + (zp_ef,) * c_path + ((zp_ef,) + (zp,) * private_code if recon else ())
        assert len(paths) == paths_at(it, self.c_path_start, recon, private_code)
        return paths

    def partition_phase(self, it: int, k: torch.Tensor, xr: torch.Tensor, yr: torch.Tensor) -> None:
        hp, base, ncls = self.hp, self.base, self.ncls
        lr, betas = float(hp.lr), tuple(hp.betas)
        self.recon_batch, self.clfs = None, None
        if self.recon and self.prior_code:  # Eq. 14 as written: a public code from G's prior
            self.recon_batch = prior_recon_batch(base.g_net, xr, yr, ncls, base.gen_gen,
                                                 str(hp.encoder.get("match", "first")))
        elif self.recon:  # E_k on D's last real batch (same samples and labels), then the released code
            # one partition per iteration here (check_hparams: a private or raw code needs sampling=uniform)
            enc, private_code, code_clip, code_std = self.enc, self.private_code, self.code_clip, self.code_std
            x_rec, y_rec = xr[0], yr[0]
            for _ in range(int(hp.encoder.steps)):
                self.loss_e = encoder_step(enc, k, x_rec, y_rec, base.g_net, ncls, private_code, code_clip, code_std,
                                           float(hp.encoder.kl_weight), lr, betas, base.gen_gen, base.noise_gen)
            with torch.no_grad():
                pe, ue = enc.member(k)
                code = encoder_input(enc_forward(pe, ue, x_rec), y_rec, ncls, private_code, code_clip, code_std,
                                     base.noise_gen)
            self.recon_batch = (code, x_rec.unsqueeze(0), y_rec)
        if self.with_c(it):
            self.clfs = classifier_phase(base.clf, base.parts, k, self.x_all, self.y_all, self.fake, hp, ncls,
                                         bool(hp.classifier.reinit) or it == self.c_start, base.clf_init, lr, betas,
                                         base.init_gen, base.data_gen)

    def generator_step(self, it: int, k: torch.Tensor) -> torch.Tensor:
        b, clfs = self.base, self.clfs if self.with_c(it) else None
        c_idx = None if clfs is None or clfs is b.clf else torch.arange(k.shape[0], device=k.device)
        return generator_step(b.g_net, b.opt_g, b.disc, clfs, k, self.san, self.B, self.ncls, b.gen_gen,
                              self.recon_batch, self.joint, scale=self.per_iter, clf_members=c_idx,
                              c_score=self.c_score)

    def scalars(self) -> dict:
        return {"loss_e": self.loss_e} if self.recon and not self.prior_code else {}


def train(hp: DictConfig, data: ImageDataset, ledger: PrivacyLedger, run: Run) -> NoiseInjectionGenerator:
    """``method=efsgd``: DPAC (GS-WGAN's loop + the classifier) with error feedback, reconstruction and noise
    injection, through :class:`Efsgd`'s extension points."""
    return Efsgd(hp, data, ledger, run).train()
