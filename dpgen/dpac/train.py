"""GS-WGAN (Chen et al. 2020) and DP-GAN-DPAC (Chen et al. CVPR'23, Alg. 1) training loop.

Privacy structure. The training set is split into K disjoint partitions, one per discriminator.
The discriminators (and DPAC's classifier C) are trained WITHOUT DP — first pre-trained on their
own partitions, then updated whenever they are sampled — and are never released: they are the
"teachers". What leaves them is only ∇_{G(z)} L_G, which the :class:`Sanitizer` clips per sample
and noises before it reaches G (paper eq. 9). The DP guarantee therefore covers exactly the
sequence of sanitised gradients (and G, its post-processing): each generator iteration is one
event at rate 1/K (the sampled partition), recorded in the ledger (see :mod:`dpgen.dpac.accounting`).
"""
from __future__ import annotations

import copy
import logging
import math
import time
from functools import partial
from typing import Callable

import torch
from omegaconf import DictConfig

from dpgen.audit.hooks import SanitizerCanaries
from dpgen.core.dist import SINGLE, Dist
from dpgen.core.run import Run
from dpgen.data.base import ImageDataset
from dpgen.data.partition import partition_by_record
from dpgen.data.torch_utils import image_train_tensors
from dpgen.dpac.accounting import (ENTRY, iteration_entries, paper_epsilon_fn, paper_max_iters,
                                   paper_noise_multiplier)
from dpgen.dpac.classifier import ORDERS, train_classifier
from dpgen.dpac.ensemble import GeneratorStack, critic_step
from dpgen.ensemble import NetStack, batched_forward
from dpgen.dpac.nets import ResNetGenerator, clf_forward, clf_init, disc_forward, disc_init
from dpgen.nets.dct import dct_basis
from dpgen.nets.spectral import sn_init
from dpgen.dpac.sanitizer import Sanitizer
from dpgen.errors import DpgenError
from dpgen.privacy import PrivacyLedger, calibrate_noise_multiplier
from dpgen.privacy.randomness import SecretGenerator, derive_seed, require_secret
from dpgen.privacy.sampling import uniform_member

log = logging.getLogger("dpgen")

PRETRAIN_NOTE = (
    "dpac/gswgan: the K discriminators (and the auxiliary classifier C) are trained without DP on their "
    "own disjoint partitions (pre-training and during training) and are never released; only the "
    "per-sample clipped and noised gradients w.r.t. the generated images (the sanitiser) reach the "
    "generator, so the accounting covers exactly those releases (GS-WGAN, Chen et al. 2020, Sec. 3)."
)
SOUND_NOTE = (
    "sound: each generator iteration is one event sampled at rate 1/K (the uniformly drawn partition) "
    "releasing B per-sample gradients per path (one path with dpac.sanitize=joint, Eq. 9: the gradient of "
    "beta*D + (1-beta)*C; per_path: D, and C once active), each clipped to C with noise std "
    "2*C*z; joint L2 sensitivity 2C*sqrt(P*B), so noise multiplier z/sqrt(B) per path (sigma_eff z/sqrt(P*B)). "
    "The partition draw is modelled as Poisson subsampling at 1/K (add/remove-one)."
)
PAPER_NOTE = (
    "paper: GS-WGAN's privacy_analysis.py (autodp) composes B*T subsampled Gaussians with multiplier z, "
    "sampled without replacement at 1/K (REPLACE_ONE, Mironov RDP->DP conversion): 9.99 for z=1.07, K=1000, "
    "T=20000, B=32, delta=1e-5. It treats the B gradients of one iteration as independently subsampled "
    "although all come from the same sampled discriminator, and DPAC's official accountant ignores the C "
    "path; the sound epsilon (sound_epsilon) is therefore far larger. Not a valid DP guarantee."
)


