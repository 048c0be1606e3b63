"""G-PATE training loop (Long et al. 2021, Alg. 1) with sound or paper accounting."""
from __future__ import annotations

import logging
import math

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from dpgen.audit.hooks import VoteCanaries
from dpgen.core.generator import ReleasedGenerator
from dpgen.core.run import Run
from dpgen.data.base import ImageDataset
from dpgen.data.torch_utils import to_float
from dpgen.errors import DpgenError
from dpgen.gpate import rdp
from dpgen.gpate.aggregate import dp_grad_agg
from dpgen.nets.dct import dct_basis
from dpgen.gpate.ensemble import PartitionSampler, TeacherEnsemble, assign_teachers, balanced_chunk
from dpgen.gpate.nets import (SAMPLE_STATS, TEACHER_NORMS, GPateGenerator, GPateTabularGenerator, TeacherCNN,
                              TeacherMLP, dcgan_init_, to_model_space)
from dpgen.privacy import PrivacyLedger
from dpgen.privacy.randomness import SecretGenerator, require_secret

log = logging.getLogger("dpgen")
ENTRY = "gpate.confident_gnmax"
PRIOR_ENTRY = "gpate.class_prior"
PAPER_NOTES = [
    "privacy.accounting=paper: epsilon is G-PATE's data-dependent Confident-GNMax RDP (Papernot et al. 2018, "
    "Thm 6) on the true vote counts, converted with the classic bound rdp + log(1/delta)/(lambda-1) over orders "
    "[1.1, 2..199], and used to stop training, as the official code does.",
    "A data-dependent epsilon released without smooth sensitivity (PATE-2018 GNSS) is itself a function of the "
    "private data and is NOT a differential-privacy guarantee; sound_epsilon is the valid data-independent bound.",
]
TEACHER_FAKES = ("official", "shared")
PROJECTIONS = ("gaussian", "dct")


