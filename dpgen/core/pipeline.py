"""One training job end to end: validate → data → ledger → method → release → evaluate.

Writes the run-directory contract (docs/usage.md, "Run outputs"): generator.pt, samples.png,
privacy.json, metrics.json and checkpoints/last.pt next to Hydra's .hydra/ and train.log.
"""
from __future__ import annotations

import logging
import math
import random
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from dpgen.io import atomic_write_json
from dpgen.core.checkpoint import fingerprint_diff
from dpgen.core.compile import compiling
from dpgen.core.dist import Dist, from_env
from dpgen.core.host import keep_freed_memory
from dpgen.core.generator import ReleasedGenerator, balanced_labels, load_generator, save_generator
from dpgen.core.methods import load_method
from dpgen.core.precision import run_precision
from dpgen.core.resume import resume_dir
from dpgen.core.run import Run
from dpgen.data import load_config_dataset
from dpgen.data.base import ImageDataset
from dpgen.data.torch_utils import to_uint8
from dpgen.errors import DpgenError
from dpgen.privacy import PrivacyLedger, check_delta, parse_epsilon

log = logging.getLogger("dpgen")


def quiet_known_noise() -> None:
    """Silence two known-harmless messages in every process that trains (sweep workers too, which do not
    run scripts/train.py's module code): dp-accounting's "failed to converge ... excluding this order"
    (an excluded RDP order only loosens the bound) and opacus' full-backward-hook warning on real images
    (their inputs need no gradient)."""
    import warnings

    logging.getLogger("absl").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="Full backward hook is firing")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DpgenError(f"device={name} requested but CUDA is not available; use device=auto or device=cpu")
    if name not in ("cpu",) and not name.startswith("cuda"):
        raise DpgenError(f"device must be auto, cpu or cuda[:i], not {name!r}")
    return torch.device(name)


def set_threads(threads) -> None:
    """Cap torch's CPU threads (parallel sweep jobs on a small machine otherwise oversubscribe it)."""
    if threads is not None:
        torch.set_num_threads(int(threads))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def validate(cfg: DictConfig, data: ImageDataset | None = None) -> None:
    """Every config value against the schema (:func:`dpgen.core.schema.check_config`): types, ranges, choices,
    the registered method. With ``data``, also the rules that need it (δ < 1/N, batches <= N, image sizes)."""
    from dpgen.core.schema import Facts, check_config

    facts = Facts() if data is None else Facts(len(data.train), tuple(data.shape), bool(data.tabular))
    check_config(cfg, facts)
    if data is not None:
        check_delta(float(cfg.delta), len(data.train))


def fingerprint(cfg: DictConfig) -> dict:
    """The settings a resumed run must share with the original (privacy-relevant ones first)."""
    return {
        "method": cfg.method.name, "dataset": cfg.dataset.name, "eps": parse_epsilon(cfg.eps), "delta": float(cfg.delta),
        "seed": int(cfg.seed), "profile": cfg.profile, "accounting": cfg.privacy.accounting,
        "accountant": cfg.privacy.accountant, "noise_seed": cfg.privacy.noise_seed,
        "secure_noise": bool(cfg.privacy.secure_noise),
        # a resumed run continues the same arithmetic (bit-exact resume); cudnn_benchmark only picks kernels
        "precision": str(cfg.precision),
        "hparams": OmegaConf.to_container(cfg[cfg.method.hparams], resolve=True),
    }


def check_resume(cfg: DictConfig, run_dir: Path | None = None) -> None:
    """``resume=<run dir>`` (or the job's own ``run_dir`` under ``resume=auto``): the run's saved config
    (:func:`dpgen.core.schema.load_run_config`) and its checkpoint (:func:`dpgen.core.checkpoint.load_checkpoint`,
    ledger included) are valid, and both were made with this config's settings (:func:`fingerprint`); checked
    before anything is written."""
    from dpgen.core.checkpoint import load_checkpoint
    from dpgen.core.schema import load_run_config

    run_dir = Path(str(cfg.resume)) if run_dir is None else Path(run_dir)
    ckpt = load_checkpoint(run_dir / "checkpoints" / "last.pt")  # first: it says when a run predates this version
    saved = load_run_config(run_dir)
    if saved.get("audit") is not None:
        raise DpgenError(f"{run_dir} is an audit run (scripts/audit.py): its canaries' scores are not in the "
                         "checkpoint, so it cannot be resumed; start a new audit")
    PrivacyLedger(delta=0.5).load_state_dict(ckpt["ledger"])
    current = fingerprint(cfg)
    for what, stored in (("the checkpoint", ckpt["fingerprint"]), (f"{run_dir}/.hydra/config.yaml", fingerprint(saved))):
        diff = fingerprint_diff(stored, current)
        if diff:
            raise DpgenError(f"resume config differs from {what} ({diff}); resume with the original settings")