def check_ensemble_hparams(hp: DictConfig, n: int, prefix: str) -> None:
    """One-line DpgenErrors for the GS-WGAN keys that dpac and efsgd share (``prefix`` = config key)."""
    if not 1 <= int(hp.num_discriminators) <= n:
        raise DpgenError(f"{prefix}.num_discriminators={hp.num_discriminators} must be between 1 and N={n}")
    for key in ("iters", "batch_size", "critic_iters"):
        if int(hp[key]) < 1:
            raise DpgenError(f"{prefix}.{key} must be >= 1, got {hp[key]}")
    if hp.noise_multiplier is not None and float(hp.noise_multiplier) <= 0:
        raise DpgenError(f"{prefix}.noise_multiplier must be > 0 or null, got {hp.noise_multiplier}")
    if int(hp.pretrain_iters) < 0 or int(hp.pretrain_chunk) < 1:
        raise DpgenError(f"{prefix}.pretrain_iters must be >= 0 and {prefix}.pretrain_chunk >= 1")


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
    if KEPT_CLASSIFIER_NOTE not in ledger.notes:
        ledger.notes.append(KEPT_CLASSIFIER_NOTE)


def check_hparams(hp: DictConfig, n: int, shape: tuple[int, ...]) -> None:
    """One-line DpgenErrors for bad user input."""
    check_ensemble_hparams(hp, n, "dpac")
    if not 0.0 <= float(hp.beta) <= 1.0:
        raise DpgenError(f"dpac.beta={hp.beta} must be in [0, 1]")
    if hp.classifier.order not in ORDERS:
        raise DpgenError(f"dpac.classifier.order must be one of {', '.join(ORDERS)}, got {hp.classifier.order!r}")
    if len(shape) != 3 or shape[1] > 32 or shape[2] > 32:
        raise DpgenError(f"dpac/gswgan generate images up to 32x32; this dataset has shape {shape}")
    basis, d = hp.get("grad_basis"), math.prod(shape)
    if basis is not None and not 1 <= int(basis) <= d:
        raise DpgenError(f"dpac.grad_basis={basis} must be between 1 and the image size {d} (or null)")


def sanitizer_basis(hp: DictConfig, shape: list[int], device: torch.device) -> torch.Tensor | None:
    """U for :class:`Sanitizer`: the ``grad_basis`` lowest 2-D DCT atoms of the image (public, data-independent),
    or None (``grad_basis: null``, the papers: every pixel of the gradient is released)."""
    n = hp.get("grad_basis")
    return None if n is None else dct_basis(tuple(shape), int(n), device)


def generator_lr(hp: DictConfig) -> float:
    """Adam learning rate of G: ``g_lr`` when set, else the shared ``lr`` (the paper uses 1e-4 for all).

    profile=quick raises it because its few hundred CPU iterations are otherwise too few for G to
    become class-conditional even without noise (measured: r2g ~0.10 after 200 noise-free iterations at 1e-4).
    """
    g_lr = hp.get("g_lr")
    return float(hp.lr if g_lr is None else g_lr)


def classifier_start(hp: DictConfig) -> int | None:
    """t_c, or None when C is off (GS-WGAN baseline: β = 1 or classifier.enabled = false)."""
    if not bool(hp.classifier.enabled) or float(hp.beta) >= 1.0:
        return None
    return int(hp.classifier.start)


def plan_noise(hp: DictConfig, ledger: PrivacyLedger, k: int, c_start: int | None,
               entries: Callable[[float], list] | None = None) -> float:
    """Per-sample noise multiplier z: given, or calibrated so all ``iters`` iterations meet the target ε.

    ``entries(z)`` gives the ledger entries of all iterations at z (default: dpac's
    :func:`iteration_entries`; efsgd passes its own, which also count the encoder paths).
    """
    if hp.noise_multiplier is not None:
        return float(hp.noise_multiplier)
    b, t = int(hp.batch_size), int(hp.iters)
    if ledger.accounting == "paper":
        return paper_noise_multiplier(k, b, t, ledger.delta, ledger.target_epsilon)
    if entries is None:
        def entries(z: float) -> list:
            return iteration_entries(z, k, b, t, c_start)
    return calibrate_noise_multiplier(ledger.target_epsilon, ledger.delta, entries,
                                      base=ledger.entries, accountant=ledger.accountant)


