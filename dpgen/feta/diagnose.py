"""Per-step signal and noise of DP-FETA's and DPDM's DP-SGD (Stage II, Eq. 9), at one or more target ε.

``python -m dpgen.feta.diagnose --method dpdm --dataset fmnist --eps 1 10 --steps 100`` runs the real ``train()``
(the method's config at ``profile=quick`` unless overridden; extra ``key=value`` Hydra overrides after ``--``) for
feta's warm-up and the first ``--steps`` DP-SGD steps at each ε, and prints per ε:

* ``sigma``: the noise multiplier the ledger calibrated for the whole run;
* ``snr``: the median over the steps of ‖Σ clipped per-record gradients‖ / (σ·C·√d), a step's summed signal
  against the expected norm of its noise (:func:`dpgen.feta.dpsgd.signal_to_noise`), and its first and last
  deciles' medians (how it moves along the steps);
* ``batch``: the mean Poisson batch.

The run's own train.log carries the same ``snr`` every ``log_every`` steps. It writes nothing but a scratch
directory that it deletes.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from dpgen.core.run import RecordingRun, TrainingInterrupted


def measure(method: str, eps: float | str, dataset: str, steps: int, data_root: str, overrides: list[str],
            seed: int = 0) -> dict[str, float]:
    """σ, and the medians of the tracked statistics over the first ``steps`` DP-SGD steps of ``method``."""
    from hydra import compose, initialize_config_dir

    from dpgen.core.config import register_resolvers
    from dpgen.core.methods import CONFIG_DIR
    from dpgen.core.pipeline import seed_everything, set_threads
    from dpgen.data import load_dataset
    from dpgen.feta import train
    from dpgen.privacy import PrivacyLedger, parse_epsilon

    if method not in ("feta", "dpdm"):
        raise ValueError(f"method must be feta or dpdm, got {method!r}")
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"method={method}", f"dataset={dataset}", f"eps={eps}", f"seed={seed}",
                                          *overrides])
    hp = cfg.feta
    set_threads(cfg.get("threads"))
    data = load_dataset(dataset, data_root)
    warm = int(hp.warmup_iters) if str(hp.central) != "none" else 0
    ledger = PrivacyLedger(delta=float(cfg.delta), target_epsilon=parse_epsilon(cfg.eps),
                           accounting=str(cfg.privacy.accounting))
    seed_everything(seed)
    with tempfile.TemporaryDirectory() as tmp:
        run = RecordingRun(Path(tmp), ledger, torch.device("cpu"), seed, {}, log_every=10**9, stop_after=warm + steps,
                           progress=False, tensorboard=False)
        try:
            train(hp, data, ledger, run)
        except TrainingInterrupted:
            pass
        finally:
            run.close()
    rows = [r for r in run.rows if "snr" in r]
    snr = [r["snr"] for r in rows if math.isfinite(r["snr"])]
    tenth = max(1, len(snr) // 10)
    entry = next((e for e in ledger.entries if e.name == "feta.dpsgd"), None)
    return {"sigma": float(entry.noise_multipliers[0]) if entry is not None else 0.0,
            "snr": statistics.median(snr) if snr else math.inf,
            "snr_first": statistics.median(snr[:tenth]) if snr else math.inf,
            "snr_last": statistics.median(snr[-tenth:]) if snr else math.inf,
            "batch": statistics.fmean(r["batch"] for r in rows) if rows else math.nan,
            "steps": float(len(rows))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", choices=["feta", "dpdm"], default="dpdm")
    ap.add_argument("--dataset", default="fmnist")
    ap.add_argument("--eps", nargs="+", default=["1", "10"])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--data-root", default=None)
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. feta.batch_size=256")
    args = ap.parse_args(argv)
    root = args.data_root or os.environ.get("DPGEN_DATA", "data")
    print("eps     sigma    snr     snr_first  snr_last  batch  steps   (snr: medians per DP-SGD step)")
    for eps in args.eps:
        m = measure(args.method, eps, args.dataset, args.steps, root, args.overrides)
        print(f"{eps:6s}  {m['sigma']:.4g}  {m['snr']:.3g}  {m['snr_first']:.3g}      {m['snr_last']:.3g}     "
              f"{m['batch']:.1f}  {m['steps']:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
