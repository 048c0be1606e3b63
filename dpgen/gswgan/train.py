"""GS-WGAN's training loop (Chen et al. 2020, Alg. 1), shared by DP-GAN-DPAC and EFSGD through the named
extension points of :class:`GsWgan` (:mod:`dpgen.dpac.method`, :mod:`dpgen.efsgd.train`).

Privacy structure. The training set is split into K disjoint partitions, one per discriminator.
The discriminators (and DPAC's classifier C) are trained WITHOUT DP — first pre-trained on their
own partitions, then updated whenever they are sampled — and are never released: they are the
"teachers". What leaves them is only ∇_{G(z)} L_G, which the :class:`Sanitizer` clips per sample
and noises before it reaches G (paper eq. 9). The DP guarantee therefore covers exactly the
sequence of sanitised gradients (and G, its post-processing). Each generator iteration samples partitions:
with ``dpac.sampling=poisson`` (the default) every partition joins independently at rate q = m/K
(``partitions_per_iter`` = m), the sampled discriminators train, and their clipped gradients are summed per
generated image before one noise draw; with ``sampling=uniform`` exactly one partition is drawn (the paper,
Alg. 1 line 2). Each iteration is one event at rate q in the ledger (see :mod:`dpgen.gswgan.accounting`); the
uniform draw has no valid amplification argument once the unsampled discriminators' states depend on earlier
draws, so it runs only under ``privacy.accounting=paper`` (docs/privacy.md, "Sampling partitions").
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
from dpgen.gswgan import ensemble as members_ensemble
from dpgen.gswgan.ensemble import GeneratorStack, critic_step
from dpgen.ensemble import NetStack, batched_forward
from dpgen.gswgan.nets import Forward, ResNetGenerator, clf_forward, clf_init, disc_forward, disc_init
from dpgen.nets.dct import dct_basis
from dpgen.nets.spectral import sn_init
from dpgen.gswgan.sanitizer import Sanitizer
from dpgen.errors import DpgenError
from dpgen.privacy import PrivacyLedger, calibrate_noise_multiplier
from dpgen.privacy.randomness import SecretGenerator, derive_seed, require_secret
from dpgen.privacy.sampling import poisson_batch, uniform_member

log = logging.getLogger("dpgen")

PRETRAIN_NOTE = (
    "dpac/gswgan: the K discriminators (and the auxiliary classifier C) are trained without DP on their "
    "own disjoint partitions (pre-training and during training) and are never released; only the "
    "per-sample clipped and noised gradients w.r.t. the generated images (the sanitiser) reach the "
    "generator, so the accounting covers exactly those releases (GS-WGAN, Chen et al. 2020, Sec. 3)."
)
SOUND_NOTE = (
    "sound: in each generator iteration every partition joins independently with probability q = m/K "
    "(Poisson sampling, m = partitions_per_iter); the sampled discriminators (and classifiers) train on their "
    "own partitions only, and per path (one with dpac.sanitize=joint, Eq. 9: the gradient of "
    "beta*D + (1-beta)*C; per_path: D, and C once active) each generated image's gradients from the sampled "
    "partitions are clipped to C, summed, and noised once with std 2*C*z. A record's partition adds at most one "
    "clipped row per image and path: joint L2 sensitivity 2C*sqrt(P*B), noise multiplier z/sqrt(B) per path "
    "(sigma_eff z/sqrt(P*B)), one Poisson-sampled event at rate q per iteration (add/remove-one)."
)
UNIFORM_NOTE = (
    "sampling=uniform (the paper's draw of exactly one partition per iteration): the discriminators that were not "
    "drawn keep states that depend on which partitions earlier iterations drew, so the step-wise subsampling "
    "argument does not apply; allowed only under privacy.accounting=paper (or eps=inf)."
)
PAPER_NOTE = (
    "paper: GS-WGAN's privacy_analysis.py (autodp) composes B*T subsampled Gaussians with multiplier z, "
    "sampled without replacement at 1/K (REPLACE_ONE, Mironov RDP->DP conversion): 9.99 for z=1.07, K=1000, "
    "T=20000, B=32, delta=1e-5. It treats the B gradients of one iteration as independently subsampled "
    "although all come from the same sampled discriminator, and DPAC's official accountant ignores the C "
    "path. dpgen extends it to m partitions per iteration as m-of-K without replacement. Its figure is no bound "
    "either way: sound_epsilon is the run's valid epsilon (far larger at one partition per iteration; smaller "
    "where an iteration samples many, whose B*T composition over-counts). Not a valid DP guarantee."
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
    if int(hp.pretrain_iters) < 0 or (hp.pretrain_chunk is not None and int(hp.pretrain_chunk) < 1):
        raise DpgenError(f"{prefix}.pretrain_iters must be >= 0 and {prefix}.pretrain_chunk >= 1 (or null)")
    sampling, m = partition_sampling(hp)
    if sampling not in SAMPLINGS:
        raise DpgenError(f"{prefix}.sampling must be one of {', '.join(SAMPLINGS)}, got {sampling!r}")
    if not 1 <= m <= int(hp.num_discriminators):
        raise DpgenError(f"{prefix}.partitions_per_iter={m} must be between 1 and "
                         f"{prefix}.num_discriminators={hp.num_discriminators}")
    if sampling == "uniform" and m != 1:
        raise DpgenError(f"{prefix}.sampling=uniform draws exactly one partition per iteration; "
                         f"{prefix}.partitions_per_iter={m} needs {prefix}.sampling=poisson")


SAMPLINGS = ("poisson", "uniform")


def partition_sampling(hp: DictConfig) -> tuple[str, int]:
    """(``sampling``, ``partitions_per_iter``), Poisson at 1/K when the block lacks them (a saved config that
    predates them is given the uniform draw it ran, by dpgen.core.schema.LATER_KEYS)."""
    return str(hp.get("sampling", "poisson")), int(hp.get("partitions_per_iter", 1))


def check_uniform_sampling(hp: DictConfig, ledger: PrivacyLedger, prefix: str) -> None:
    """``sampling=uniform`` has no valid sound bound (:data:`UNIFORM_NOTE`): refused when the ledger must be one."""
    if partition_sampling(hp)[0] != "uniform":
        return
    if ledger.accounting == "sound" and not ledger.privacy_off:
        raise DpgenError(f"{prefix}.sampling=uniform (one partition per iteration, as the paper) has no valid "
                         f"sound bound: the unsampled discriminators depend on earlier draws; use "
                         f"{prefix}.sampling=poisson or privacy.accounting=paper")
    if UNIFORM_NOTE not in ledger.notes:
        ledger.notes.append(UNIFORM_NOTE)


def check_hparams(hp: DictConfig, n: int, shape: tuple[int, ...], prefix: str = "gswgan") -> None:
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


def generator_lr_at(hp: DictConfig, it: int, iters: int) -> float:
    """G's learning rate at (0-based) iteration ``it`` of ``iters``: :func:`generator_lr` until
    ``g_lr_decay_start``·iters, then a half cosine to 0 at ``iters`` (null: constant, as the papers).

    Not in the papers (a quick-profile choice): with a constant rate the last iterations' noisy steps move G as far
    as the first ones did, so the released average depends on which noise came last. The schedule is a function
    of the iteration count alone (public), so it costs no privacy and resumes without state of its own.
    """
    lr, start = generator_lr(hp), hp.get("g_lr_decay_start")
    if start is None:
        return lr
    s = float(start) * iters
    if it < s:
        return lr
    return lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, (it - s) / max(iters - s, 1e-12))))


def plan_noise(hp: DictConfig, ledger: PrivacyLedger, k: int, c_start: int | None,
               entries: Callable[[float], list] | None = None) -> float:
    """Per-sample noise multiplier z: given, or calibrated so all ``iters`` iterations meet the target ε.

    ``entries(z)`` gives the ledger entries of all iterations at z (default: dpac's
    :func:`iteration_entries`; efsgd passes its own, which also count the encoder paths).
    """
    if hp.noise_multiplier is not None:
        return float(hp.noise_multiplier)
    b, t, m = int(hp.batch_size), int(hp.iters), partition_sampling(hp)[1]
    if ledger.accounting == "paper":
        return paper_noise_multiplier(k, b, t, ledger.delta, ledger.target_epsilon, per_iter=m)
    if entries is None:
        def entries(z: float) -> list:
            return iteration_entries(z, k, b, t, c_start, per_iter=m)
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
        """b record indices of each member's partition (rows of the result), drawn from the secret ``g``.

        One row of uniforms is drawn for EVERY partition and the members' rows are kept, so the stream advances
        by the same amount whichever (and however many) partitions an iteration sampled: partition j's batches
        never depend on whether another partition was sampled (tests/test_dpac_isolation.py flips one)."""
        require_secret(g, "partition batch sampling")
        u = torch.rand(len(self.sizes), b, generator=g, device=self.mat.device).index_select(0, members)
        pos = (u * self.sizes[members, None]).long()
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


#: pairs per chunk under ``pretrain_chunk: null`` where the memory is not measured (a CPU): the paper profile's
DEFAULT_CHUNK = 100


def pretrain_chunk_for(disc: NetStack, make_gen: Callable[[], torch.nn.Module], hp: DictConfig,
                       shape: list[int], dist: Dist = SINGLE, memory=None) -> int:
    """(D, warm-up G) pairs pre-trained at once: ``pretrain_chunk`` as given, or (null) the most that fit the free
    device memory, measured on CUDA: one critic step and one generator step of 2, 2 and 6 throw-away pairs (copies of
    member 0 before any training, generators from a public seed) on zero images with a throw-away generator, so no
    record and no secret stream is read, and the peak's growth per pair
    (:func:`dpgen.privacy.micro_batch.measured_footprint`). Off CUDA (``memory`` None) :data:`DEFAULT_CHUNK`. The
    ranks agree on the least (they split the chunks by index). ``memory``: the allocator statistics (tests: a fake)."""
    k = len(disc)
    if hp.pretrain_chunk is not None:
        return max(1, int(hp.pretrain_chunk))
    dev = disc.device
    if memory is None and dev.type != "cuda":
        return dist.min(min(k, DEFAULT_CHUNK))
    from dpgen.privacy import micro_batch as mb

    b, lr, betas = int(hp.batch_size), float(hp.lr), tuple(hp.betas)

    def probe(m: int) -> None:
        stack = disc.replicate(m)
        g = torch.Generator(device=dev).manual_seed(0)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            gens = members_ensemble.GeneratorStack(make_gen, m, dev, generator_lr(hp), betas)
        idx = torch.arange(m, device=dev)
        x = torch.zeros(m, b, *shape, device=dev)
        y = torch.zeros(m, b, dtype=torch.long, device=dev)
        with torch.no_grad():
            xf = gens(gens.sample_z(b, g, m), y)
        members_ensemble.critic_step(stack, disc_forward, idx, x, y, xf, y, torch.rand(m, b, generator=g, device=dev),
                                     float(hp.gp_weight), float(hp.drift), lr, betas)
        gens.step(lambda xg: -batched_forward(stack, disc_forward, idx, xg, y).mean(1).sum(), gens.sample_z(b, g, m), y)

    per_pair = mb.measured_footprint(probe, memory or mb.CudaMemory(dev))
    fit = int(mb.MEASURED_FRACTION * mb.free_memory(dev) // max(1.0, mb.MEASURED_MARGIN * per_pair))
    chunk = dist.min(max(1, min(k, fit)))
    log.info("pre-training: %.3f GB per (D, warm-up G) pair measured, %d pairs per chunk", per_pair / 1e9, chunk)
    return chunk


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

    ``pretrain_chunk: null`` sizes the chunks from the device's memory (:func:`pretrain_chunk_for`); a chunk's
    draws depend on its index, so another chunk size gives another (equally private) pre-training.

    Chunk c draws its batches from the secret ``g.fork(c)`` and initialises its warm-up generators from the
    public (``seed``, c), so a chunk's result does not depend on which process trains it: ``dist`` splits the
    chunks over the ranks (a contiguous block each, issue 25), and the ranks then exchange their blocks so that
    every rank holds the whole pre-trained ensemble, as one process would.
    """
    iters, critic, b = int(hp.pretrain_iters), int(hp.critic_iters), int(hp.batch_size)
    chunk = pretrain_chunk_for(disc, make_gen, hp, list(x_all.shape[1:]), dist) if iters else len(disc)
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

    An iteration is one event sampled at rate q = m/K holding one Gaussian per sanitised path, each with the
    multiplier (noise std ÷ ℓ2 sensitivity of that path's B rows) given to :meth:`allows`/:meth:`record`.
    Sound accounting: one budget guard per kind of iteration (tuple of multipliers). Paper accounting: stop at
    the paper analysis' cap, still recording the same entries so ``sound_epsilon`` stays truthful.
    """

    def __init__(self, ledger: PrivacyLedger, entry: str, k: int, paper_cap: int, per_iter: int = 1) -> None:
        self.ledger, self.entry, self.q, self.paper_cap = ledger, entry, min(1.0, per_iter / k), paper_cap
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
                 fake, hp: DictConfig, lr: float, betas: tuple, g: torch.Generator, shared_fakes: bool = False):
    """Alg. 1 lines 3–8: ``critic_iters`` WGAN-GP steps of every sampled D_k (``k``: M ≥ 0 members) on its own
    partition, all at once.

    Each step's fakes are drawn from the secret ``g``. With one partition (the paper's draw) they carry the real
    batch's labels (official code). With ``shared_fakes`` (Poisson sampling) all M members see one batch of B
    fakes with uniform labels: B·M fakes with each member's labels would cost M of G's forward passes, and labels
    taken from one member's batch would carry its partition into the others. Either way the number of draws
    from the public ``gen`` stream does not depend on the secret sample. Returns the M last critic losses and the
    last real batches [M, B, ...] (efsgd's reconstruction reuses them).
    """
    b, m = int(hp.batch_size), k.shape[0]
    loss_d = torch.zeros(m, device=x_all.device)
    xr, yr = x_all[:0].expand(m, 0, *x_all.shape[1:]), y_all[:0].expand(m, 0)
    for _ in range(int(hp.critic_iters)):
        idx = parts.sample(k, b, g)
        xr, yr = x_all[idx], y_all[idx]
        if shared_fakes:
            xf, yf = fake(b, None, g)
            xf, yf = xf.unsqueeze(0).expand(m, *xf.shape), yf.unsqueeze(0).expand(m, b)
        else:  # one partition: its own labels (official code)
            xf, yf = fake(m * b, yr.reshape(-1), g)
            xf, yf = xf.view(m, b, *xf.shape[1:]), yr
        alpha = torch.rand(len(parts.sizes), b, generator=g, device=xr.device).index_select(0, k)  # as sample()
        if m:
            loss_d = critic_step(disc, disc_forward, k, xr, yr, xf, yf, alpha, float(hp.gp_weight),
                                 float(hp.drift), lr, betas, sampled=True)
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
    prefix = "gswgan"  # the config block of the method's keys (``gswgan.*``)
    entry = ENTRY  # the ledger entries' name
    data_name = "dpac/gswgan"  # for error messages about the data
    beta = 1.0  # the weight of D in G's loss: GS-WGAN's loss is D alone (DPAC's beta < 1 gives C the rest)
    joint = True  # one sanitiser (GS-WGAN has one path; DPAC's per_path mode adds C's)
    c_score: Forward = clf_forward  # an extension's classifier score (GS-WGAN has no classifier)

    canaries = None  # an audit run's SanitizerGroup (set in train); None: no audit

    def __init__(self, hp: DictConfig, data: ImageDataset, ledger: PrivacyLedger, run: Run) -> None:
        self.hp, self.data, self.ledger, self.run = hp, data, ledger, run
        self.ncls, self.shape = data.num_classes, list(data.shape)
        self.K, self.B, self.T = int(hp.num_discriminators), int(hp.batch_size), int(hp.iters)
        self.c_start: int | None = None  # t_c of an auxiliary classifier (DPAC); GS-WGAN has none
        sampling, self.per_iter = partition_sampling(hp)
        self.poisson = sampling == "poisson"  # else the paper's uniform draw of one partition (paper accounting)

    # -- configuration -------------------------------------------------------------------------------------------
    def check(self, n: int, shape: tuple[int, ...]) -> None:
        """One-line DpgenErrors for bad user input."""
        check_hparams(self.hp, n, shape, self.prefix)
        check_uniform_sampling(self.hp, self.ledger, self.prefix)

    def plan_entries(self, z: float) -> list:
        """Ledger entries of all ``iters`` iterations at per-sample multiplier z (extra release paths: override)."""
        return iteration_entries(z, self.K, self.B, self.T, None, per_iter=self.per_iter)

    def build_sanitizers(self, z_noise: float, basis: torch.Tensor | None) -> None:
        """D's sanitiser (Eq. 5: clip to C, noise std 2Cz per row); an extension adds its paths' sanitisers."""
        hp, base = self.hp, self.base
        self.san_d = Sanitizer(float(hp.clip), z_noise, base.noise_gen, basis)

    def audited_sanitizers(self) -> dict[str, Sanitizer | None]:
        """Every sanitiser path a privacy audit puts canaries into (name -> sanitiser; None: off in this run)."""
        return {"sanitizer": self.san_d}

    # -- per iteration -------------------------------------------------------------------------------------------
    def draw_partitions(self) -> torch.Tensor:
        """This iteration's partitions from the secret ``data`` stream, as a device tensor of M members: each
        partition independently at rate m/K (``sampling=poisson``; M is read back to the host by ``nonzero``, the
        one sync per iteration), or exactly one, uniformly (``sampling=uniform``, Alg. 1 line 2; no sync)."""
        base = self.base
        if self.poisson:
            return poisson_batch(self.K, min(1.0, self.per_iter / self.K), base.data_gen, self.run.device)
        return uniform_member(self.K, base.data_gen, self.run.device)

    def release_paths(self, it: int) -> tuple[float, ...]:
        """The multiplier (noise std ÷ ℓ2 sensitivity of the path's B rows) of every path iteration ``it`` releases."""
        return (self.zp,)

    def partition_phase(self, it: int, k: torch.Tensor, xr: torch.Tensor, yr: torch.Tensor) -> None:
        """Extra training on the sampled partitions ``k`` [M] after their critic steps (``xr, yr`` [M, B, ...]:
        each D_k's last real batch)."""

    def generator_step(self, it: int, k: torch.Tensor) -> torch.Tensor:
        """Alg. 1 lines 9-10: G's step through the sanitiser of the sampled D_k's gradients (summed over k)."""
        b = self.base
        return generator_step(b.g_net, b.opt_g, b.disc, None, k, self.san_d, None, self.beta, self.B,
                              self.ncls, b.gen_gen, scale=self.per_iter)

    def scalars(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` saved."""

    def classifier_note(self) -> str:
        """What the setup line says of an extension's classifier (GS-WGAN has none)."""
        return ""

    def describe(self, z_noise: float, basis: torch.Tensor | None) -> str:
        """The run's setup line in the log."""
        draw = f"Poisson partitions at {self.per_iter}/K" if self.poisson else "one uniform partition"
        start = self.hp.get("g_lr_decay_start")
        g_lr = f"G lr {generator_lr(self.hp):g}" + ("" if start is None else f", cosine to 0 from {float(start):g}·T")
        return (f"{self.name}: K={self.K} B={self.B} T={self.T} {draw}, {g_lr}, z={z_noise:.4f} (per path {self.zp:.4f}), classifier "
                f"from {self.c_start}{self.classifier_note()}, {'joint' if self.joint else 'per-path'} sanitiser on "
                f"{'every pixel' if basis is None else f'{basis.shape[1]} DCT coefficients'}, "
                f"{self.ledger.accounting} accounting")

    def build_state(self) -> None:
        """Extra per-partition networks, built right after the ensemble (from the public ``init`` stream)."""

    def setup_ledger(self, z_noise: float) -> None:
        """The paper analysis' ε function and the ledger's notes (an extension has its own)."""
        ledger = self.ledger
        if ledger.accounting == "paper":
            ledger.paper_epsilon = paper_epsilon_fn(self.B, per_iter=self.per_iter)
        for note in (PRETRAIN_NOTE, PAPER_NOTE if ledger.accounting == "paper" else SOUND_NOTE):
            if note not in ledger.notes:  # a resumed ledger already carries them
                ledger.notes.append(note)

    # -- the run -------------------------------------------------------------------------------------------------
    def fake(self, m: int, y: torch.Tensor | None = None,
             g: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """m of G's samples (labels ``y`` or uniform ones), without gradients, drawn from ``g`` (default: the public
        ``gen`` stream)."""
        g_net, dev = self.base.g_net, self.run.device
        g = self.base.gen_gen if g is None else g
        if y is None:
            y = torch.randint(0, self.ncls, (m,), generator=g, device=dev)
        with torch.no_grad():
            return g_net(g_net.sample_z(m, g, dev), y), y

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
        # one sampling event per iteration at the ledger's rate (the uniform draw: 1/K)
        rate = min(1.0, self.per_iter / K) if self.poisson else 1.0 / K
        self.canaries = (SanitizerCanaries.attach(run.audit, K, B, rate, self.audited_sanitizers()) if run.audit
                         else None)
        if state:
            self.load_state_dict(state)
        paper_cap = (paper_max_iters(z_noise, K, B, ledger.delta, ledger.target_epsilon, T, self.per_iter)
                     if ledger.accounting == "paper" else T)
        budget = IterationBudget(ledger, self.entry, K, paper_cap, self.per_iter)
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

    Per iteration: the budget check for the paths it will release, the sampled partitions from the secret stream
    (line 2: Poisson at m/K, or one uniform draw), their D_k's critic steps on their own partitions (lines 3-8),
    the optional refresh of other discriminators on their own partitions, the extension's per-partition phase,
    G's sanitised step (lines 9-10), the ledger record of ONE event sampled at rate q with one Gaussian per path,
    G's EMA. Returns the number of iterations done.
    """
    hp, run, base = ext.hp, ext.run, ext.base
    dev, K, T, betas = run.device, ext.K, ext.T, tuple(hp.betas)
    it = run.start_step
    while it < T:
        paths = ext.release_paths(it)
        if not budget.allows(it, paths):
            break
        k = ext.draw_partitions()  # Alg. 1 line 2
        if hp.get("g_lr_decay_start") is not None:
            for group in base.opt_g.param_groups:
                group["lr"] = generator_lr_at(hp, it, T)
        if ext.canaries is not None:
            ext.canaries.start_iteration(k)
        loss_d, xr, yr = critic_phase(base.disc, base.parts, k, x_all, y_all, ext.fake, hp, lr, betas, base.data_gen,
                                      shared_fakes=ext.poisson)
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


def member_rows(x: torch.Tensor, y: torch.Tensor, terms: list) -> tuple[torch.Tensor, torch.Tensor]:
    """([M, B, ...] rows, loss): row (j, i) is ∂ℓ_ji/∂x_i, the gradient of ℓ_ji = −Σ_t w_t·f_t(member_t[j])(x_i, y_i)
    w.r.t. the generated image x_i, for the M members in ``terms`` = [(stack, forward, members [M], weight w_t), ...]
    (one path: the terms a sanitiser releases jointly); loss = Σ_ji ℓ_ji, detached, for the log. The images are
    detached: only the sanitised rows reach G."""
    m = terms[0][2].shape[0]
    xm = x.detach().unsqueeze(0).expand(m, *x.shape).clone().requires_grad_(True)
    if m == 0:
        return xm.detach(), torch.zeros((), device=x.device)
    ym = y.unsqueeze(0).expand(m, -1)
    loss = sum(-w * batched_forward(stack, fwd, members, xm, ym).sum() for stack, fwd, members, w in terms)
    return torch.autograd.grad(loss, xm)[0], loss.detach()


def generator_step(g_net: ResNetGenerator, opt_g: torch.optim.Optimizer, disc: NetStack, clf: NetStack | None,
                   k: torch.Tensor | int, san_d: Sanitizer, san_c: Sanitizer | None, beta: float, b: int, ncls: int,
                   g: torch.Generator, scale: float = 1.0, clf_members: torch.Tensor | None = None,
                   c_score: Forward = clf_forward) -> torch.Tensor:
    """Alg. 1 lines 21–22 / eq. (4), (9): G descends −β·D_k(G(z), y) − (1−β)·C_k(G(z), y) through the sanitisers,
    for every sampled partition k (``k``: M members of ``disc``; C_k is member ``clf_members[j]`` of ``clf``,
    default the single classifier 0; ``c_score``: C's score, ``classifier.loss``).

    Each sanitiser sees every member's per-sample gradient ∂ℓ_i/∂x_i (:func:`member_rows`), clips each, sums
    them over the members per image, adds noise and divides by ``scale`` (the expected M) and B
    (:meth:`Sanitizer.sanitize_sum`); the release is then back-propagated through G. ``san_c`` None
    (``dpac.sanitize=joint``, Eq. 9): the rows are the gradient of the whole loss, β·∂D + (1−β)·∂C, sanitised once;
    otherwise each path has its own sanitiser (the official code's hooks on D.conv1 and C1.conv1). Returns G's
    loss per sample and expected member (for the log).
    """
    dev = next(g_net.parameters()).device
    members = torch.as_tensor(k, device=dev).reshape(-1)
    y = torch.randint(0, ncls, (b,), generator=g, device=dev)
    x = g_net(g_net.sample_z(b, g, dev), y)
    d_term = (disc, disc_forward, members, beta)
    c_term = None
    if clf is not None:
        c_idx = torch.zeros_like(members) if clf_members is None else clf_members
        c_term = (clf, c_score, c_idx, 1.0 - beta)
    if c_term is None or san_c is None:
        rows, loss = member_rows(x, y, [d_term] + ([c_term] if c_term else []))
        release = san_d.sanitize_sum(rows, scale)
    else:
        rows_d, loss_d = member_rows(x, y, [d_term])
        rows_c, loss_c = member_rows(x, y, [c_term])
        release, loss = san_d.sanitize_sum(rows_d, scale) + san_c.sanitize_sum(rows_c, scale), loss_d + loss_c
    opt_g.zero_grad(set_to_none=True)
    x.backward(release.to(x.dtype))
    opt_g.step()
    return loss / (b * float(scale))
