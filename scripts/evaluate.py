#!/usr/bin/env python
"""Recompute a run's metrics.json from its generator.pt and saved config.

    python scripts/evaluate.py run=<run dir> [eval.<key>=<value> ...] [device=auto] [data_root=...]

The previous metrics.json is kept as metrics.<time>.json, never lost.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from dpgen.cli import user_errors
from dpgen.io import atomic_write_json
from dpgen.core.config import register_resolvers
from dpgen.core.generator import load_generator
from dpgen.core.pipeline import evaluate_generator, resolve_device
from dpgen.data import load_dataset
from dpgen.errors import DpgenError
from dpgen.scripts_util import parse_kv


def main(argv: list[str]) -> None:
    args = parse_kv(argv, required=("run",), optional={"device": None, "data_root": None}, allow_extra_prefix="eval.")
    run_dir = Path(args["run"])
    cfg_file = run_dir / ".hydra" / "config.yaml"
    if not cfg_file.is_file():
        raise DpgenError(f"{run_dir} is not a dpgen run directory (no .hydra/config.yaml)")
    register_resolvers()
    cfg = OmegaConf.load(cfg_file)
    overrides = [f"{k}={v}" for k, v in args.items() if k.startswith("eval.")]
    overrides += [f"{k}={args[k]}" for k in ("device", "data_root") if args[k] is not None]
    cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    device = resolve_device(str(cfg.device))
    gen = load_generator(run_dir / "generator.pt", device)
    data = load_dataset(cfg.dataset.name, cfg.data_root)
    metrics = evaluate_generator(gen, data, cfg, device)
    old = run_dir / "metrics.json"
    if old.exists():
        old.rename(run_dir / f"metrics.{time.strftime('%Y-%m-%d_%H-%M-%S')}.json")
    atomic_write_json(metrics, old)
    print(f"wrote {old}")


if __name__ == "__main__":
    with user_errors():
        main(sys.argv[1:])
