"""Per-method profile at profile=paper sizes: a short timed run, extrapolated to the full paper run.

For each method, ``train()`` runs on the real paper-sized config for ``--warmup`` + ``--steps`` training
steps (the steps ``Run.step_done`` counts: generator iterations, DP-SGD steps, dpaf groups) and is then
stopped, without writing a checkpoint. Reported per method: seconds per step and steps/s after the warm-up
steps (the device is synchronised before every timestamp), peak memory (``torch.cuda.max_memory_allocated``
on CUDA, the process's max RSS on a CPU), the setup time as run, and the extrapolated wall time of the full
run = setup + planned steps x s/step. Pre-training of the GS-WGAN/DPAC/EFSGD discriminators is run for
``--pretrain-iters`` steps per discriminator only and scaled to the paper's count (it is linear in it).
Evaluation (FID, classifiers) is not included. Each method runs in its own subprocess (clean peak memory).

    python bench/gpu_profile.py [--methods dpgan,...] [--dataset fmnist] [--eps 10] [--device cuda] [--out FILE]
    python bench/gpu_profile.py --tiny        # CPU smoke test: tiny configs on the embedded digits

Prints a Markdown table (and writes it to ``--out``) that README's "Running on GPUs and clusters" quotes.
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the dpgen of this checkout, in subprocesses too
METHODS = ("dpgan", "gswgan", "dpac", "efsgd", "gpate", "dpaf", "feta", "dpdm")
ENSEMBLES = ("gswgan", "dpac", "efsgd")  # discriminator pre-training before the first step
COLUMNS = ("method", "dataset", "device", "s/step", "steps/s", "steps (full)", "setup s", "peak GB",
           "full run h", "notes")


class _Enough(Exception):
    """Raised after the timed steps: the profile ends without a checkpoint."""


def _compose(method: str, dataset: str, eps: str, profile: str, overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from dpgen.core.config import register_resolvers
    from dpgen.core.methods import CONFIG_DIR

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"method={method}", f"dataset={dataset}", f"eps={eps}",
                                          f"profile={profile}", *overrides])
    OmegaConf.resolve(cfg)
    return cfg


def _first_phase(method: str, hp, data) -> tuple[str | None, int]:
    """(config key, paper length) of a first phase whose steps cost differently from the rest, or (None, 0).

    dpac/efsgd: iterations before the classifier starts (t_c); feta: warm-up on the central images; dpaf:
    phase 1 (C by DP-SGD). Its steps are timed apart from the main phase's and extrapolated separately.
    """
    if method in ("dpac", "efsgd"):
        start = importlib.import_module(f"dpgen.{method}.train").classifier_start(hp)
        return ("classifier.start", int(start)) if start else (None, 0)
    if method == "feta" and str(hp.central) != "none":
        return "warmup_iters", int(hp.warmup_iters)
    if method == "dpaf" and hp.conv1 == "transfer":
        from dpgen.dpaf.nets import resolve_layers

        if resolve_layers(hp.layers, list(data.shape)[1])[0] > 0:
            return "c_epochs", int(math.ceil(float(hp.c_epochs) * len(data.train) / int(hp.c_batch_size)))
    return None, 0


def _shorten(key: str, n: int, hp, data) -> str:
    """The override value that makes the first phase ``n`` steps long."""
    if key == "c_epochs":  # t1 = ceil(c_epochs * N / B_C)
        return f"{(n - 0.5) * int(hp.c_batch_size) / len(data.train):.12g}"
    return str(n)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def profile_one(method: str, dataset: str, eps: str, device: str, steps: int, warmup: int, tiny: bool,
                pretrain_iters: int, data_root: str) -> dict:
    """Train ``method`` for warmup + steps steps and return one table row (see the module docstring)."""
    from dpgen.core.methods import load_method
    from dpgen.core.pipeline import quiet_known_noise, seed_everything
    from dpgen.core.run import Run
    from dpgen.data import load_dataset
    from dpgen.privacy import PrivacyLedger, parse_epsilon

    quiet_known_noise()
    logging.getLogger("absl").setLevel(logging.ERROR)
    dev = torch.device(device)
    overrides, notes = [], []
    if tiny:
        sys.path.insert(0, str(ROOT / "tests"))
        from tiny import TINY

        overrides += TINY[method]
    profile = "quick" if tiny else "paper"
    cfg = _compose(method, dataset, eps, profile, overrides)
    hp = cfg[cfg.method.hparams]
    data = load_dataset(cfg.dataset.name, data_root)
    prefix = cfg.method.hparams
    pretrain_scale = 1.0
    if method in ENSEMBLES and not tiny and int(hp.pretrain_iters) > pretrain_iters:
        pretrain_scale = int(hp.pretrain_iters) / pretrain_iters
        overrides.append(f"{prefix}.pretrain_iters={pretrain_iters}")
        notes.append(f"pre-training timed for {pretrain_iters} of {int(hp.pretrain_iters)} steps per discriminator")
    key, phase1_full = (None, 0) if tiny else _first_phase(method, hp, data)
    n1 = warmup + steps if key and phase1_full > warmup + steps else 0
    if n1:
        overrides.append(f"{prefix}.{key}={_shorten(key, n1, hp, data)}")
    cfg = _compose(method, dataset, eps, profile, overrides)
    ledger = PrivacyLedger(delta=float(cfg.delta), target_epsilon=parse_epsilon(cfg.eps),
                           accountant=cfg.privacy.accountant, accounting=cfg.privacy.accounting)
    stamps: list[float] = []
    planned: list[int] = []
    t_pretrain: list[float] = []

    class ProfileRun(Run):
        def start(self, total: int, desc: str) -> None:
            planned.append(int(total))
            super().start(total, desc)

        def step_done(self, step, scalars, state_fn) -> None:
            _sync(dev)
            stamps.append(time.perf_counter())
            if len(stamps) >= n1 + warmup + steps:
                raise _Enough

    ensemble_mod = importlib.import_module("dpgen.dpac.train")  # the module (dpgen.dpac.train is also its function)
    original_pretrain = ensemble_mod.pretrain

    def timed_pretrain(*args, **kwargs):  # timed on its own, to scale it to the paper's length
        t = time.perf_counter()
        original_pretrain(*args, **kwargs)
        _sync(dev)
        t_pretrain.append(time.perf_counter() - t)

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    with tempfile.TemporaryDirectory() as tmp:
        run = ProfileRun(tmp, ledger, dev, 0, {}, checkpoint_every=10**9, log_every=10**9, progress=False,
                         tensorboard=False, secure_noise=bool(cfg.privacy.secure_noise))
        seed_everything(0)
        ensemble_mod.pretrain = timed_pretrain
        t0 = time.perf_counter()
        try:
            load_method(cfg.method.module).train(cfg[cfg.method.hparams], data, ledger, run)
        except _Enough:
            pass
        finally:
            ensemble_mod.pretrain = original_pretrain
            run.close()

    def per_step(lo: int, hi: int) -> float:  # mean step time of steps lo+1..hi (0-based stamps)
        return (stamps[hi - 1] - stamps[lo - 1]) / (hi - lo)

    if len(stamps) < n1 + warmup + 1:
        raise SystemExit(f"{method}: only {len(stamps)} steps ran; lower --warmup")
    main_s = per_step(n1 + warmup, len(stamps))
    first_s = per_step(warmup, n1) if n1 else main_s
    setup = max(0.0, stamps[0] - t0 - first_s)  # up to the end of the first step, less that step
    if t_pretrain:
        setup += t_pretrain[0] * (pretrain_scale - 1.0)
    main_steps = (planned[0] if planned else len(stamps)) - n1
    phase1 = phase1_full if n1 else 0
    if n1:
        notes.append(f"first phase ({key}): {phase1} steps at {first_s:.3g} s/step")
    full_h = (setup + phase1 * first_s + main_steps * main_s) / 3600
    return {"method": method, "dataset": cfg.dataset.name, "device": _device_name(dev), "s/step": main_s,
            "steps/s": 1.0 / main_s if main_s > 0 else math.inf, "steps (full)": phase1 + main_steps,
            "setup s": setup, "peak GB": _peak_gb(dev), "full run h": full_h, "notes": "; ".join(notes)}


def _device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c, "")) for c in COLUMNS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--dataset", default=None, help="default: fmnist (paper), digits (--tiny)")
    ap.add_argument("--eps", default="10")
    ap.add_argument("--device", default=None, help="default: cuda if available (cpu with --tiny)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 20, 3 with --tiny)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed first steps (default 3, 1 with --tiny)")
    ap.add_argument("--pretrain-iters", type=int, default=5)
    ap.add_argument("--tiny", action="store_true", help="tests/tiny.py's configs on digits: a CPU smoke test")
    ap.add_argument("--inline", action="store_true", help="run every method in this process (no subprocesses)")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--out", default=None, help="also write the Markdown table here")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child process: one method, JSON on stdout
    a = ap.parse_args(argv)
    if (a.warmup is not None and a.warmup < 1) or (a.steps is not None and a.steps < 1):
        raise SystemExit("error: --warmup and --steps must be >= 1")

    device = a.device or ("cpu" if a.tiny or not torch.cuda.is_available() else "cuda")
    dataset = a.dataset or ("digits" if a.tiny else "fmnist")
    steps = a.steps if a.steps is not None else (3 if a.tiny else 20)
    warmup = a.warmup if a.warmup is not None else (1 if a.tiny else 3)
    data_root = a.data_root or os.environ.get("DPGEN_DATA", "data")
    args = (dataset, a.eps, device, steps, warmup, a.tiny, a.pretrain_iters, data_root)
    if a.one:
        print(json.dumps(profile_one(a.one, *args)))
        return []
    rows = []
    for method in a.methods.split(","):
        if method not in METHODS:
            raise SystemExit(f"error: unknown method {method!r}; choose from {', '.join(METHODS)}")
        if a.inline:
            rows.append(profile_one(method, *args))
        else:
            cmd = [sys.executable, __file__, "--one", method, "--dataset", dataset, "--eps", a.eps, "--device", device,
                   "--steps", str(steps), "--warmup", str(warmup), "--pretrain-iters", str(a.pretrain_iters),
                   "--data-root", data_root] + (["--tiny"] if a.tiny else [])
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                tail = (res.stderr.strip().splitlines() or [""])[-1]
                why = f"killed by signal {-res.returncode} (out of memory?)" if res.returncode < 0 else tail
                rows.append({"method": method, "dataset": dataset, "device": device, "notes": f"failed: {why}"})
            else:
                rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    out = table(rows)
    print(out)
    if a.out:
        Path(a.out).write_text(out + "\n")
    return rows


if __name__ == "__main__":
    main()