class Partitions:
    """Uniform batches (with replacement) from chosen partitions, vectorised over members.

    The records of partition k are ``record_owners(x, K, seed)``'s (a keyed hash of each record's bytes with the
    PUBLIC seed): the GS-WGAN/PATE arguments need the parts disjoint and each record's part independent of the
    other records, not secret; what they need secret is which partition an iteration draws and the noise
    (docs/privacy.md, "Partitions are public").
    """

    def __init__(self, parts: list, device: torch.device) -> None:
        self.sizes = torch.tensor([len(p) for p in parts], device=device)
        mat = torch.zeros(len(parts), int(self.sizes.max()), dtype=torch.long)
        for i, p in enumerate(parts):
            mat[i, :len(p)] = torch.as_tensor(p)
        self.mat = mat.to(device)

    def sample(self, members: torch.Tensor, b: int, g: SecretGenerator) -> torch.Tensor:
        """b record indices of each member's partition (rows of the result), drawn from the secret ``g``."""
        require_secret(g, "partition batch sampling")
        pos = (torch.rand(len(members), b, generator=g, device=self.mat.device) * self.sizes[members, None]).long()
        return self.mat[members[:, None], pos]


@torch.no_grad()
def ema_update(ema: torch.nn.Module, net: torch.nn.Module, decay: float, step: int) -> None:
    """The official ``exp_mov_avg``: decay min(1 − 1/(step + 1), ``decay``) (a warm-up: the average starts at G
    itself), over the parameters; the spectral-norm vectors (buffers here) are copied from G."""
    rate = 1.0 - min(1.0 - 1.0 / (step + 1), decay)
    for pe, p in zip(ema.parameters(), net.parameters()):
        pe.lerp_(p, rate)
    for be, b in zip(ema.buffers(), net.buffers()):
        be.copy_(b)


def pretrain(disc: NetStack, parts: Partitions, x_all: torch.Tensor, y_all: torch.Tensor,
             make_gen: Callable[[], torch.nn.Module], hp: DictConfig, g: SecretGenerator, num_classes: int,
             seed: int = 0, dist: Dist = SINGLE) -> None:
    """Non-private warm start of every discriminator on its own partition (official ``pretrain.py``).

    ``pretrain_iters`` counts warm-up GENERATOR iterations, each after ``critic_iters`` critic steps, as the
    official code (2000 × 5 critic steps for MNIST). Every discriminator plays against its OWN warm-up generator
    (as the authors', one per D): a generator shared by several discriminators learns from all of them and
    would carry every partition of the chunk into each D_k, voiding the per-partition sensitivity. Chunks of
    ``pretrain_chunk`` (D, G) pairs train at once: the discriminators as a :class:`NetStack`, the generators as
    a :class:`GeneratorStack`. The warm-up generators are thrown away; the critic fakes carry the real batch's
    labels (official code).

    Chunk c draws its batches from the secret ``g.fork(c)`` and initialises its warm-up generators from the
    public (``seed``, c), so a chunk's result does not depend on which process trains it: ``dist`` splits the
    chunks over the ranks (a contiguous block each, issue 25), and the ranks then exchange their blocks so that
    every rank holds the whole pre-trained ensemble, as one process would.
    """
    iters, critic, chunk, b = int(hp.pretrain_iters), int(hp.critic_iters), int(hp.pretrain_chunk), int(hp.batch_size)
    dev, lr, betas, shared = x_all.device, float(hp.lr), tuple(hp.betas), bool(hp.get("shared_init", False))
    bounds = [(lo, min(lo + chunk, len(disc))) for lo in range(0, len(disc), chunk)]
    mine = dist.shard(len(bounds))
    t0, done = time.perf_counter(), 0

    for c in mine:
        lo, hi = bounds[c]
        members = torch.arange(lo, hi, device=dev)
        m = len(members)
        gc = g.fork(c)
        with torch.random.fork_rng(devices=[]):  # the warm-up generators are built on the host's global stream
            torch.manual_seed(derive_seed(int(seed), f"pretrain.warmup_generators.{c}"))
            gens = GeneratorStack(make_gen, m, dev, generator_lr(hp), betas, shared_init=shared)
        n_draw = 1 if shared else m  # with shared_init the members also share z, labels and alpha

        def z_draw() -> torch.Tensor:
            return gens.sample_z(b, gc, n_draw).expand(m, -1, -1)

        for _ in range(iters):
            for _ in range(critic):
                idx = parts.sample(members, b, gc)
                xr, yr = x_all[idx], y_all[idx]
                with torch.no_grad():
                    xf = gens(z_draw(), yr)
                alpha = torch.rand(n_draw, b, generator=gc, device=dev).expand(m, -1)
                critic_step(disc, disc_forward, members, xr, yr, xf, yr, alpha, float(hp.gp_weight),
                            float(hp.drift), lr, betas)
            y = torch.randint(0, num_classes, (n_draw, b), generator=gc, device=dev).expand(m, -1)
            gens.step(lambda x: -batched_forward(disc, disc_forward, members, x, y).mean(1).sum(), z_draw(), y)
        done += 1
        per_chunk = (time.perf_counter() - t0) / done  # once per chunk: the log line reads the clock anyway
        log.info("pre-trained discriminators %d..%d (%d warm-up generator iterations x %d critic steps): %d of %d "
                 "chunks done%s, %.1f s per chunk, ETA %.0f s", lo, hi - 1, iters, critic, done, len(mine),
                 f" on rank {dist.rank}" if dist.active else "", per_chunk, per_chunk * (len(mine) - done))
    if dist.active:
        blocks = []
        for r in range(dist.world):
            rs = Dist(r, dist.world).shard(len(bounds))
            blocks.append(range(bounds[rs.start][0], bounds[rs.stop - 1][1]) if len(rs) else range(0))
        dist.share_rows_([*disc.params.values(), *disc.u.values(), *disc.m.values(), *disc.v.values(), disc.t],
                         blocks)


