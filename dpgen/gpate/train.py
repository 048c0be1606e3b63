"""G-PATE training loop (Long et al. 2021, Alg. 1) with sound or paper accounting."""
from __future__ import annotations

import logging

import numpy as np
import torch
from omegaconf import DictConfig

from dpgen.core.generator import ReleasedGenerator
from dpgen.core.run import Run
from dpgen.data.base import ImageDataset
from dpgen.data.torch_utils import to_float
from dpgen.errors import DpgenError
from dpgen.gpate import rdp
from dpgen.gpate.aggregate import dp_grad_agg
from dpgen.gpate.ensemble import PartitionSampler, TeacherEnsemble, assign_teachers, balanced_chunk
from dpgen.gpate.nets import GPateGenerator, GPateTabularGenerator, TeacherCNN, TeacherMLP, to_model_space
from dpgen.privacy import PrivacyLedger

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


def resolve_hparams(hp: DictConfig, eps: float, n_train: int) -> dict:
    """Fill the ε-dependent defaults (null keys) with the official README's MNIST settings.

    sigma1/sigma2 null with ``noise=calibrate``: left None here; :func:`calibrate_sigmas` then picks σ2
    (σ1 = README ratio × σ2: 3 for ε ≤ 1, 6 otherwise) so that ``iters`` iterations meet ε exactly.

    teachers: 4000 for ε ≤ 1, else 2000.  sigma1/sigma2: the README ratios to the teacher count
    (ε ≤ 1: 3000/1000 for 4000 teachers; ε > 1: 600/100 for 2000), scaled to ``teachers``.
    z_dim: 50 for ε ≤ 1, else 100.  batch: min(batch_size, N // teachers) (official behaviour).
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
    z_dim = int(hp.z_dim) if hp.z_dim is not None else (50 if low else 100)
    batch = min(int(hp.batch_size), n_train // n_t)
    if batch < 1:
        raise DpgenError(f"gpate.teachers={n_t} leaves fewer than one record per teacher (N={n_train}); use fewer teachers")
    for key in ("step_size", "thresh"):
        if not float(hp[key]) > 0:
            raise DpgenError(f"gpate.{key} must be > 0, got {hp[key]}")
    if int(hp.bins) < 2 or int(hp.proj_dim) < 1:
        raise DpgenError(f"gpate.bins must be >= 2 and gpate.proj_dim >= 1, got {hp.bins}, {hp.proj_dim}")
    if s1 is not None and (s1 <= 0 or s2 <= 0):
        raise DpgenError(f"gpate.sigma1 and gpate.sigma2 must be > 0, got {s1}, {s2}")
    return {"teachers": n_t, "sigma1": s1, "sigma2": s2, "z_dim": z_dim, "batch": batch,
            "threshold": float(hp.thresh) * n_t, "k": int(hp.proj_dim), "bins": int(hp.bins), "c": float(hp.step_size)}


def calibrate_sigmas(ledger: PrivacyLedger, eps_low: bool, queries: int) -> tuple[float, float]:
    """σ1, σ2 so that ``queries`` Confident-GNMax queries (plus earlier entries) meet the target ε."""
    from dpgen.privacy import LedgerEntry, calibrate_noise_multiplier

    ratio = 3.0 if eps_low else 6.0
    # z = σ2/√2 is the argmax noise multiplier; the threshold's is σ1/1 = ratio·σ2 = ratio·√2·z.
    z = calibrate_noise_multiplier(ledger.target_epsilon, ledger.delta,
                                   lambda z: [LedgerEntry(ENTRY, [ratio * rdp.SQRT2 * z, z], count=queries)],
                                   base=ledger.entries, accountant=ledger.accountant, hi=1e6)
    return ratio * rdp.SQRT2 * z, rdp.SQRT2 * z


def private_class_prior(y: np.ndarray, num_classes: int, eps_prior: float, ledger: PrivacyLedger,
                        generator: torch.Generator) -> list[float]:
    """Class distribution by the Laplace mechanism (G-PATE §6.2, credit: ε=0.01).

    A record changes one class count by 1 (add/remove-one): L1 sensitivity 1, scale b = 1/ε,
    recorded as a Laplace entry with noise multiplier b/1.
    """
    counts = torch.bincount(torch.as_tensor(y), minlength=num_classes).double()
    b = 1.0 / eps_prior
    lap = torch.distributions.Laplace(0.0, b)
    u = torch.rand(num_classes, generator=generator, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
    noise = lap.icdf(u)  # inverse-CDF so the draw uses the run's seeded generator
    ledger.record(PRIOR_ENTRY, [b], mechanism="laplace")
    noisy = (counts + noise).clamp_min(1.0)
    return (noisy / noisy.sum()).tolist()


def _laplace_eps(entries) -> float:
    """Pure-DP ε of the Laplace entries (basic composition), added to the paper ε."""
    return sum(e.count / e.noise_multipliers[0] for e in entries if e.mechanism == "laplace")


def train(hp: DictConfig, data: ImageDataset, ledger: PrivacyLedger, run: Run) -> ReleasedGenerator:
    """Alg. 1: teachers trained non-privately; G trained only from DPGradAgg's noisy answers."""
    dev = run.device
    n_train, k_cls, shape = len(data.train), data.num_classes, list(data.shape)
    cfg = resolve_hparams(hp, float(ledger.target_epsilon), n_train)
    n_t, m, k = cfg["teachers"], cfg["batch"], cfg["k"]
    queries_per_iter = m * k
    gens = {"sample": run.torch_generator(1), "fake": run.torch_generator(2), "proj": run.torch_generator(3),
            "noise": run.torch_generator(4)}
    state = run.resume_state["state"] if run.resume_state else None

    # --- data (only reaches the teachers) and the DP class prior --------------------------------
    if data.tabular:
        x_all = to_model_space(torch.as_tensor(data.train.x, dtype=torch.float32)).to(dev)
    else:
        x_all = to_float(data.train.x).to(dev)
    y_all = torch.as_tensor(data.train.y, dtype=torch.long, device=dev)
    prior = state["prior"] if state else None
    if prior is None and bool(hp.dp_class_prior) and not state:
        prior = private_class_prior(data.train.y, k_cls, float(hp.prior_eps), ledger, gens["noise"])
    owner = assign_teachers(data.train.x, n_t, seed=run.seed)
    sampler = PartitionSampler(owner, n_t, dev)

    if state:
        cfg["sigma1"], cfg["sigma2"] = state["cfg"]["sigma1"], state["cfg"]["sigma2"]
    elif cfg["sigma1"] is None:
        cfg["sigma1"], cfg["sigma2"] = calibrate_sigmas(ledger, float(ledger.target_epsilon) <= 1.0,
                                                        int(hp.iters) * queries_per_iter)
    nm = rdp.query_noise_multipliers(cfg["sigma1"], cfg["sigma2"])

    # --- networks ----------------------------------------------------------------------------
    if data.tabular:
        g_net: ReleasedGenerator = GPateTabularGenerator(k_cls, shape, z_dim=cfg["z_dim"], hidden=int(hp.g_hidden),
                                                         class_prior=prior)
        make_teacher = lambda: TeacherMLP(k_cls, shape, hidden=int(hp.t_hidden))  # noqa: E731
    else:
        g_net = GPateGenerator(k_cls, shape, z_dim=cfg["z_dim"], gf_dim=int(hp.gf_dim), gfc_dim=int(hp.gfc_dim),
                               class_prior=prior)
        make_teacher = lambda: TeacherCNN(k_cls, shape, df_dim=int(hp.df_dim), dfc_dim=int(hp.dfc_dim))  # noqa: E731
    g_net = g_net.to(dev)
    ens = TeacherEnsemble(make_teacher, n_t, dev, chunk=balanced_chunk(n_t, hp.chunk), lr=float(hp.lr),
                          betas=tuple(hp.betas), seed=run.seed)
    opt_g = torch.optim.Adam(g_net.parameters(), lr=float(hp.lr), betas=tuple(hp.betas))
    prior_t = torch.tensor(prior, device=dev) if prior is not None else None

    # --- privacy plan ----------------------------------------------------------------------------
    paper = ledger.accounting == "paper"
    rdp_cum = np.array(state["rdp_cum"]) if state else np.zeros(len(rdp.PAPER_ORDERS))
    if paper:
        ledger.paper_epsilon = lambda entries, delta: rdp.classic_epsilon(rdp_cum, delta) + _laplace_eps(entries)
        for note in PAPER_NOTES:
            if note not in ledger.notes:
                ledger.notes.append(note)
    iters = int(hp.iters)
    guard = None if paper else ledger.budget_guard(ENTRY, nm)
    if guard is not None:
        iters = min(iters, run.start_step + guard.remaining // queries_per_iter)
        if iters < 1:
            raise DpgenError(
                f"epsilon={ledger.target_epsilon} allows {guard.remaining} Confident-GNMax queries, fewer than one "
                f"iteration's {queries_per_iter} (batch {m} x proj_dim {k}); raise gpate.sigma1/sigma2 or eps")
    log.info("gpate: %d teachers (%d params, %d empty), batch %d, k=%d, B=%d, c=%g, sigma1=%g sigma2=%g T=%g; "
             "%d queries/iteration, %d iterations planned (%s accounting)", n_t, ens.num_params, sampler.n_empty, m,
             k, cfg["bins"], cfg["c"], cfg["sigma1"], cfg["sigma2"], cfg["threshold"], queries_per_iter, iters,
             ledger.accounting)

    def fake_batch(b: int) -> tuple[torch.Tensor, torch.Tensor]:
        if prior_t is None:
            y = torch.randint(0, k_cls, (b,), generator=gens["fake"], device=dev)
        else:
            y = torch.multinomial(prior_t, b, replacement=True, generator=gens["fake"])
        z = torch.rand(b, cfg["z_dim"], generator=gens["fake"], device=dev) * 2 - 1
        return z, y

    def teacher_step() -> float:
        """Alg. 1 lines 9–10 for all teachers at once (non-private: teachers are never released)."""
        idx, w = sampler.sample(m, gens["sample"])
        with torch.no_grad():
            z, y = fake_batch(m)
            xf = g_net(z, y)
        return ens.train_step(x_all[idx], y_all[idx], w, xf, y)

    agreement: list[float] = list(state["agreement"]) if state else []
    if state:
        g_net.load_state_dict(state["g"])
        opt_g.load_state_dict(state["opt_g"])
        ens.load_state_dict(state["teachers"])
        run.restore_generators(gens)
    else:
        for _ in range(int(hp.teacher_warmup)):
            teacher_step()

    def snapshot() -> dict:
        return {"g": g_net.state_dict(), "opt_g": opt_g.state_dict(), "teachers": ens.state_dict(),
                "rdp_cum": rdp_cum.tolist(), "agreement": agreement, "prior": prior, "cfg": cfg}

    run.start(iters, desc=f"gpate eps<={ledger.target_epsilon:g}")
    it = run.start_step
    while it < iters:
        loss_t = 0.0
        for _ in range(int(hp.d_steps)):
            loss_t = teacher_step()
        z, y = fake_batch(m)
        x = g_net(z, y)
        xd = x.detach()
        dx, side = dp_grad_agg(ens.input_grads_chunks(xd, y), tuple(xd.shape[1:]), cfg["c"], cfg["bins"], k,
                               cfg["sigma1"], cfg["sigma2"], cfg["threshold"], gens["proj"], gens["noise"], m, dev)
        if guard is None:  # paper: the sound entry is still recorded, sound_epsilon reports it
            ledger.record(ENTRY, nm, count=queries_per_iter)
        else:
            for _ in range(queries_per_iter):  # one threshold check + one argmax per (sample, dimension)
                guard.step()
        rdp_it = rdp.data_dependent_rdp(side["counts"].numpy(), side["answered"].numpy(), cfg["threshold"],
                                        cfg["sigma1"], cfg["sigma2"])
        if paper and rdp.classic_epsilon(rdp_cum + rdp_it, ledger.delta) + _laplace_eps(ledger.entries) \
                > float(ledger.target_epsilon):
            log.info("paper (data-dependent) epsilon would exceed the target: stopping at iteration %d", it)
            break
        rdp_cum += rdp_it  # in place: the paper_epsilon closure reads this array
        agreement.append(side["agreement"])
        # Alg. 1 lines 15–17: fit G to x + Δx_priv (Eq. 2; post-processing of the noisy answers).
        target = (xd + dx).detach()
        loss_g = ((x - target) ** 2).flatten(1).sum(1).mean()
        opt_g.zero_grad(set_to_none=True)
        loss_g.backward()
        opt_g.step()
        it += 1
        run.step_done(it, {"loss_g": loss_g.item(), "loss_t": loss_t, "agreement": side["agreement"],
                           "answer_rate": side["answer_rate"]}, snapshot, gens)
    if agreement:
        log.info("teachers' agreement on the top voted bin: %.4f (mean over %d iterations)", float(np.mean(agreement)),
                 len(agreement))
        run.extra_metrics["teacher_agreement"] = float(np.mean(agreement))
    run.finish(it, snapshot(), gens)
    return g_net.eval()