def save_sample_grid(gen: ReleasedGenerator, path: Path, per_class: int, seed: int) -> None:
    """``samples.png``: one row per class, ``per_class`` columns."""
    from torchvision.utils import save_image

    k = gen.num_classes
    labels = torch.arange(k).repeat_interleave(per_class)
    x, _ = gen.sample(len(labels), labels=labels, seed=seed)
    tmp = path.with_name(".samples.tmp.png")
    save_image(x, tmp, nrow=per_class, padding=1)
    tmp.replace(path)


def run_training(cfg: DictConfig, run_dir: Path, data: ImageDataset | None = None, evaluate: bool = True) -> dict:
    """Train, release and evaluate. Returns the metrics dict.

    ``data`` replaces the dataset ``cfg.dataset`` names (the MIA audit trains on a member subset);
    ``evaluate=False`` skips the shared evaluator (metrics.json then holds the training facts only).

    Under ``torchrun`` every rank calls this: all train (the method splits the work, :mod:`dpgen.core.dist`),
    rank 0 alone releases, writes and evaluates in ``run_dir`` (rank 0's, sent to the others), and the
    other ranks return ``{}``.
    """
    quiet_known_noise()
    validate(cfg)
    dist, device = from_env(resolve_device(str(cfg.device)))
    try:
        return _run_training(cfg, Path(dist.broadcast(str(run_dir))), data, evaluate, dist, device)
    finally:
        dist.close()


