#!/usr/bin/env python
"""Empirical membership-inference audit (DPAF Table XVII; GAN-Leaks full black-box attack).

    python scripts/audit_mia.py --method dpaf --dataset fmnist --members 64 --eps 1 10 \
        --out /tmp/mia [-- extra Hydra overrides, e.g. dpaf.d_epochs=50]

1. Draws ``--members`` training images (the member set) and as many other training images (non-members,
   the same distribution, never trained on), with ``--seed``.
2. Trains the method on ONLY the members through the normal pipeline (``run_training`` with the member
   subset as its dataset and the shared evaluator off: the audit needs the generator only), once per ``--eps``.
3. Trains a non-private baseline (``--baseline``): ``plain`` = the same networks trained by ordinary
   non-private SGD/Adam (dpaf only, dpgen.dpaf.plain), or ``eps:<E>`` = the method itself at target ε=E
   (privacy nearly off for any method; clipping and the calibrator's noise floor remain).
4. Draws ``--syn-per-class`` samples per class from each generator and scores every candidate by minus
   the L2 distance to the nearest synthetic sample OF ITS CLASS; reports the membership AUC
   (dpgen.eval.mia; 0.5 = no leakage, 1.0 = every member is closer than every non-member).

Writes ``<out>/mia.json`` and prints a one-line summary. Exit code 2 on a user error (one ``error:`` line);
every configuration is composed and validated before any training, and an existing ``--out`` is never reused.
"""
from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import time
import warnings
from pathlib import Path

import numpy as np

