"""DPAF training, Algorithm 1: phase 1 trains C (conv1 by DP-SGD), phase 2 trains D asymmetrically
(conv3*/FC* on DPAGG outputs every batch, conv2* by DP-SGD every μ batches) and G through D̂."""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from opacus import GradSampleModule
from torch import nn

from dpgen.audit.hooks import DpsgdCanaries, FeatureCanaries
from dpgen.core.checkpoint import set_rng_state
from dpgen.core.run import Run
from dpgen.data.base import ImageDataset
from dpgen.data.torch_utils import to_float
from dpgen.dpaf.accounting import CONV1, Budget, parse_noise_multipliers, parse_split
from dpgen.dpaf.mechanisms import CompressedDPOptimizer, dpagg, schedule, split_group
from dpgen.dpaf.nets import DpafNet, resolve_layers
from dpgen.errors import DpgenError
from dpgen.nets.dcgan import CondGenerator
from dpgen.privacy import PrivacyLedger
from dpgen.privacy.sampling import PoissonSampler

log = logging.getLogger("dpgen")


def _check(hp: DictConfig, data: ImageDataset) -> None:
    if data.tabular:
        raise DpgenError("dpaf trains image GANs; dataset credit is tabular (use method=gpate)")
    if hp.conv1 not in ("transfer", "random", "joint"):
        raise DpgenError(f"dpaf.conv1 must be transfer, random or joint, got {hp.conv1!r}")
    if int(hp.mu) < 1 or int(hp.n_critic) < 1:
        raise DpgenError(f"dpaf.mu and dpaf.n_critic must be >= 1, got {hp.mu}, {hp.n_critic}")
    if not 0 < float(hp.gc_keep) <= 1:
        raise DpgenError(f"dpaf.gc_keep must be in (0, 1], got {hp.gc_keep}")
    n = len(data.train)
    for key in ("batch_size", "c_batch_size"):
        if not 1 <= int(hp[key]) <= n:
            raise DpgenError(f"dpaf.{key}={hp[key]} must be between 1 and N={n}")


def _dp_opt(params, hp: DictConfig, lr: float, sigma: float, clip: float, batch: float, gen: torch.Generator,
            canaries: DpsgdCanaries | None = None) -> CompressedDPOptimizer:
    return CompressedDPOptimizer(torch.optim.Adam(params, lr=lr, betas=tuple(hp.betas)), noise_multiplier=sigma,
                                 max_grad_norm=clip, expected_batch_size=max(1, int(round(batch))),
                                 loss_reduction="sum", generator=gen, keep=float(hp.gc_keep), canaries=canaries)


def c_loss(c_net: DpafNet, x: torch.Tensor, y: torch.Tensor, k: int, batch: int, paper: bool, eps: float) -> torch.Tensor:
    """L_MSE of C (Alg. 1 line 3). paper: C predicts the class proportions of the batch from AGG of its
    features. sound: the same task for batches of one, i.e. per-sample MSE to the one-hot label, so that
    each sample's gradient depends on that sample only."""
    f = c_net.features(x, sin_eps=eps)
    if paper:
        pred = torch.softmax(c_net.score(f.sum(0, keepdim=True) / batch), dim=1)[0]
        target = F.one_hot(y, k).sum(0).to(pred.dtype) / max(len(y), 1)  # not bincount: that syncs on CUDA
        return (pred - target).pow(2).sum()
    pred = torch.softmax(c_net.score(f), dim=1)
    return (pred - F.one_hot(y, k).to(pred.dtype)).pow(2).sum()