def _choice(hp: DictConfig, key: str, allowed: tuple[str, ...], default: str) -> str:
    value = str(hp.get(key, default))
    if value not in allowed:
        raise DpgenError(f"gpate.{key} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def resolve_hparams(hp: DictConfig, eps: float, n_train: int, shape: list[int] | None = None) -> dict:
    """Fill the ε-dependent defaults (null keys) with the official README's MNIST settings; validate the rest.

    sigma1/sigma2 null with ``noise=calibrate``: left None here; :func:`calibrate_sigmas` then picks σ2
    (σ1 = ``sigma_ratio`` × σ2; null: the README ratio, 3 for ε ≤ 1, 6 otherwise) so that ``iters``
    iterations meet ε exactly.

    teachers: 4000 for ε ≤ 1, else 2000.  sigma1/sigma2: the README ratios to the teacher count
    (ε ≤ 1: 3000/1000 for 4000 teachers; ε > 1: 600/100 for 2000), scaled to ``teachers``.
    z_dim: 50 for ε ≤ 1, else 100.  batch: min(batch_size, N // teachers) (official behaviour).
    thresh: T as a fraction of the teacher count; null: no threshold check (every query answered).
    """
    low = eps <= 1.0
    n_t = int(hp.teachers) if hp.teachers is not None else (4000 if low else 2000)
    if n_t < 2:
        raise DpgenError(f"gpate.teachers must be >= 2, got {n_t}")
    if str(hp.noise) not in ("readme", "calibrate"):
        raise DpgenError(f"gpate.noise must be readme or calibrate, got {hp.noise!r}")
    s1 = float(hp.sigma1) if hp.sigma1 is not None else (n_t * (0.75 if low else 0.3) if hp.noise == "readme" else None)
    s2 = float(hp.sigma2) if hp.sigma2 is not None else (n_t * (0.25 if low else 0.05) if hp.noise == "readme" else None)
    if (s1 is None) != (s2 is None):
        raise DpgenError("set both gpate.sigma1 and gpate.sigma2, or neither")
    ratio = hp.get("sigma_ratio")
    ratio = (3.0 if low else 6.0) if ratio is None else float(ratio)
    if not ratio > 0:
        raise DpgenError(f"gpate.sigma_ratio must be > 0, got {ratio}")
    z_dim = int(hp.z_dim) if hp.z_dim is not None else (50 if low else 100)
    batch = min(int(hp.batch_size), n_train // n_t)
    if batch < 1:
        raise DpgenError(f"gpate.teachers={n_t} leaves fewer than one record per teacher (N={n_train}); use fewer teachers")
    if not float(hp.step_size) > 0:
        raise DpgenError(f"gpate.step_size must be > 0, got {hp.step_size}")
    thresh = hp.thresh
    if thresh is not None and not float(thresh) >= 0:
        raise DpgenError(f"gpate.thresh must be >= 0 or null (no threshold check), got {thresh}")
    if int(hp.bins) < 2 or int(hp.proj_dim) < 1:
        raise DpgenError(f"gpate.bins must be >= 2 and gpate.proj_dim >= 1, got {hp.bins}, {hp.proj_dim}")
    if s1 is not None and (s1 <= 0 or s2 <= 0):
        raise DpgenError(f"gpate.sigma1 and gpate.sigma2 must be > 0, got {s1}, {s2}")
    work_size = hp.get("work_size")
    if work_size is not None and (shape is None or len(shape) != 3 or not 4 <= int(work_size) <= shape[1]):
        raise DpgenError(f"gpate.work_size must be null or an image size in [4, {shape[1] if shape else '?'}] "
                         f"(image data only), got {work_size}")
    cfg = {"teachers": n_t, "sigma1": s1, "sigma2": s2, "sigma_ratio": ratio, "z_dim": z_dim, "batch": batch,
           "threshold": None if thresh is None else float(thresh) * n_t, "k": int(hp.proj_dim),
           "bins": int(hp.bins), "c": float(hp.step_size),
           "teacher_norm": _choice(hp, "teacher_norm", TEACHER_NORMS, "batch"),
           "teacher_fakes": _choice(hp, "teacher_fakes", TEACHER_FAKES, "official"),
           "g_sample_stats": _choice(hp, "g_sample_stats", SAMPLE_STATS, "batch"),
           "projection": _choice(hp, "projection", PROJECTIONS, "gaussian"),
           "work_size": None if work_size is None else int(work_size)}
    d = math.prod([shape[0], cfg["work_size"], cfg["work_size"]] if cfg["work_size"] else (shape or [1]))
    n_basis = hp.get("proj_basis")
    if cfg["projection"] == "dct":
        if shape is None or len(shape) != 3:
            raise DpgenError("gpate.projection=dct needs image data")
        n_basis = cfg["k"] if n_basis is None else int(n_basis)
        if not cfg["k"] <= n_basis <= d:
            raise DpgenError(f"gpate.proj_basis must be in [proj_dim={cfg['k']}, {d}], got {n_basis}")
    cfg["proj_basis"] = n_basis
    return cfg


def query_noise(cfg: dict) -> list[float]:
    """The ledger noise multipliers of one query under ``cfg`` (no threshold check: the argmax only)."""
    return rdp.query_noise_multipliers(None if cfg["threshold"] is None else cfg["sigma1"], cfg["sigma2"])


def calibrate_sigmas(ledger: PrivacyLedger, ratio: float, queries: int, threshold: bool = True) -> tuple[float, float]:
    """σ1, σ2 (σ1 = ``ratio``·σ2) so that ``queries`` Confident-GNMax queries (plus earlier entries) meet the
    target ε; ``threshold`` False: GNMax without a threshold check (σ1 is then unused, returned as ratio·σ2)."""
    from dpgen.privacy import LedgerEntry, calibrate_noise_multiplier

    # z = σ2/√2 is the argmax noise multiplier; the threshold's is σ1/1 = ratio·σ2 = ratio·√2·z.
    z = calibrate_noise_multiplier(
        ledger.target_epsilon, ledger.delta,
        lambda z: [LedgerEntry(ENTRY, [ratio * rdp.SQRT2 * z, z] if threshold else [z], count=queries)],
        base=ledger.entries, accountant=ledger.accountant, hi=1e6)
    return ratio * rdp.SQRT2 * z, rdp.SQRT2 * z


def laplace_noise(n: int, scale: float, generator: SecretGenerator) -> torch.Tensor:
    """n draws of Laplace(0, ``scale``) (float64, on the generator's device), by inverse CDF so that they come
    from the run's secret ``generator``."""
    require_secret(generator, "Laplace noise")
    dev = generator.device
    u = torch.rand(n, generator=generator, dtype=torch.float64, device=dev).clamp(1e-12, 1 - 1e-12)
    return torch.distributions.Laplace(torch.zeros((), dtype=torch.float64, device=dev), scale).icdf(u)


def private_class_prior(y: np.ndarray, num_classes: int, eps_prior: float, ledger: PrivacyLedger,
                        generator: SecretGenerator) -> list[float]:
    """Class distribution by the Laplace mechanism (G-PATE §6.2, credit: ε=0.01).

    A record changes one class count by 1 (add/remove-one): L1 sensitivity 1, scale b = 1/ε,
    recorded as a Laplace entry with noise multiplier b/1.
    """
    require_secret(generator, "Laplace class prior")
    counts = torch.bincount(torch.as_tensor(y, device=generator.device), minlength=num_classes).double()
    b = 1.0 / eps_prior
    noise = laplace_noise(num_classes, b, generator)
    ledger.record(PRIOR_ENTRY, [b], mechanism="laplace")
    noisy = (counts + noise).clamp_min(1.0)
    return (noisy / noisy.sum()).tolist()  # once, before training


def _laplace_eps(entries) -> float:
    """Pure-DP ε of the Laplace entries (basic composition), added to the paper ε."""
    return sum(e.count / e.noise_multipliers[0] for e in entries if e.mechanism == "laplace")


class PaperAccountant:
    """G-PATE's data-dependent RDP (``privacy.accounting=paper``) and its stopping rule, without a host sync
    per step.

    The official code adds every query's data-dependent RDP and stops before the iteration whose cost
    would push the classic ε past the target.  Each query costs at most its data-INDEPENDENT RDP, so after
    every exact evaluation :func:`rdp.safe_iterations` says how many iterations certainly stay within
    budget; their vote counts wait on the device and are added (in order, one iteration at a time, so the
    sums do not depend on when they are read) at the next log/checkpoint.  Only iterations that could
    cross the budget are checked exactly, one by one, as the official code does.
    """

    def __init__(self, ledger: PrivacyLedger, cfg: dict, queries_per_iter: int, rdp_cum: np.ndarray) -> None:
        self.ledger, self.cfg = ledger, cfg
        self.rdp_cum = rdp_cum
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        thr = cfg["threshold"] is not None
        self.bound = queries_per_iter * rdp.data_independent_rdp(cfg["sigma1"] if thr else None, cfg["sigma2"])
        self.safe = 0
        ledger.paper_epsilon = lambda entries, delta: rdp.classic_epsilon(self.rdp_cum, delta) + _laplace_eps(entries)
        for note in PAPER_NOTES:
            if note not in ledger.notes:
                ledger.notes.append(note)

    def _rdp(self, counts: np.ndarray, answered: np.ndarray) -> np.ndarray:
        c = self.cfg
        return rdp.data_dependent_rdp(counts, answered, c["threshold"],
                                      c["sigma1"] if c["threshold"] is not None else None, c["sigma2"])

    def flush(self) -> None:
        """Add the waiting iterations' costs, one iteration at a time (one host transfer for all of them:
        only at log/checkpoint time and near the budget)."""
        if self.pending:
            counts = torch.stack([c for c, _ in self.pending]).cpu().numpy()
            answered = torch.stack([a for _, a in self.pending]).cpu().numpy()
            for i in range(len(self.pending)):
                self.rdp_cum += self._rdp(counts[i], answered[i])  # in place: the paper_epsilon closure reads it
            self.pending.clear()
        self._update_safe()

    def _budget(self) -> float:
        return float(self.ledger.target_epsilon) - _laplace_eps(self.ledger.entries)

    def _update_safe(self) -> None:
        self.safe = rdp.safe_iterations(self.rdp_cum, self.bound, self.ledger.delta, self._budget())

    def admit(self, counts: torch.Tensor, answered: torch.Tensor) -> bool:
        """Charge one iteration's queries; False (nothing charged) if its data-dependent ε would exceed the target."""
        if self.safe > 0:
            self.safe -= 1
            self.pending.append((counts, answered))
            return True
        self.flush()
        rdp_it = self._rdp(counts.cpu().numpy(), answered.cpu().numpy())
        if rdp.classic_epsilon(self.rdp_cum + rdp_it, self.ledger.delta) > self._budget():
            return False
        self.rdp_cum += rdp_it
        self._update_safe()
        return True


def train(hp: DictConfig, data: ImageDataset, ledger: PrivacyLedger, run: Run) -> ReleasedGenerator:
    """Alg. 1: teachers trained non-privately; G trained only from DPGradAgg's noisy answers."""
    dev = run.device
    n_train, k_cls, shape = len(data.train), data.num_classes, list(data.shape)
    cfg = resolve_hparams(hp, float(ledger.target_epsilon), n_train, None if data.tabular else shape)
    n_t, m, k = cfg["teachers"], cfg["batch"], cfg["k"]
    work_shape = [shape[0], cfg["work_size"], cfg["work_size"]] if cfg["work_size"] else shape
    queries_per_iter = m * k
    # public: G's latents/labels and the data-independent projections; secret: the GNMax and Laplace noise
    fake_gen, proj_gen, noise_gen = run.rng("fake"), run.rng("proj"), run.secret_rng("noise")
    state = run.resume_state["state"] if run.resume_state else None

    # --- data (only reaches the teachers) and the DP class prior --------------------------------
    if data.tabular:
        x_all = to_model_space(torch.as_tensor(data.train.x, dtype=torch.float32)).to(dev)
    else:
        x_all = to_float(data.train.x).to(dev)
        if work_shape != shape:  # a fixed per-record downsampling (research option gpate.work_size)
            x_all = F.interpolate(x_all, size=tuple(work_shape[1:]), mode="area")
    y_all = torch.as_tensor(data.train.y, dtype=torch.long, device=dev)
    prior = state["prior"] if state else None
    if prior is None and bool(hp.dp_class_prior) and not state:
        prior = private_class_prior(data.train.y, k_cls, float(hp.prior_eps), ledger, noise_gen)
    owner = assign_teachers(data.train.x, n_t, seed=run.seed)
    sampler = PartitionSampler(owner, n_t, dev)

    if state:
        cfg["sigma1"], cfg["sigma2"] = state["cfg"]["sigma1"], state["cfg"]["sigma2"]
    elif ledger.privacy_off:  # eps=inf: the privacy-off reference has no noise whatever gpate.noise says
        cfg["sigma1"], cfg["sigma2"] = 0.0, 0.0
    elif cfg["sigma1"] is None:
        cfg["sigma1"], cfg["sigma2"] = calibrate_sigmas(ledger, cfg["sigma_ratio"], int(hp.iters) * queries_per_iter,
                                                        threshold=cfg["threshold"] is not None)
    nm = query_noise(cfg)
    # an audit run's canaries: teachers of their own voting into reserved bins of every query (dpgen.audit)
    canaries = VoteCanaries(run.audit, ENTRY, cfg["sigma2"], nm) if run.audit else None

    # --- networks ----------------------------------------------------------------------------
    if data.tabular:
        g_net: ReleasedGenerator = GPateTabularGenerator(k_cls, shape, z_dim=cfg["z_dim"], hidden=int(hp.g_hidden),
                                                         class_prior=prior)
        make_teacher = lambda: TeacherMLP(k_cls, shape, hidden=int(hp.t_hidden))  # noqa: E731
    else:
        g_net = GPateGenerator(k_cls, shape, z_dim=cfg["z_dim"], gf_dim=int(hp.gf_dim), gfc_dim=int(hp.gfc_dim),
                               class_prior=prior, sample_stats=cfg["g_sample_stats"], sample_group=m,
                               work_size=cfg["work_size"])
        make_teacher = lambda: TeacherCNN(k_cls, work_shape, df_dim=int(hp.df_dim), dfc_dim=int(hp.dfc_dim),  # noqa: E731
                                          norm=cfg["teacher_norm"])
    g_net = dcgan_init_(g_net).to(dev)  # official initialisation (resumed runs load their weights below)
    # several processes (torchrun): each holds and trains its shard of the teachers; the integer vote histograms
    # are summed over the ranks before the noise, which every rank draws alike from the shared secret stream
    shard = run.dist.shard(n_t)
    ens = TeacherEnsemble(make_teacher, n_t, dev, chunk=balanced_chunk(len(shard), hp.chunk), lr=float(hp.lr),
                          betas=tuple(hp.betas), seed=run.seed, dist=run.dist)
    opt_g = torch.optim.Adam(g_net.parameters(), lr=float(hp.lr), betas=tuple(hp.betas))
    prior_t = torch.tensor(prior, device=dev) if prior is not None else None
    basis = dct_basis(tuple(work_shape), cfg["proj_basis"], dev) if cfg["projection"] == "dct" else None

    # --- privacy plan ----------------------------------------------------------------------------
    paper = ledger.accounting == "paper"
    rdp_cum = np.array(state["rdp_cum"]) if state else np.zeros(len(rdp.PAPER_ORDERS))
    # eps=inf: no data-dependent analysis of noiseless answers (its epsilon is infinite; report_epsilon says so)
    paper_acct = PaperAccountant(ledger, cfg, queries_per_iter, rdp_cum) if paper and not ledger.privacy_off else None
    iters = int(hp.iters)
    guard = None if paper else ledger.budget_guard(ENTRY, nm)
    if guard is not None:
        iters = min(iters, run.start_step + guard.remaining // queries_per_iter)
        if iters < 1:
            raise DpgenError(
                f"epsilon={ledger.target_epsilon} allows {guard.remaining} Confident-GNMax queries, fewer than one "
                f"iteration's {queries_per_iter} (batch {m} x proj_dim {k}); raise gpate.sigma1/sigma2 or eps")
    log.info("gpate: %d teachers (%d params, %d empty, norm %s, fakes %s), batch %d, k=%d (%s projection), B=%d, "
             "c=%g, sigma1=%g sigma2=%g T=%s; %d queries/iteration, %d iterations planned (%s accounting)", n_t,
             ens.num_params, sampler.n_empty, cfg["teacher_norm"], cfg["teacher_fakes"], m, k, cfg["projection"],
             cfg["bins"], cfg["c"], cfg["sigma1"], cfg["sigma2"], cfg["threshold"], queries_per_iter, iters,
             ledger.accounting)
    if run.dist.active:
        log.info("gpate: teachers sharded over %d processes (this one holds %d-%d)", run.dist.world, shard.start,
                 shard.stop - 1)

    def draw_z() -> torch.Tensor:
        return torch.rand(m, cfg["z_dim"], generator=fake_gen, device=dev) * 2 - 1

    def draw_labels() -> torch.Tensor:
        if prior_t is None:
            return torch.randint(0, k_cls, (m,), generator=fake_gen, device=dev)
        return torch.multinomial(prior_t, m, replacement=True, generator=fake_gen)

    def teacher_step(z: torch.Tensor, shared_fake: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """Alg. 1 lines 9–10 for all teachers at once (non-private: teachers are never released).

        Official fakes: teacher i's fakes are G(z, its real batch's labels) with the iteration's z, G's batch
        statistics over that teacher's batch, and nothing written to G (labels are private).
        """
        idx, w = sampler.sample(m)

        def batch(a: int, b: int):
            i = idx[a:b]
            xr, yr = PartitionSampler.gather(x_all, i), PartitionSampler.gather(y_all, i)
            if shared_fake is not None:
                return xr, yr, w[a:b], *shared_fake
            with torch.no_grad():
                zz = z.unsqueeze(0).expand(b - a, -1, -1).reshape((b - a) * m, -1)
                xf = g_net(zz, yr.reshape(-1), group=m)
            return xr, yr, w[a:b], xf.view(b - a, m, *xf.shape[1:]), yr

        return ens.train_step(batch)

    def shared_fakes() -> tuple[torch.Tensor, torch.Tensor] | None:
        if cfg["teacher_fakes"] != "shared":
            return None
        with torch.no_grad():
            y = draw_labels()
            return g_net(draw_z(), y), y

    agreement = torch.zeros((), device=dev)  # running sum over iterations (read once, at the end)
    n_agree = int(state["n_agree"]) if state else 0
    if state:
        g_net.load_state_dict(state["g"])
        opt_g.load_state_dict(state["opt_g"])
        ens.load_state_dict(state["teachers"])
        sampler.load_state_dict(state["sampler"])
        agreement += float(state["agreement_sum"])
        run.restore_rngs()
    else:
        for _ in range(int(hp.teacher_warmup)):
            teacher_step(draw_z(), shared_fakes())

    def snapshot() -> dict:
        if paper_acct is not None:
            paper_acct.flush()
        return {"g": g_net.state_dict(), "opt_g": opt_g.state_dict(), "teachers": ens.state_dict(),
                "sampler": sampler.state_dict(), "rdp_cum": rdp_cum.tolist(), "agreement_sum": float(agreement),
                "n_agree": n_agree, "prior": prior, "cfg": cfg}

    run.start(iters, desc=f"gpate eps<={ledger.target_epsilon:g}")
    it = run.start_step
    while it < iters:
        z, y = draw_z(), draw_labels()
        if cfg["teacher_fakes"] == "shared":  # G(z, y) once: the teachers' fake batch and G's step
            x = g_net(z, y, update_stats=True)
            fake = (x.detach(), y)
        else:
            fake = None
        loss_t = torch.zeros((), device=dev)
        for _ in range(int(hp.d_steps)):
            loss_t = teacher_step(z, fake)
        run.dist.all_reduce_([loss_t])  # each rank's share of the mean teacher loss
        if fake is None:
            x = g_net(z, y, update_stats=True)
        xd = x.detach()
        dx, side = dp_grad_agg(ens.input_grads_chunks(xd, y), tuple(xd.shape[1:]), cfg["c"], cfg["bins"], k,
                               cfg["sigma1"], cfg["sigma2"], cfg["threshold"], proj_gen, noise_gen, m, dev,
                               basis=basis, reduce=run.dist.all_reduce_ if run.dist.active else None,
                               canaries=canaries)
        if guard is None:  # paper: the sound entry is still recorded, sound_epsilon reports it
            ledger.record(ENTRY, nm, count=queries_per_iter)
        else:
            for _ in range(queries_per_iter):  # one threshold check + one argmax per (sample, dimension)
                guard.step()
        if paper_acct is not None and not paper_acct.admit(side["counts"], side["answered"]):
            log.info("paper (data-dependent) epsilon would exceed the target: stopping at iteration %d", it)
            break
        agreement += side["agreement"]
        n_agree += 1
        # Alg. 1 lines 15–17: fit G to x + Δx_priv (Eq. 2; post-processing of the noisy answers).
        target = (xd + dx).detach()
        loss_g = ((x - target) ** 2).flatten(1).sum(1).mean()
        opt_g.zero_grad(set_to_none=True)
        loss_g.backward()
        opt_g.step()
        it += 1
        if paper_acct is not None and it % run.log_every == 0:
            paper_acct.flush()  # the logged epsilon reads every iteration so far
        run.step_done(it, {"loss_g": loss_g.detach(), "loss_t": loss_t, "agreement": side["agreement"],
                           "answer_rate": side["answer_rate"]}, snapshot)
    if n_agree:
        mean_agreement = float(agreement) / n_agree
        log.info("teachers' agreement on the top voted bin: %.4f (mean over %d iterations)", mean_agreement, n_agree)
        run.extra_metrics["teacher_agreement"] = mean_agreement
    run.finish(it, snapshot())
    return g_net.eval()