# Small member sets need method settings that fit N=64/128 (a batch cannot exceed N; DPAF's Poisson rate
# of a group, μ·B/N, must stay <= 1) and enough passes to be able to memorise. Extra overrides win.
AUDIT_OVERRIDES = {
    "dpaf": ["dpaf.batch_size=8", "dpaf.c_batch_size=16", "dpaf.c_epochs=20", "dpaf.d_epochs=100"],
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", required=True)
    p.add_argument("--dataset", default="fmnist")
    p.add_argument("--members", type=int, default=64, help="member-set size (Table XVII: 64 or 128)")
    p.add_argument("--eps", type=float, nargs="*", default=[1.0, 10.0], help="targets of the DP runs (none: baseline only)")
    p.add_argument("--plain-batches", type=int, default=None, help="D batches of the plain baseline (default: as many "
                   "as phase 2 of the DP run; more shows how leakage grows when SGD trains towards memorisation)")
    p.add_argument("--baseline", default=None, help="plain (dpaf) | eps:<E> | none; default plain for dpaf, "
                   "eps:1e4 otherwise")
    p.add_argument("--profile", default="quick")
    p.add_argument("--syn-per-class", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data-root", default="data")
    p.add_argument("--out", required=True, help="directory for the runs and mia.json")
    p.add_argument("overrides", nargs="*", help="Hydra overrides after --, applied to every training run")
    return p.parse_args(argv)


def compose(args, eps: float):
    """The train.py config of one audit run, validated like a CLI run (a bad override is one DpgenError)."""
    from hydra import compose as hcompose, initialize_config_dir
    from omegaconf import OmegaConf

    from dpgen.core.methods import CONFIG_DIR
    from dpgen.core.pipeline import validate
    from dpgen.errors import DpgenError

    overrides = [f"method={args.method}", f"dataset={args.dataset}", f"profile={args.profile}", f"eps={eps}",
                 f"seed={args.seed}", f"threads={args.threads}", f"data_root={args.data_root}", "progress=false",
                 "tensorboard=false", *AUDIT_OVERRIDES.get(args.method, []), *args.overrides]
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = hcompose("train", overrides=overrides)
        OmegaConf.resolve(cfg)
    except Exception as exc:  # noqa: BLE001 - Hydra/OmegaConf composition errors
        first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise DpgenError(f"bad config: {first}") from None
    validate(cfg)
    return cfg, overrides


def split_members(data, m: int, seed: int):
    """Members and non-members: disjoint uniform draws of m training images each."""
    from dpgen.data.base import ImageDataset, Split

    if not 1 <= m <= len(data.train) // 2:
        raise ValueError(f"--members must be between 1 and N/2={len(data.train) // 2}")
    perm = np.random.default_rng(seed).permutation(len(data.train))
    mem, non = np.sort(perm[:m]), np.sort(perm[m:2 * m])
    sub = ImageDataset(data.name, Split(data.train.x[mem], data.train.y[mem]), data.test, list(data.classes),
                       data.tabular, dict(data.meta, mia_member_indices=mem.tolist()))
    return sub, mem, non


def train_private(cfg, subset, run_dir: Path):
    """run_training on the member subset only, evaluation skipped. Returns (generator, privacy.json, seconds)."""
    from dpgen.core.generator import load_generator
    from dpgen.core.pipeline import run_training

    metrics = run_training(cfg, run_dir, data=subset, evaluate=False)
    privacy = json.loads((run_dir / "privacy.json").read_text())
    return load_generator(run_dir / "generator.pt"), privacy, metrics.get("train_seconds")


def attack(gen, data, mem, non, per_class: int, seed: int) -> dict:
    import torch

    from dpgen.data.torch_utils import to_uint8
    from dpgen.eval.mia import gan_leaks_auc

    labels = torch.arange(gen.num_classes).repeat_interleave(per_class)
    x, y = gen.sample(len(labels), labels=labels, seed=seed + 12345)
    syn = to_uint8(x).astype(np.float32)  # same quantisation as released images
    tx, ty = data.train.x.astype(np.float32), data.train.y
    res = gan_leaks_auc(tx[mem], tx[non], syn, ty[mem], ty[non], y.numpy())
    return {k: round(v, 4) for k, v in res.items()}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    from dpgen.core.config import register_resolvers
    from dpgen.data import load_dataset
    from dpgen.errors import DpgenError
    from dpgen.privacy import check_delta

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s] %(message)s")
    logging.getLogger("absl").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    register_resolvers()
    out = Path(args.out)
    baseline = args.baseline or ("plain" if args.method == "dpaf" else "eps:1e4")
    try:
        if out.exists() and any(out.iterdir()):
            raise DpgenError(f"--out {out} already holds files; choose a new directory (nothing is overwritten)")
        data = load_dataset(args.dataset, args.data_root)
        subset, mem, non = split_members(data, args.members, args.seed)
        planned = [compose(args, e)[0] for e in args.eps]  # every DP run's config, before any training
        if baseline.startswith("eps:"):
            planned.append(compose(args, float(baseline.split(":", 1)[1]))[0])
        elif baseline == "plain" and args.method != "dpaf":
            raise DpgenError("--baseline plain exists for dpaf only; use --baseline eps:<E>")
        elif baseline not in ("plain", "none"):
            raise DpgenError(f"--baseline must be plain, eps:<E> or none, not {baseline!r}")
        for cfg in planned:
            check_delta(float(cfg.delta), len(subset.train))
        report = {"method": args.method, "dataset": args.dataset, "members": args.members,
                  "nonmembers": len(non), "syn_per_class": args.syn_per_class, "seed": args.seed,
                  "profile": args.profile, "attack": "GAN-Leaks full black-box: score = -L2 distance to the "
                  "nearest synthetic sample of the candidate's class; AUC by Mann-Whitney U",
                  "command": "python scripts/audit_mia.py " + shlex.join(argv), "runs": []}
        jobs = [("dp", e) for e in args.eps]
        if baseline != "none":
            jobs.insert(0, ("baseline", baseline))
        for kind, what in jobs:
            t0 = time.time()
            if kind == "baseline" and what == "plain":
                from dpgen.dpaf.plain import train_plain
                import torch

                cfg, overrides = compose(args, 10.0)
                torch.set_num_threads(args.threads)
                gen = train_plain(cfg.dpaf, subset, seed=args.seed, d_batches=args.plain_batches)
                entry = {"name": "plain", "privacy": "none (same G and D-hat as dpaf, Adam without clipping, "
                         "noise or aggregation)", "d_batches": args.plain_batches or "as phase 2 of the DP run",
                         "overrides": overrides}
            else:
                eps = float(what.split(":", 1)[1]) if kind == "baseline" else float(what)
                cfg, overrides = compose(args, eps)
                run_dir = out / (f"baseline_eps{eps:g}" if kind == "baseline" else f"eps{eps:g}")
                gen, privacy, secs = train_private(cfg, subset, run_dir)
                entry = {"name": f"{'baseline ' if kind == 'baseline' else ''}eps={eps:g}", "run_dir": str(run_dir),
                         "epsilon": privacy.get("epsilon"), "delta": privacy.get("delta"),
                         "valid_dp_guarantee": privacy.get("valid_dp_guarantee"),
                         "noise_multipliers": [e.get("noise_multipliers", e.get("noise_multiplier"))
                                               for e in privacy.get("entries", [])], "overrides": overrides}
            entry["train_seconds"] = round(time.time() - t0, 1)
            entry.update(attack(gen, data, mem, non, args.syn_per_class, args.seed))
            logging.getLogger("dpgen").info("MIA %s: AUC %.4f", entry["name"], entry["auc"])
            report["runs"].append(entry)
    except (DpgenError, ValueError) as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    (out / "mia.json").write_text(json.dumps(report, indent=2))
    summary = ", ".join(f"{r['name']}: {r['auc']:.3f}" for r in report["runs"])
    print(f"MIA AUC {args.method}/{args.dataset} {args.members} members ({summary}); report {out / 'mia.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