class IterationBudget:
    """Per-iteration privacy bookkeeping shared by dpac/gswgan and efsgd.

    An iteration is one event sampled at rate 1/K holding one Gaussian per sanitised path, each with the
    multiplier (noise std ÷ ℓ2 sensitivity of that path's B rows) given to :meth:`allows`/:meth:`record`.
    Sound accounting: one budget guard per kind of iteration (tuple of multipliers). Paper accounting: stop at
    the paper analysis' cap, still recording the same entries so ``sound_epsilon`` stays truthful.
    """

    def __init__(self, ledger: PrivacyLedger, entry: str, k: int, paper_cap: int) -> None:
        self.ledger, self.entry, self.q, self.paper_cap = ledger, entry, 1.0 / k, paper_cap
        self.guards: dict[tuple[float, ...], object] = {}

    def allows(self, it: int, multipliers: tuple[float, ...]) -> bool:
        if self.ledger.accounting != "sound":
            if it >= self.paper_cap:
                log.info("paper-analysis budget reached after %d generator iterations", it)
                return False
            return True
        if multipliers not in self.guards:
            self.guards[multipliers] = self.ledger.budget_guard(self.entry, list(multipliers), "poisson", self.q)
        if not self.guards[multipliers].allows():
            log.info("privacy budget reached after %d generator iterations", it)
            return False
        return True

    def record(self, multipliers: tuple[float, ...]) -> None:
        if self.ledger.accounting == "sound":
            self.guards[multipliers].step()
        else:
            with self.ledger.sampled_event(self.entry, "poisson", self.q) as ev:
                for z in multipliers:
                    ev.add_gaussian(z)


def critic_phase(disc: NetStack, parts: "Partitions", k: torch.Tensor, x_all: torch.Tensor, y_all: torch.Tensor,
                 fake, hp: DictConfig, lr: float, betas: tuple, g: torch.Generator):
    """Alg. 1 lines 3–8: ``critic_iters`` WGAN-GP steps of the sampled D_k on its own partition.

    Returns the last critic loss and the last real batch (efsgd's encoder reuses it).
    """
    b = int(hp.batch_size)
    for _ in range(int(hp.critic_iters)):
        idx = parts.sample(k, b, g)
        xr, yr = x_all[idx], y_all[idx]
        xf, _ = fake(b, yr[0])  # the fakes carry the real batch's labels (official code)
        alpha = torch.rand(1, b, generator=g, device=xr.device)
        loss_d = critic_step(disc, disc_forward, k, xr, yr, xf.unsqueeze(0), yr, alpha, float(hp.gp_weight),
                             float(hp.drift), lr, betas)
    return loss_d, xr, yr