def _sampler(run: Run, n: int, q: float, phase: int, steps: int) -> PoissonSampler:
    """Phase ``phase``'s Poisson batches from a secret stream of its own (see PoissonSampler), drawn
    ``log_every`` steps per device round trip (at most the phase's ``steps``, and ~4M random draws)."""
    return PoissonSampler(n, q, run.secret_rng(f"poisson{phase}"), max(1, min(run.log_every, steps, 4_000_000 // n)),
                          run.device)


def _stats(opt: CompressedDPOptimizer, tag: str) -> dict[str, torch.Tensor]:
    """Per-step diagnostics of a tracked DP-SGD step (device tensors; Run reads them at log steps only)."""
    out = {}
    if "grad_norm_median" in opt.stats:
        out[f"gnorm_{tag}"] = opt.stats["grad_norm_median"]
    if opt.noise_multiplier > 0 and "signal" in opt.stats:
        out[f"snr_{tag}"] = opt.signal_to_noise()
    return out


def train(hp: DictConfig, data: ImageDataset, ledger: PrivacyLedger, run: Run) -> CondGenerator:
    """Algorithm 1 of DPAF (paper) or its sound variant (see dpgen.dpaf docstring)."""
    _check(hp, data)
    dev, paper = run.device, ledger.accounting == "paper"
    x_all = to_float(data.train.x).to(dev)
    y_all = torch.as_tensor(data.train.y, dtype=torch.long, device=dev)
    n, k, shape = len(x_all), data.num_classes, list(data.shape)
    layers = resolve_layers(hp.layers, shape[1])
    mu, n_critic, bsz, bc = int(hp.mu), int(hp.n_critic), int(hp.batch_size), int(hp.c_batch_size)
    eps_sin = float(hp.sin_eps)
    train_c = hp.conv1 == "transfer" and layers[0] > 0
    t1 = int(-(-float(hp.c_epochs) * n // bc)) if train_c else 0
    groups = max(1, int(-(-float(hp.d_epochs) * n // (mu * bsz))))
    q1, q = bc / n, bsz / n
    split = parse_split(list(hp.split), hp.split_unit, float(ledger.target_epsilon), train_c)
    fixed = parse_noise_multipliers(hp.get("noise_multipliers"), train_c)
    budget = Budget(ledger, split, mu, q1, t1, q, groups, fixed)
    net_kw = dict(width=int(hp.width), fc_hidden=int(hp.fc_hidden), activation=hp.activation)
    g_split, g_noise = run.secret_rng("split"), run.secret_rng("noise")
    g_agg, g_fake = run.secret_rng("agg"), run.rng("fake")
    state = run.resume_state["state"] if run.resume_state else None
    run.restore_rngs()
    step = run.start_step
    run.start(t1 + groups, desc=f"dpaf eps<={ledger.target_epsilon:g}")

    # ---- phase 1: C (Alg. 1 lines 2-4) --------------------------------------------------------------
    c_net = DpafNet(shape, layers, out_dim=k, **net_kw).to(dev)
    if run.resume_state:
        # building C drew from the global RNG that Run just restored: restore it again so that what follows
        # (D/G init at the phase boundary) draws exactly what the uninterrupted run drew
        set_rng_state(run.resume_state["rng"])
    z1 = float(state["z1"]) if state and state.get("z1") is not None else (budget.conv1_sigma() if t1 else None)
    if step < t1:
        sample_c = _sampler(run, n, q1, 1, t1)
        # paper: only conv1 by DP-SGD, conv2/conv3/FC by plain SGD (line 4); sound: all of C by DP-SGD.
        dp_part = c_net if not paper else c_net.conv1
        gsm_c = GradSampleModule(dp_part, loss_reduction="sum")  # noqa: F841 (keeps the per-sample hooks alive)
        # an audit run's canaries: Poisson-sampled like the records, clipped and noised with them (dpgen.audit)
        c_canaries = DpsgdCanaries.poisson(run.audit, CONV1, float(hp.clip_c), z1, q1) if run.audit else None
        opt_c = _dp_opt(dp_part.parameters(), hp, float(hp.lr_c), z1, float(hp.clip_c), bc, g_noise, c_canaries)
        plain = [p for m in (c_net.conv2, c_net.head) for p in m.parameters()] if paper else []
        opt_plain = torch.optim.Adam(plain, lr=float(hp.lr_c), betas=tuple(hp.betas)) if plain else None
        if state:
            c_net.load_state_dict(state["c"])
            opt_c.original_optimizer.load_state_dict(state["opt_c"])
            if opt_plain:
                opt_plain.load_state_dict(state["opt_plain"])
        budget.start_conv1(z1)
        log.info("dpaf phase 1: %d DP-SGD steps of C, q=%.5f z1=%.4f (eps1=%.4g)", t1, q1, z1, split.eps1)

        def snap_c() -> dict:
            return {"c": c_net.state_dict(), "opt_c": opt_c.original_optimizer.state_dict(), "z1": z1,
                    "opt_plain": opt_plain.state_dict() if opt_plain else None}
        while step < t1:
            if not budget.conv1_step():
                raise DpgenError("dpaf: privacy budget exhausted in phase 1; lower dpaf.c_epochs or raise eps")
            idx = sample_c(step)
            opt_c.zero_grad(set_to_none=True)
            if opt_plain:
                opt_plain.zero_grad(set_to_none=True)
            opt_c.track = (step + 1) % run.log_every == 0
            loss = torch.zeros((), device=dev)
            if len(idx):  # len() of a tensor: its size is known on the host, no sync
                loss = c_loss(c_net, x_all[idx], y_all[idx], k, bc, paper, eps_sin)
                loss.backward()
                opt_c.step()
                if opt_plain:
                    opt_plain.step()
            else:
                opt_c.empty_step()
            step += 1
            run.step_done(step, {"loss_c": loss.detach() / max(len(idx), 1), **_stats(opt_c, "c")}, snap_c)
        state = None  # phase 2 starts fresh from C's conv1
    elif state is not None and "d" not in state:
        # resumed from the checkpoint of phase 1's last step (step == t1): only C exists yet
        c_net.load_state_dict(state["c"])
        state = None

    # ---- phase 2: D and G (Alg. 1 lines 5-16) -------------------------------------------------------
    d_net = DpafNet(shape, layers, out_dim=1, num_classes_in=k, **net_kw).to(dev)
    if hp.conv1 == "random":
        for p in d_net.conv1.parameters():  # Table IV: N(0, 0.02) weights, never updated
            nn.init.normal_(p, 0.0, 0.02) if p.dim() > 1 else nn.init.zeros_(p)
    elif train_c:
        d_net.conv1.load_state_dict(c_net.conv1.state_dict())  # line 5: conv1* <- conv1
    joint = hp.conv1 == "joint"
    for p in d_net.conv1.parameters():
        p.requires_grad_(joint)
    dp_block = nn.ModuleList([d_net.conv1, d_net.conv2]) if joint else d_net.conv2
    gsm = GradSampleModule(dp_block, loss_reduction="sum")
    gsm.disable_hooks()
    g_net = CondGenerator(k, shape, z_dim=int(hp.z_dim), width=int(hp.g_width)).to(dev)
    z3, z2 = (float(state["z3"]), float(state["z2"])) if state else budget.group_sigmas()
    # an audit run's canaries: sampled with the group (rate rho), one feature row in DPAGG sum j mod mu and one
    # per-sample gradient in its conv2* step, both before their bounds (dpgen.audit)
    agg_canaries = (FeatureCanaries(run.audit, "dpaf.dpagg", d_net.sensitivity, z3, budget.rho, mu)
                    if run.audit else None)
    d2_canaries = (DpsgdCanaries(run.audit, "dpaf.conv2", float(hp.clip_d), z2, lambda: agg_canaries.sampled,
                                 group=agg_canaries.group) if run.audit else None)
    opt_d2 = _dp_opt(dp_block.parameters(), hp, float(hp.lr_d), z2, float(hp.clip_d), mu * bsz, g_noise, d2_canaries)
    opt_head = torch.optim.Adam(d_net.head.parameters(), lr=float(hp.lr_d), betas=tuple(hp.betas))
    opt_g = torch.optim.Adam(g_net.parameters(), lr=float(hp.lr_g), betas=tuple(hp.betas))
    if state:
        set_rng_state(run.resume_state["rng"])  # as above: the fresh D/G init drew from the restored RNG
        d_net.load_state_dict(state["d"])
        g_net.load_state_dict(state["g"])
        opt_d2.original_optimizer.load_state_dict(state["opt_d2"])
        opt_head.load_state_dict(state["opt_head"])
        opt_g.load_state_dict(state["opt_g"])
    budget.start_groups(z3, z2)
    sens = d_net.sensitivity
    log.info("dpaf phase 2: %d groups of mu=%d batches, rho=%.5f, DPAGG z3=%.4f (sensitivity %.4g), conv2* z2=%.4f",
             groups, mu, budget.rho, z3, sens, z2)

    ms_weight = float(hp.get("mode_seeking", 0.0))

    def fake(m: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, k, (m,), generator=g_fake, device=dev)
        z = torch.randn(m, g_net.z_dim, generator=g_fake, device=dev)
        return g_net(z, y), y

    def snap_d() -> dict:
        return {"d": d_net.state_dict(), "g": g_net.state_dict(), "opt_d2": opt_d2.original_optimizer.state_dict(),
                "opt_head": opt_head.state_dict(), "opt_g": opt_g.state_dict(), "z1": z1, "z3": z3, "z2": z2}

    loss_d = loss_d2 = loss_g = torch.zeros((), device=dev)
    one, zero = torch.ones(1, device=dev), torch.zeros(1, device=dev)
    sample_d = _sampler(run, n, budget.rho, 2, groups)
    while step < t1 + groups:
        if not budget.group_step():
            log.info("privacy budget reached after %d groups", step - t1)
            break
        g = step - t1
        idx = sample_d(g)
        subs = split_group(idx, mu, g_split)
        if agg_canaries is not None:
            agg_canaries.start_group()
        with torch.no_grad():  # the μ DPAGG releases of this group (conv1/conv2* are fixed within it)
            real_aggs = [dpagg(d_net.features(x_all[s], y_all[s], eps_sin), sens, z3, bsz, g_agg, agg_canaries, j)
                         for j, s in enumerate(subs)]
        fakes = []  # the fake halves of the group's μ batches, which conv2*'s step reuses (Alg. 1 line 9)
        for j in range(mu):
            # L_BCE on D with DPAGG: conv3* and FC* by SGD (post-processing of DPAGG), line 10/13
            with torch.no_grad():
                xf, yf = fake(bsz)
                fakes.append((xf, yf))
                fake_agg = dpagg(d_net.features(xf, yf, eps_sin), sens, z3, bsz, g_agg)
            opt_head.zero_grad(set_to_none=True)
            loss_d = (F.binary_cross_entropy_with_logits(d_net.score(real_aggs[j]), one)
                      + F.binary_cross_entropy_with_logits(d_net.score(fake_agg), zero))
            loss_d.backward()
            opt_head.step()
            ups = schedule(g * mu + j + 1, mu, n_critic)
            if "conv2" in ups:
                opt_d2.track = (step + 1) % run.log_every == 0
                loss_d2 = conv2_step(d_net, gsm, opt_d2, x_all, y_all, subs, idx, fakes, paper, eps_sin)
            if "G" in ups:  # L''_BCE through D̂ (no aggregation), line 15
                opt_g.zero_grad(set_to_none=True)
                loss_g = generator_loss(g_net, d_net, bsz, k, ms_weight, g_fake, eps_sin)
                loss_g.backward()
                opt_g.step()
        step += 1
        run.step_done(step, {"loss_d": loss_d.detach() / 2, "loss_d2": loss_d2, "loss_g": loss_g.detach(),
                             **_stats(opt_d2, "d2")}, snap_d)
    run.finish(step, snap_d())
    return g_net.eval()


def generator_loss(g_net: CondGenerator, d_net: DpafNet, bsz: int, k: int, ms_weight: float,
                   gen: torch.Generator, eps: float) -> torch.Tensor:
    """L''_BCE of G through D̂ (Alg. 1 line 15), plus, if ``ms_weight`` > 0, the mode-seeking term of MSGAN
    (Mao et al. 2019, Eq. 3) as in dpgen.dpgan: pairs of codes with the same label, rewarding
    |G(z1,y) − G(z2,y)| / |z1 − z2| against per-class mode collapse. G's loss touches no private data
    directly (D̂ is already private), so the term is post-processing and costs no budget."""
    dev = next(g_net.parameters()).device
    if ms_weight <= 0:
        y = torch.randint(0, k, (bsz,), generator=gen, device=dev)
        z = torch.randn(bsz, g_net.z_dim, generator=gen, device=dev)
    else:
        half = max(1, bsz // 2)
        y = torch.randint(0, k, (half,), generator=gen, device=dev).repeat(2)
        z = torch.randn(2 * half, g_net.z_dim, generator=gen, device=dev)
    x = g_net(z, y)
    loss = F.binary_cross_entropy_with_logits(d_net.score(d_net.features(x, y, eps)), torch.ones(len(y), device=dev))
    if ms_weight > 0:
        dx = (x[:half] - x[half:]).abs().flatten(1).mean(1)
        dz = (z[:half] - z[half:]).abs().mean(1)
        loss = loss + ms_weight / ((dx / dz).mean() + 1e-5)
    return loss


def conv2_step(d_net: DpafNet, gsm: GradSampleModule, opt: CompressedDPOptimizer, x_all: torch.Tensor,
               y_all: torch.Tensor, subs: list[torch.Tensor], idx: torch.Tensor,
               fakes: list[tuple[torch.Tensor, torch.Tensor]], paper: bool, eps: float) -> torch.Tensor:
    """DPSGD(ε2) of conv2* on the group's μ batches (Alg. 1 line 11), real rows labelled 1, the μ batches'
    fake rows (``fakes``, generated for the conv3*/FC* steps of the same batches, line 9) labelled 0.

    paper: L'_BCE on D̂ with AGG (no noise) per batch, as published (the aggregation couples samples).
    sound: per-sample BCE through D̂ without aggregation, so clipping bounds each record's contribution by C.
    """
    mu = len(subs)
    xf, yf = torch.cat([f[0] for f in fakes]), torch.cat([f[1] for f in fakes])
    gsm.enable_hooks()
    opt.zero_grad(set_to_none=True)
    if paper:
        order = torch.cat(subs)
        feats = d_net.features(torch.cat([x_all[order], xf]), torch.cat([y_all[order], yf]), eps)
        sizes = [len(s) for s in subs] + [len(fb[0]) for fb in fakes]
        bsz = len(fakes[0][0])  # the expected batch size B (a fake batch has exactly B rows)
        aggs = torch.cat([c.sum(0, keepdim=True) / bsz for c in torch.split(feats, sizes)])
        target = torch.cat([torch.ones(mu, device=feats.device), torch.zeros(mu, device=feats.device)])
        loss = F.binary_cross_entropy_with_logits(d_net.score(aggs), target, reduction="sum")
    else:
        logits = d_net.score(d_net.features(torch.cat([x_all[idx], xf]), torch.cat([y_all[idx], yf]), eps))
        target = torch.cat([torch.ones(len(idx), device=logits.device), torch.zeros(len(xf), device=logits.device)])
        loss = F.binary_cross_entropy_with_logits(logits, target, reduction="sum")
    loss.backward()
    opt.step()
    gsm.disable_hooks()
    opt.zero_grad(set_to_none=True)
    return loss.detach() / (2 * mu if paper else max(len(target), 1))