def _run_training(cfg: DictConfig, run_dir: Path, data: ImageDataset | None, evaluate: bool, dist: Dist,
                  device: torch.device) -> dict:
    set_threads(cfg.get("threads"))
    keep_freed_memory()
    seed_everything(int(cfg.seed))
    if cfg.dataset.get("alias"):
        log.info("dataset=%s resolves to %s for method=%s: %s", cfg.dataset.alias, cfg.dataset.name, cfg.method.name,
                 cfg.dataset.get("note"))
    if data is None:
        data = load_config_dataset(cfg)
    validate(cfg, data)
    delta = float(cfg.delta)
    target = parse_epsilon(cfg.eps)
    noise_seed = cfg.privacy.noise_seed
    ledger = PrivacyLedger(delta=delta, target_epsilon=target, accountant=cfg.privacy.accountant,
                           accounting=cfg.privacy.accounting, fixed_randomness=noise_seed is not None)
    resume = resume_dir(cfg.resume, run_dir) is not None
    if resume and str(cfg.resume) == "auto":  # a requeued job: its own checkpoint and config must match
        check_resume(cfg, run_dir)
    run = Run(run_dir, ledger, device, int(cfg.seed), fingerprint(cfg), checkpoint_every=cfg.checkpoint_every,
              log_every=cfg.log_every, stop_after=cfg.debug.stop_after, resume=resume,
              tensorboard=cfg.tensorboard, progress=cfg.progress, noise_seed=noise_seed,
              secure_noise=bool(cfg.privacy.secure_noise), dist=dist)
    if cfg.get("audit") is not None:  # scripts/audit.py: canaries in the mechanisms (dpgen.audit)
        from dpgen.audit.report import attach

        canaries = attach(run, cfg)
        log.info("audit: %d canaries, each included by a secret fair coin (audit/coins.npy after the run)",
                 canaries.m)
    method = load_method(cfg.method.name)
    log.info("method=%s dataset=%s (N=%d) eps=%g delta=%g profile=%s device=%s%s", cfg.method.name, data.name,
             len(data.train), target, delta, cfg.profile, device,
             f", {dist.world} processes" if dist.active else "")
    if ledger.privacy_off:
        log.warning("eps=inf: privacy-off reference run (noise multiplier 0, clipping kept); NOT private")
    if noise_seed is not None:
        log.warning("privacy.noise_seed is set: the mechanisms' randomness is replayable from the config; NOT private")
    if str(cfg.precision) != "fp32" or bool(cfg.cudnn_benchmark):
        log.info("precision=%s cudnn_benchmark=%s for training (clipping, noise and optimizer state stay fp32; "
                 "sampling and evaluation run in fp32)", cfg.precision, bool(cfg.cudnn_benchmark))
    t0 = time.time()
    try:
        # training only: the released generator is sampled and evaluated below, in fp32
        with run_precision(cfg, device):  # precision, compile, ensemble.conv (dpgen/core/precision.py)
            gen = method.train(cfg[cfg.method.hparams], data, ledger, run)
    finally:
        run.close()
    train_seconds = time.time() - t0
    if not isinstance(gen, ReleasedGenerator):
        raise TypeError(f"{cfg.method.module}.train must return a ReleasedGenerator")

    eps_sound = ledger.epsilon() if ledger.entries else 0.0
    if not ledger.privacy_off and ledger.accounting == "sound" and eps_sound > target * (1 + 1e-9):
        raise RuntimeError(f"privacy budget overrun: epsilon {eps_sound:.6f} > target {target}")  # a bug, never a user error
    if not dist.main:  # every rank holds the same generator; rank 0 releases and evaluates it
        return {}
    gen = gen.to(device).eval()
    save_generator(gen, run_dir / "generator.pt", meta={"method": cfg.method.name, "dataset": data.name,
                                                         "classes": list(data.classes)})
    # from here on only the released file, loaded back as every user loads it: what it cannot rebuild is not released
    gen = load_generator(run_dir / "generator.pt", device)
    if not data.tabular:
        save_sample_grid(gen, run_dir / "samples.png", int(cfg.samples_per_class), int(cfg.seed))
    atomic_write_json(ledger.to_json(), run_dir / "privacy.json")
    log.info("released generator.pt; epsilon=%.4f (target %g, %s accounting)", ledger.report_epsilon()
             if ledger.entries else 0.0, target, ledger.accounting)

    if run.audit is not None:
        from dpgen.audit.report import write_report

        write_report(run.audit, cfg, ledger, len(data.train), run_dir)
    metrics = evaluate_generator(gen, data, cfg, device) if evaluate else {}
    metrics["train_seconds"] = round(train_seconds, 1)
    if run.extra_metrics:
        metrics["training"] = _finite(dict(run.extra_metrics))
    if ledger.privacy_off:
        metrics["target_epsilon"] = math.inf  # the privacy-off reference is its own column (JSON Infinity)
    atomic_write_json(metrics, run_dir / "metrics.json")
    return metrics


def evaluate_generator(gen: ReleasedGenerator, data, cfg: DictConfig, device: torch.device) -> dict:
    """Draw ``eval.num_samples`` balanced samples and run the shared evaluator."""
    from dpgen.eval import evaluate

    t0 = time.time()
    n = int(cfg.eval.num_samples)
    with compiling(bool(cfg.get("compile", False))):  # compile=true: the sampler's network call too
        x, y = gen.sample(n, labels=balanced_labels(n, gen.num_classes), seed=int(cfg.seed) + 1)
    x_np = x.numpy().astype(np.float32) if data.tabular else to_uint8(x)
    metrics = evaluate(x_np, y.numpy(), data, cfg.eval, device=device, seed=int(cfg.seed),
                       cache_dir=Path(cfg.data_root) / "cache" / "eval", log=log.info)
    if cfg.dataset.get("alias"):
        metrics["dataset_alias"] = str(cfg.dataset.alias)  # what was typed (dataset=celeba); "dataset" is concrete
    metrics.update({"method": cfg.method.name, "dataset": data.name, "target_epsilon": parse_epsilon(cfg.eps),
                    "seed": int(cfg.seed), "profile": cfg.profile, "accounting": cfg.privacy.accounting,
                    "eval_seconds": round(time.time() - t0, 1)})
    return _finite(metrics)


def _finite(obj):
    """JSON has no NaN/inf: report such values as null."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