def refresh_phase(disc: NetStack, parts: "Partitions", it: int, x_all: torch.Tensor, y_all: torch.Tensor,
                  fake, hp: DictConfig, lr: float, betas: tuple, g: torch.Generator) -> None:
    """One critic step for ``refresh_chunk`` discriminators (round robin over all K), each on its own partition,
    against one shared batch of the current G's fakes.

    Not in the papers, where only the sampled D_k trains: with few generator iterations per discriminator (a
    CPU run) the others go stale. It releases nothing and keeps every D_j on partition j alone, so the
    per-partition argument and the ledger are unchanged (G is already public post-processing).
    """
    k = len(disc)
    m = min(int(hp.get("refresh_chunk") or 0), k)
    if m <= 0:
        return
    dev, b = x_all.device, int(hp.batch_size)
    members = (torch.arange(m, device=dev) + it * m) % k
    idx = parts.sample(members, b, g)
    xr, yr = x_all[idx], y_all[idx]
    xf, yf = fake(b)
    alpha = torch.rand(m, b, generator=g, device=dev)
    critic_step(disc, disc_forward, members, xr, yr, xf.expand(m, *xf.shape), yf.expand(m, b), alpha,
                float(hp.gp_weight), float(hp.drift), lr, betas)


def classifier_phase(clf: NetStack, parts: "Partitions", k: torch.Tensor, x_all: torch.Tensor, y_all: torch.Tensor,
                     fake, hp: DictConfig, ncls: int, reset: bool, init_fn, lr: float, betas: tuple,
                     init_gen: torch.Generator, data_gen: SecretGenerator) -> None:
    """DPAC Alg. 1 lines 10–19: (re-)initialise C, then n_f fake and n_r real steps on D_k's partition.

    As the official code, ONE fake batch of ``fake_batch`` samples with balanced labels is drawn per iteration
    and reused by every fake step; each real step draws a fresh batch of partition k (from the secret
    ``data_gen``; C's re-initialisation draws from the public ``init_gen``).
    """
    if reset:
        clf.reset(init_fn, sn_init, init_gen)
    dev, b, cb = x_all.device, int(hp.batch_size), int(hp.classifier.fake_batch)
    fixed = fake(cb, torch.arange(cb, device=dev) % ncls)

    def real_batch() -> tuple[torch.Tensor, torch.Tensor]:
        i = parts.sample(k, b, data_gen)[0]
        return x_all[i], y_all[i]

    train_classifier(clf, lambda: fixed, real_batch, int(hp.classifier.n_fake), int(hp.classifier.n_real),
                     hp.classifier.order, float(hp.gp_weight), lr, betas, float(hp.drift))


