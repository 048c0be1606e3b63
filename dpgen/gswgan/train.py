"""GS-WGAN's training loop (Chen et al. 2020, Alg. 1), shared by DP-GAN-DPAC and EFSGD through the named
extension points of :class:`GsWgan` (:mod:`dpgen.dpac.method`, :mod:`dpgen.efsgd.train`).

Privacy structure. The training set is split into K disjoint partitions, one per discriminator.
The discriminators (and DPAC's classifier C) are trained WITHOUT DP — first pre-trained on their
own partitions, then updated whenever they are sampled — and are never released: they are the
"teachers". What leaves them is only ∇_{G(z)} L_G, which the :class:`Sanitizer` clips per sample
and noises before it reaches G (paper eq. 9). The DP guarantee therefore covers exactly the
sequence of sanitised gradients (and G, its post-processing): each generator iteration is one
event at rate 1/K (the sampled partition), recorded in the ledger (see :mod:`dpgen.gswgan.accounting`).
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
from dpgen.gswgan.accounting import (ENTRY, iteration_entries, paper_epsilon_fn, paper_max_iters,
                                   paper_noise_multiplier)
from dpgen.gswgan.ensemble import GeneratorStack, critic_step
from dpgen.ensemble import NetStack, batched_forward
from dpgen.gswgan.nets import ResNetGenerator, clf_forward, clf_init, disc_forward, disc_init
from dpgen.nets.dct import dct_basis
from dpgen.nets.spectral import sn_init
from dpgen.gswgan.sanitizer import Sanitizer
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


def check_hparams(hp: DictConfig, n: int, shape: tuple[int, ...], prefix: str = "dpac") -> None:
    """One-line DpgenErrors for bad user input (GS-WGAN's keys; :mod:`dpgen.dpac.method` adds DPAC's)."""
    check_ensemble_hparams(hp, n, prefix)
    if len(shape) != 3 or shape[1] > 32 or shape[2] > 32:
        raise DpgenError(f"dpac/gswgan generate images up to 32x32; this dataset has shape {shape}")
    basis, d = hp.get("grad_basis"), math.prod(shape)
    if basis is not None and not 1 <= int(basis) <= d:
        raise DpgenError(f"{prefix}.grad_basis={basis} must be between 1 and the image size {d} (or null)")


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


class GsWgan:
    """GS-WGAN's training (Chen et al. 2020, Alg. 1) with the named extension points that DPAC
    (:class:`dpgen.dpac.method.Dpac`) and EFSGD (:mod:`dpgen.efsgd.train`) override.

    This class IS GS-WGAN: one release path per iteration (D_k's sanitised image gradient, Eq. 5) and no state
    beyond the discriminator ensemble. The extension points, each a method:

    * extra release paths: :meth:`plan_entries` (the ledger entries of all iterations at a noise multiplier z, for
      calibration), :meth:`build_sanitizers` and :meth:`release_paths` (the multipliers of the Gaussians iteration
      ``it`` releases, recorded as ONE event sampled at 1/K);
    * extra per-partition state: :meth:`partition_phase` (networks trained on the sampled partition k after
      D_k's critic steps: DPAC's classifier C, EFSGD's encoder E_k; never released), :meth:`state_dict` /
      :meth:`load_state_dict` (what the checkpoint keeps besides the ensemble);
    * extra loss paths: :meth:`generator_step` (G's sanitised step; :func:`generator_step` takes DPAC's optional
      classifier path) and :meth:`scalars` (what is logged besides loss_d and loss_g).
    """

    name = "gswgan"
    entry = ENTRY  # the ledger entries' name
    data_name = "dpac/gswgan"  # for error messages about the data

    canaries = None  # an audit run's SanitizerGroup (set in train); None: no audit

    def __init__(self, hp: DictConfig, data: ImageDataset, ledger: PrivacyLedger, run: Run) -> None:
        self.hp, self.data, self.ledger, self.run = hp, data, ledger, run
        self.ncls, self.shape = data.num_classes, list(data.shape)
        self.K, self.B, self.T = int(hp.num_discriminators), int(hp.batch_size), int(hp.iters)
        self.c_start: int | None = None  # t_c of an auxiliary classifier (DPAC); GS-WGAN has none

    # -- configuration -------------------------------------------------------------------------------------------
    def check(self, n: int, shape: tuple[int, ...]) -> None:
        """One-line DpgenErrors for bad user input."""
        check_hparams(self.hp, n, shape)
        if bool(self.hp.classifier.enabled) and float(self.hp.beta) < 1.0:
            raise DpgenError("method=gswgan has no auxiliary classifier (dpac.classifier.enabled=true with "
                             "dpac.beta < 1); use method=dpac")

    def plan_entries(self, z: float) -> list:
        """Ledger entries of all ``iters`` iterations at per-sample multiplier z (extra release paths: override)."""
        return iteration_entries(z, self.K, self.B, self.T, None)

    def build_sanitizers(self, z_noise: float, basis: torch.Tensor | None) -> None:
        """D's sanitiser (Eq. 5: clip to C, noise std 2Cz per row); an extension adds its paths' sanitisers."""
        hp, base = self.hp, self.base
        self.san_d = Sanitizer(float(hp.clip), z_noise, base.noise_gen, basis)

    def audited_sanitizers(self) -> dict[str, Sanitizer | None]:
        """Every sanitiser path a privacy audit puts canaries into (name -> sanitiser; None: off in this run)."""
        return {"sanitizer": self.san_d}

    # -- per iteration -------------------------------------------------------------------------------------------
    def release_paths(self, it: int) -> tuple[float, ...]:
        """The multiplier (noise std ÷ ℓ2 sensitivity of the path's B rows) of every path iteration ``it`` releases."""
        return (self.zp,)

    def partition_phase(self, it: int, k: torch.Tensor, xr: torch.Tensor, yr: torch.Tensor) -> None:
        """Extra per-partition training on partition k after D_k's critic steps (``xr, yr``: D's last real batch)."""

    def generator_step(self, it: int, k: torch.Tensor) -> torch.Tensor:
        """Alg. 1 lines 9-10: G's step through the sanitiser of D_k's gradient."""
        b = self.base
        return generator_step(b.g_net, b.opt_g, b.disc, None, k, self.san_d, None, float(self.hp.beta), self.B,
                              self.ncls, b.gen_gen)

    def scalars(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` saved."""

    def describe(self, z_noise: float, basis: torch.Tensor | None) -> str:
        """The run's setup line in the log."""
        return (f"{self.name}: K={self.K} B={self.B} T={self.T} z={z_noise:.4f} (per path {self.zp:.4f}), classifier "
                f"from {self.c_start}, {'joint' if str(self.hp.sanitize) == 'joint' else 'per-path'} sanitiser on "
                f"{'every pixel' if basis is None else f'{basis.shape[1]} DCT coefficients'}, "
                f"{self.ledger.accounting} accounting")

    def build_state(self) -> None:
        """Extra per-partition networks, built right after the ensemble (from the public ``init`` stream)."""

    def setup_ledger(self, z_noise: float) -> None:
        """The paper analysis' ε function and the ledger's notes (an extension has its own)."""
        ledger = self.ledger
        if ledger.accounting == "paper":
            ledger.paper_epsilon = paper_epsilon_fn(self.B)
        for note in (PRETRAIN_NOTE, PAPER_NOTE if ledger.accounting == "paper" else SOUND_NOTE):
            if note not in ledger.notes:  # a resumed ledger already carries them
                ledger.notes.append(note)

    # -- the run -------------------------------------------------------------------------------------------------
    def fake(self, m: int, y: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """m of G's samples (labels ``y`` or uniform ones) from the public ``gen`` stream, without gradients."""
        g_net, dev = self.base.g_net, self.run.device
        if y is None:
            y = torch.randint(0, self.ncls, (m,), generator=self.base.gen_gen, device=dev)
        with torch.no_grad():
            return g_net(g_net.sample_z(m, self.base.gen_gen, dev), y), y

    def make_generator(self) -> torch.nn.Module:
        return ResNetGenerator(self.ncls, self.shape, int(self.hp.z_dim), int(self.hp.g_width))

    def train(self) -> ResNetGenerator:
        hp, ledger, run, data = self.hp, self.ledger, self.run, self.data
        dev = run.device
        x_all, y_all = image_train_tensors(data, dev, self.data_name)
        self.x_all, self.y_all = x_all, y_all
        n, ncls, shape = len(x_all), self.ncls, self.shape
        self.check(n, tuple(shape))
        K, B, T = self.K, self.B, self.T
        self.base = base = EnsembleSetup(hp, data, run, self.make_generator)
        state = run.resume_state["state"] if run.resume_state else None
        self.build_state()
        z_noise = float(state["noise_multiplier"]) if state else plan_noise(hp, ledger, K, None, self.plan_entries)
        self.zp = z_noise / math.sqrt(B)
        self.setup_ledger(z_noise)
        base.resume_or_pretrain(state, run, x_all, y_all, hp, ncls)
        basis = sanitizer_basis(hp, shape, dev)
        self.build_sanitizers(z_noise, basis)
        # an audit run's canaries: records of the partitions, one channel per sanitiser path (dpgen.audit)
        self.canaries = (SanitizerCanaries.attach(run.audit, K, B, self.audited_sanitizers()) if run.audit
                         else None)
        if state:
            self.load_state_dict(state)
        paper_cap = (paper_max_iters(z_noise, K, B, ledger.delta, ledger.target_epsilon, T)
                     if ledger.accounting == "paper" else T)
        budget = IterationBudget(ledger, self.entry, K, paper_cap)
        log.info("%s", self.describe(z_noise, basis))

        def snapshot() -> dict:
            return {**base.state_dict(), **self.state_dict(), "noise_multiplier": z_noise}

        run.start(T, desc=f"{self.name} eps<={ledger.target_epsilon:g}")
        it = run_iterations(self, budget, x_all, y_all, snapshot, float(hp.lr))
        run.finish(it, snapshot())
        return base.g_ema.eval()


def run_iterations(ext: GsWgan, budget: IterationBudget, x_all: torch.Tensor, y_all: torch.Tensor,
                   snapshot: Callable[[], dict], lr: float) -> int:
    """GS-WGAN's generator iterations (Alg. 1), shared by gswgan, dpac and efsgd through ``ext``'s extension points.

    Per iteration: the budget check for the paths it will release, k ~ U[1, K] from the secret stream (line 2),
    D_k's critic steps on partition k (lines 3-8), the optional refresh of other discriminators on their own
    partitions, the extension's per-partition phase, G's sanitised step (lines 9-10), the ledger record of ONE
    event sampled at 1/K with one Gaussian per path, G's EMA. Returns the number of iterations done.
    """
    hp, run, base = ext.hp, ext.run, ext.base
    dev, K, T, betas = run.device, ext.K, ext.T, tuple(hp.betas)
    it = run.start_step
    while it < T:
        paths = ext.release_paths(it)
        if not budget.allows(it, paths):
            break
        k = uniform_member(K, base.data_gen, dev)  # Alg. 1 line 2: k ~ U[1, K]
        if ext.canaries is not None:
            ext.canaries.start_iteration(k)
        loss_d, xr, yr = critic_phase(base.disc, base.parts, k, x_all, y_all, ext.fake, hp, lr, betas, base.data_gen)
        refresh_phase(base.disc, base.parts, it, x_all, y_all, ext.fake, hp, lr, betas, base.data_gen)
        ext.partition_phase(it, k, xr, yr)
        loss_g = ext.generator_step(it, k)
        budget.record(paths)  # one sampled event with one Gaussian per path
        ema_update(base.g_ema, base.g_net, float(hp.ema), it)
        it += 1
        # tensors: Run syncs them at log time only
        run.step_done(it, {"loss_d": loss_d.mean(), "loss_g": loss_g, **ext.scalars()}, snapshot)
    return it


def train(hp: DictConfig, data: ImageDataset, ledger: PrivacyLedger, run: Run) -> ResNetGenerator:
    """``method=gswgan``: GS-WGAN (β = 1, no classifier)."""
    return GsWgan(hp, data, ledger, run).train()


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
