"""DP-FETA training (Alg. 3): Stage I central images + warm-up, Stage II DP-SGD fine-tuning.

``central=none`` skips Stage I: that is the DPDM baseline (Dockhorn et al. 2023).
"""
from __future__ import annotations

import copy
import logging

import torch
from omegaconf import DictConfig, OmegaConf
from opacus import GradSampleModule

from dpgen.audit.hooks import DpsgdCanaries
from dpgen.core.run import Run
from dpgen.data.base import ImageDataset
from dpgen.data.torch_utils import image_train_tensors
from dpgen.errors import DpgenError
from dpgen.feta.augment import AugmentBag
from dpgen.feta.central import query_central
from dpgen.core.compile import compile_enabled
from dpgen.feta.dpsgd import (GRAD_BACKENDS, MicroStep, canary_sum, clipped_grad_sum, clipped_grad_sum_func,
                              micro_batch_for, set_noisy_grads, signal_to_noise)
from dpgen.feta.generator import FetaGenerator
from dpgen.nets.edm import edm_loss
from dpgen.privacy import LedgerEntry, PrivacyLedger, calibrate_noise_multiplier
from dpgen.privacy.sampling import poisson_batch

log = logging.getLogger("dpgen")
ENTRY = "feta.dpsgd"


def plan_noise(hp: DictConfig, ledger: PrivacyLedger, q: float, steps: int) -> float:
    """σ_f of DP-SGD: given, or calibrated so that central queries (already in the ledger) + all
    ``steps`` DP-SGD steps meet the target ε exactly (Sec. 3.3, steps (1)–(3))."""
    if hp.noise_multiplier is not None:
        return float(hp.noise_multiplier)
    return calibrate_noise_multiplier(ledger.target_epsilon, ledger.delta,
                                      lambda z: [LedgerEntry(ENTRY, [z], "poisson", q, count=steps)],
                                      base=ledger.entries, accountant=ledger.accountant)


@torch.no_grad()
def ema_update(ema: torch.nn.Module, model: torch.nn.Module, decay: float) -> None:
    for pe, pm in zip(ema.parameters(), model.parameters()):
        pe.lerp_(pm, 1.0 - decay)


def drop_labels(y: torch.Tensor, p: float, null: int, generator: torch.Generator) -> torch.Tensor:
    """Label dropout for classifier-free guidance: each label becomes the null class with probability p."""
    if p <= 0:
        return y
    mask = torch.rand(y.shape, generator=generator, device=y.device) < p
    return torch.where(mask, torch.full_like(y, null), y)


def unet_kwargs(hp: DictConfig) -> dict:
    """UNet settings as JSON-friendly values; ch_mult / attn_res may be lists or comma-separated strings."""
    unet = OmegaConf.to_container(hp.unet, resolve=True)
    for key in ("ch_mult", "attn_res"):
        v = unet.get(key, [])
        try:
            unet[key] = [int(t) for t in (str(v).split(",") if isinstance(v, (str, int)) else v) if str(t).strip()]
        except ValueError:
            raise DpgenError(f"feta.unet.{key} must be a list of integers, got {v!r}") from None
    return unet


def _check(hp: DictConfig, n: int) -> None:
    if str(hp.central) not in ("mean", "mode", "none"):
        raise DpgenError(f"feta.central must be mean, mode or none, got {hp.central!r}")
    if not 0 < int(hp.batch_size) <= n:
        raise DpgenError(f"feta.batch_size={hp.batch_size} must be between 1 and N={n}")
    for key in ("iters", "multiplicity", "micro_batch", "warmup_batch"):
        if key == "micro_batch" and hp[key] is None:  # null: sized from device memory (micro_batch_for)
            continue
        if int(hp[key]) < (0 if key == "iters" else 1):
            raise DpgenError(f"feta.{key} must be positive, got {hp[key]}")
    if float(hp.clip) <= 0:
        raise DpgenError(f"feta.clip must be > 0, got {hp.clip}")
    if str(hp.get("grad_backend", "ghost")) not in GRAD_BACKENDS:
        raise DpgenError(f"feta.grad_backend must be one of {', '.join(GRAD_BACKENDS)}, got {hp.grad_backend!r}")