class EnsembleSetup:
    """What GS-WGAN/DPAC and EFSGD build identically: the random streams, the K partitions, G with its
    EMA copy and optimiser, the discriminator ensemble and the classifier (in this order, which fixes
    the random initialisation).

    Streams: ``init`` (public: initialisation, C's re-initialisation), ``gen`` (public: G's latents and labels),
    ``data`` (secret: the partition k of an iteration and every batch read from a partition), ``noise``
    (secret: the sanitisers)."""

    def __init__(self, hp: DictConfig, data: ImageDataset, run: Run, make_gen: Callable[[], torch.nn.Module]) -> None:
        dev, ncls, shape = run.device, data.num_classes, list(data.shape)
        self.init_gen, self.gen_gen = run.rng("init"), run.rng("gen")
        self.data_gen, self.noise_gen = run.secret_rng("data"), run.secret_rng("noise")
        self.parts = Partitions(partition_by_record(data.train.x, int(hp.num_discriminators), run.seed), dev)
        # warm-up generators: the plain GS-WGAN architecture (efsgd's noise injection is not needed to warm up D),
        # optionally narrower than G (pretrain_g_width): K of them cost K x G's forward per critic step
        warm_width = hp.get("pretrain_g_width")
        self.make_warmup = partial(ResNetGenerator, ncls, shape, int(hp.z_dim),
                                   int(hp.g_width if warm_width is None else warm_width))
        self.g_net = make_gen().to(dev)
        self.g_ema = copy.deepcopy(self.g_net)
        self.opt_g = torch.optim.Adam(self.g_net.parameters(), lr=generator_lr(hp), betas=tuple(hp.betas))
        self.disc = NetStack(partial(disc_init, ncls, shape, int(hp.d_width)), sn_init, int(hp.num_discriminators),
                             self.init_gen, dev, shared_init=bool(hp.get("shared_init", False)))
        self.clf_init = partial(clf_init, ncls, shape, int(hp.d_width))
        self.clf = NetStack(self.clf_init, sn_init, 1, self.init_gen, dev)

    def state_dict(self) -> dict:
        return {"g": self.g_net.state_dict(), "g_ema": self.g_ema.state_dict(), "opt_g": self.opt_g.state_dict(),
                "disc": self.disc.state_dict(), "clf": self.clf.state_dict()}

    def resume_or_pretrain(self, state: dict | None, run: Run, x_all: torch.Tensor, y_all: torch.Tensor,
                           hp: DictConfig, ncls: int) -> None:
        """Restore a checkpoint's networks and RNG streams, or pre-train the discriminators (fresh run)."""
        if state:
            for key, obj in (("g", self.g_net), ("g_ema", self.g_ema), ("opt_g", self.opt_g), ("disc", self.disc),
                             ("clf", self.clf)):
                obj.load_state_dict(state[key])
            run.restore_rngs()
        else:
            pretrain(self.disc, self.parts, x_all, y_all, self.make_warmup, hp, self.data_gen, ncls, seed=run.seed,
                     dist=run.dist)


