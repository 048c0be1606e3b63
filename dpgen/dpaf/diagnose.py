"""Per-step signal and noise of DPAF's DP-SGD steps, paper vs sound variant (docs/methods.md, dpaf).

``python -m dpgen.dpaf.diagnose --dataset fmnist --eps 10 --groups 20`` runs the real ``train()`` (profile=quick
config, any extra ``key=value`` Hydra overrides after ``--``) for phase 1 and the first ``--groups`` groups of
phase 2 in each accounting mode, with the per-step statistics of :class:`CompressedDPOptimizer` tracked every
step, and prints their medians:

* ``gnorm``: median per-sample gradient norm before clipping (C of conv1's DP-SGD, conv2* in phase 2);
* ``snr``: ‖Σ clipped per-sample gradients‖ / (σ·C·√d), the signal against the expected norm of the noise.

Paper mode (Algorithm 1 as published) differentiates losses of batch AGGREGATES: C's MSE on the mean feature
of a batch, conv2*'s BCE on each batch's summed features / B. Each sample then moves the loss through 1/B of an
aggregate, so its gradient is ≈ 1/B of a per-sample loss's, far below the clip C, and the noise σ·C swamps it.
It writes nothing but a scratch directory that it deletes.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from dpgen.core.run import RecordingRun, TrainingInterrupted


def measure(accounting: str, eps: float | str, dataset: str, groups: int, data_root: str, overrides: list[str],
            seed: int = 0) -> dict[str, float]:
    """Medians of the tracked statistics over phase 1 and the first ``groups`` groups of phase 2."""
    from hydra import compose, initialize_config_dir

    from dpgen.core.config import register_resolvers
    from dpgen.core.methods import CONFIG_DIR
    from dpgen.core.pipeline import seed_everything, set_threads
    from dpgen.data import load_dataset
    from dpgen.dpaf import train
    from dpgen.privacy import PrivacyLedger, parse_epsilon

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["method=dpaf", f"dataset={dataset}", f"eps={eps}", f"seed={seed}",
                                          f"privacy.accounting={accounting}", *overrides])
    hp = cfg.dpaf
    set_threads(cfg.get("threads"))
    data = load_dataset(dataset, data_root)
    n = len(data.train.x)
    t1 = int(-(-float(hp.c_epochs) * n // int(hp.c_batch_size))) if hp.conv1 == "transfer" else 0
    ledger = PrivacyLedger(delta=float(cfg.delta), target_epsilon=parse_epsilon(cfg.eps), accounting=accounting)
    seed_everything(seed)
    with tempfile.TemporaryDirectory() as tmp:
        run = RecordingRun(Path(tmp), ledger, torch.device("cpu"), seed, {}, log_every=1, stop_after=t1 + groups,
                        progress=False, tensorboard=False)
        try:
            train(hp, data, ledger, run)
        except TrainingInterrupted:
            pass
        finally:
            run.close()
    out: dict[str, float] = {}
    for key in ("gnorm_c", "snr_c", "gnorm_d2", "snr_d2"):
        vals = [r[key] for r in run.rows if key in r and math.isfinite(r[key])]
        out[key] = statistics.median(vals) if vals else math.nan
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="fmnist")
    ap.add_argument("--eps", default="10")
    ap.add_argument("--groups", type=int, default=20)
    ap.add_argument("--accounting", nargs="+", default=["paper", "sound"])
    ap.add_argument("--data-root", default=None)
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. dpaf.mu=4")
    args = ap.parse_args(argv)
    import os

    root = args.data_root or os.environ.get("DPGEN_DATA", "data")
    print("accounting  gnorm_c  snr_c  gnorm_d2  snr_d2   (medians per step; gnorm before clipping)")
    for acc in args.accounting:
        m = measure(acc, args.eps, args.dataset, args.groups, root, args.overrides)
        print(f"{acc:10s}  {m['gnorm_c']:.4g}  {m['snr_c']:.3g}  {m['gnorm_d2']:.4g}  {m['snr_d2']:.3g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