def train(hp: DictConfig, data: ImageDataset, ledger: PrivacyLedger, run: Run) -> FetaGenerator:
    dev = run.device
    x_all, y_all = image_train_tensors(data, dev, "feta/dpdm")
    n, k, shape = len(x_all), data.num_classes, list(data.shape)
    _check(hp, n)
    central = str(hp.central)
    unet = unet_kwargs(hp)
    sampler = OmegaConf.to_container(hp.sampler, resolve=True)
    model = FetaGenerator(k, shape, unet, sampler, chunk=hp.get("sample_chunk")).to(dev)
    ema = copy.deepcopy(model).requires_grad_(False)
    log.info("feta: UNet with %d parameters, central=%s", sum(p.numel() for p in model.parameters()), central)
    # secret: the central query, DP-SGD's Poisson batches and noise; public: the warm-up on the released central
    # images, their augmentation, and the diffusion draws and label dropout of the loss
    gens = {"central": run.secret_rng("central"), "sample": run.secret_rng("sample"), "noise": run.secret_rng("noise"),
            "warm": run.rng("warm"), "aug": run.rng("aug"), "loss": run.rng("loss")}
    state = run.resume_state["state"] if run.resume_state else None
    warm_iters = int(hp.warmup_iters) if central != "none" else 0
    total = warm_iters + int(hp.iters)

    # ---- Stage I: central images (Alg. 1/2), recorded in the ledger -------------------------------
    if state is not None:
        cx, cy = state["central_x"], state["central_y"]
        cx, cy = (cx.to(dev), cy.to(dev)) if cx is not None else (None, None)
    elif central != "none":
        cx, cy = query_central(central, x_all, y_all, k, num_images=int(hp.num_central), q=int(hp.central_batch) / n,
                               sigma=0.0 if ledger.privacy_off else float(hp.central_sigma), ledger=ledger,
                               generator=gens["central"],
                               clip=hp.central_clip, bins=hp.bins, post=str(hp.get("central_post", "official")))
        log.info("feta: %d %s images queried, epsilon so far %.4f", len(cx), central, ledger.epsilon())
    else:
        cx = cy = None

    q = int(hp.batch_size) / n
    sigma = float(state["sigma"]) if state else plan_noise(hp, ledger, q, int(hp.iters))
    opt_w = torch.optim.Adam(model.parameters(), lr=float(hp.warmup_lr))
    opt = torch.optim.Adam(model.parameters(), lr=float(hp.lr))
    if state:
        model.load_state_dict(state["model"])
        ema.load_state_dict(state["ema"])
        opt_w.load_state_dict(state["opt_w"])
        opt.load_state_dict(state["opt"])
        run.restore_rngs()

    def snapshot() -> dict:
        return {"model": model.state_dict(), "ema": ema.state_dict(), "opt_w": opt_w.state_dict(),
                "opt": opt.state_dict(), "sigma": sigma,
                "central_x": None if cx is None else cx.cpu(), "central_y": None if cy is None else cy.cpu()}

    run.start(total, desc=f"{'dpdm' if central == 'none' else 'feta'} eps<={ledger.target_epsilon:g}")
    step = run.start_step
    drop, null, ema_decay = float(hp.label_dropout), k, float(hp.ema)

    # ---- Stage I: warm-up on augmented central images (Sec. 3.1.3, Eq. 8); post-processing ----------
    bag = AugmentBag(int(hp.aug_ops), int(hp.aug_magnitude))
    while step < warm_iters:
        idx = torch.randint(len(cx), (int(hp.warmup_batch),), generator=gens["warm"], device=dev)
        xb = bag(cx[idx], gens["aug"]) * 2 - 1
        yb = drop_labels(cy[idx], drop, null, gens["warm"])
        loss = edm_loss(model.net, xb, yb, gens["warm"]).mean()
        opt_w.zero_grad(set_to_none=True)
        loss.backward()
        opt_w.step()
        ema_update(ema, model, ema_decay)
        step += 1
        run.step_done(step, {"loss_warm": loss.detach()}, snapshot)  # read every log_every steps only

    # ---- Stage II: DP-SGD fine-tuning (Eq. 9) ----------------------------------------------------
    backend = str(hp.get("grad_backend", "ghost"))  # torchrun: not opacus (checked with the config)
    gsm = GradSampleModule(model.net, loss_reduction="sum") if backend == "opacus" else None
    params = [p for p in model.net.parameters() if p.requires_grad]
    # an audit run's canaries: Poisson-sampled like the records, clipped and noised with them (dpgen.audit)
    canaries = DpsgdCanaries.poisson(run.audit, ENTRY, float(hp.clip), sigma, q, scale=q * n) if run.audit else None
    if canaries is not None:
        params.append(canaries.coordinates)  # noised with the model's parameters
    guard = ledger.budget_guard(ENTRY, [sigma], "poisson", q)
    log.info("feta: DP-SGD q=%.5f sigma=%.4f clip=%g K=%d, %d steps allowed (planned %d)", q, sigma, hp.clip,
             int(hp.multiplicity), guard.remaining, int(hp.iters))

    # the micro-batch step: ghost norms and book-keeping, or torch.func's per-record gradients (compiled under
    # compile=true, dpgen/core/compile.py); feta.micro_batch=null on CUDA measures an eager twin of it on zeros
    graph = bool(hp.get("cuda_graph", False)) and dev.type == "cuda" and gsm is None
    conv = str(hp.get("ghost_conv", "auto"))
    micro_step = None if gsm is not None else \
        MicroStep(model.net, float(hp.clip), compile_enabled(), grad_backend=backend, graph=graph, ghost_conv=conv)
    probe = None if gsm is not None or hp.micro_batch is not None or dev.type != "cuda" else \
        MicroStep(model.net, float(hp.clip), grad_backend=backend, ghost_conv=conv)
    micro = micro_batch_for(model.net, hp.micro_batch, int(hp.multiplicity), shape, int(hp.batch_size), dev,
                            step=probe)
    del probe
    # the ranks split the micro-batches j by j mod W and draw every micro-batch's diffusion noise in the same order:
    # they must agree on the split (each measured its own memory), or a record could be counted twice or not at all
    micro = run.dist.min(micro)
    log.info("feta: %d records per micro-batch (x K=%d rows)%s", micro, int(hp.multiplicity),
             ", replayed from a CUDA graph (feta.cuda_graph)" if graph else "")
    if compile_enabled() and backend != "torch_func":
        log.warning("compile=true: feta.grad_backend=%s runs eagerly (torch.compile cannot trace %s); "
                    "feta.grad_backend=torch_func compiles the DP-SGD step", backend,
                    "opacus' hooks" if gsm is not None else "the output gradients' autograd.grad")

    def loss_fn(xr: torch.Tensor, yr: torch.Tensor) -> torch.Tensor:
        return edm_loss(gsm, xr, yr, gens["loss"])

    while step < total:
        if not guard.allows():
            log.info("privacy budget reached after %d DP-SGD steps", step - warm_iters)
            break
        idx = poisson_batch(n, q, gens["sample"], dev)
        xb = x_all[idx] * 2 - 1
        yb = drop_labels(y_all[idx], drop, null, gens["loss"])
        if gsm is None:
            sums, loss = clipped_grad_sum_func(model.net, xb, yb, int(hp.multiplicity), float(hp.clip),
                                               micro, gens["loss"], run.dist, step=micro_step)
        else:
            sums, loss = clipped_grad_sum(gsm, loss_fn, xb, yb, int(hp.multiplicity), float(hp.clip), micro)
        snr = signal_to_noise(sums, sigma, float(hp.clip))  # the model's coordinates only, before any canary
        if canaries is not None:
            sums.append(canary_sum(canaries, float(hp.clip)))
        set_noisy_grads(params, sums, sigma, float(hp.clip), q * n, gens["noise"])
        if canaries is not None:
            canaries.observe_release()
        opt.step()
        opt.zero_grad(set_to_none=True)
        guard.step()
        ema_update(ema, model, ema_decay)
        step += 1
        run.step_done(step, {"loss": loss, "batch": float(len(idx)), "snr": snr}, snapshot)
    if gsm is not None:
        gsm.remove_hooks()
    run.finish(step, snapshot())
    return ema.eval()