def train(hp: DictConfig, data: ImageDataset, ledger: PrivacyLedger, run: Run) -> ResNetGenerator:
    dev = run.device
    x_all, y_all = image_train_tensors(data, dev, "dpac/gswgan")
    n, ncls, shape = len(x_all), data.num_classes, list(data.shape)
    check_hparams(hp, n, tuple(shape))
    K, B, T = int(hp.num_discriminators), int(hp.batch_size), int(hp.iters)
    c_start = classifier_start(hp)
    check_classifier_reuse(hp, ledger, "dpac", c_start)
    betas = tuple(hp.betas)
    base = EnsembleSetup(hp, data, run, partial(ResNetGenerator, ncls, shape, int(hp.z_dim), int(hp.g_width)))
    parts, g_net, g_ema, opt_g = base.parts, base.g_net, base.g_ema, base.opt_g
    data_gen, gen_gen = base.data_gen, base.gen_gen
    disc, clf, clf_init_fn = base.disc, base.clf, base.clf_init

    state = run.resume_state["state"] if run.resume_state else None
    joint = str(hp.sanitize) == "joint"  # Eq. (9): one sanitiser on the gradient of the whole loss L_G
    z_noise = float(state["noise_multiplier"]) if state else plan_noise(hp, ledger, K, None if joint else c_start)
    if ledger.accounting == "paper":
        ledger.paper_epsilon = paper_epsilon_fn(B)
    for note in (PRETRAIN_NOTE, PAPER_NOTE if ledger.accounting == "paper" else SOUND_NOTE):
        if note not in ledger.notes:  # a resumed ledger already carries them
            ledger.notes.append(note)
    base.resume_or_pretrain(state, run, x_all, y_all, hp, ncls)
    basis = sanitizer_basis(hp, shape, dev)
    san_d = Sanitizer(float(hp.clip), z_noise, base.noise_gen, basis)
    san_c = None if joint else Sanitizer(float(hp.clip), z_noise, base.noise_gen, basis)
    # an audit run's canaries: records of the partitions, one channel per sanitiser path (dpgen.audit)
    canaries = SanitizerCanaries.attach(run.audit, K, B, {"sanitizer" if joint else "sanitizer.D": san_d,
                                                          "sanitizer.C": san_c if c_start is not None else None}) if run.audit else None
    zp = z_noise / math.sqrt(B)
    paper_cap = (paper_max_iters(z_noise, K, B, ledger.delta, ledger.target_epsilon, T)
                 if ledger.accounting == "paper" else T)
    budget = IterationBudget(ledger, ENTRY, K, paper_cap)
    log.info("dpac: K=%d B=%d T=%d z=%.4f (per path %.4f) classifier from %s, %s sanitiser on %s, %s accounting", K, B,
             T, z_noise, zp, c_start, "joint" if joint else "per-path",
             "every pixel" if basis is None else f"{basis.shape[1]} DCT coefficients", ledger.accounting)

    def snapshot() -> dict:
        return {**base.state_dict(), "noise_multiplier": z_noise}

    def fake(m: int, y: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if y is None:
            y = torch.randint(0, ncls, (m,), generator=gen_gen, device=dev)
        with torch.no_grad():
            return g_net(g_net.sample_z(m, gen_gen, dev), y), y

    run.start(T, desc=f"{'dpac' if c_start is not None else 'gswgan'} eps<={ledger.target_epsilon:g}")
    it = run.start_step
    while it < T:
        with_c = c_start is not None and it >= c_start
        # D, and C from t_c with per-path sanitisers (official code): noise 2Cz per row, sensitivity 2C per row;
        # one path when the gradient of β·D + (1−β)·C is sanitised at once (Eq. 9)
        paths = (zp, zp) if with_c and not joint else (zp,)
        if not budget.allows(it, paths):
            break
        k = uniform_member(K, data_gen, dev)  # Alg. 1 line 2: k ~ U[1, K]
        if canaries is not None:
            canaries.start_iteration(k)
        loss_d, _, _ = critic_phase(disc, parts, k, x_all, y_all, fake, hp, float(hp.lr), betas, data_gen)
        refresh_phase(disc, parts, it, x_all, y_all, fake, hp, float(hp.lr), betas, data_gen)
        if with_c:
            classifier_phase(clf, parts, k, x_all, y_all, fake, hp, ncls, bool(hp.classifier.reinit) or it == c_start,
                             clf_init_fn, float(hp.lr), betas, base.init_gen, data_gen)
        loss_g = generator_step(g_net, opt_g, disc, clf if with_c else None, k, san_d, san_c, float(hp.beta),
                                B, ncls, gen_gen)
        budget.record(paths)  # one sampled event with one Gaussian z/sqrt(B) per path
        ema_update(g_ema, g_net, float(hp.ema), it)
        it += 1
        run.step_done(it, {"loss_d": loss_d.mean(), "loss_g": loss_g}, snapshot)  # tensors: synced at log time
    run.finish(it, snapshot())
    return g_ema.eval()


def generator_step(g_net: ResNetGenerator, opt_g: torch.optim.Optimizer, disc: NetStack, clf: NetStack | None,
                   k: torch.Tensor | int, san_d: Sanitizer, san_c: Sanitizer | None, beta: float, b: int, ncls: int,
                   g: torch.Generator) -> torch.Tensor:
    """Alg. 1 lines 21–22 / eq. (4), (9): G descends −β·D_k(G(z), y) − (1−β)·C(G(z), y) through the sanitisers.

    The per-sample losses are summed so each sanitiser sees ∂ℓ_i/∂x_i; it clips, adds noise and
    divides by B. ``san_c`` None (``dpac.sanitize=joint``, Eq. 9): D and C read one sanitised view of the
    images, whose hook sees the gradient of the whole loss, β·∂D + (1−β)·∂C, and sanitises it once; otherwise
    each path has its own sanitiser (the official code's hooks on D.conv1 and C1.conv1). D_k and C are detached:
    only the sanitised image gradients reach G.
    """
    dev = next(g_net.parameters()).device
    y = torch.randint(0, ncls, (b,), generator=g, device=dev)
    x = g_net(g_net.sample_z(b, g, dev), y)
    p, u = disc.member(k)
    xs = san_d(x)
    loss = -beta * disc_forward(p, u, xs, y).sum()
    if clf is not None:
        pc, uc = clf.member(0)
        loss = loss - (1.0 - beta) * clf_forward(pc, uc, xs if san_c is None else san_c(x), y).sum()
    opt_g.zero_grad(set_to_none=True)
    loss.backward()
    opt_g.step()
    return loss.detach() / b
