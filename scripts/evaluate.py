#!/usr/bin/env python
"""Recompute a run's metrics.json from its generator.pt and saved config.

    python scripts/evaluate.py run=<run dir> [eval=default|full|paper] [eval.<key>=<value> ...] [device=auto] [data_root=...]

``eval=<name>`` replaces the run's evaluation settings by ``configs/eval/<name>.yaml`` (e.g. ``eval=full`` after a
run evaluated with the light default); ``eval.<key>=<value>`` then overrides single keys.

The previous metrics.json is kept as metrics.<time>.json, never lost.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from dpgen.cli import user_errors
from dpgen.io import atomic_write_json
from dpgen.core.config import register_configs
from dpgen.core.methods import CONFIG_DIR, available
from dpgen.core.generator import load_generator
from dpgen.core.host import keep_freed_memory
from dpgen.core.pipeline import evaluate_generator, resolve_device
from dpgen.core.schema import check_config, explain_config_error, load_run_config
from dpgen.data import load_config_dataset
from dpgen.errors import DpgenError
from dpgen.scripts_util import parse_kv


def main(argv: list[str]) -> None:
    args = parse_kv(argv, required=("run",), optional={"device": None, "data_root": None, "eval": None},
                    allow_extra_prefix="eval.")
    run_dir = Path(args["run"])
    register_configs()
    cfg = load_run_config(run_dir)  # the saved config, typed and checked (it may come from anyone)
    if args["eval"] is not None:
        if args["eval"] not in available("eval"):
            raise DpgenError(f"eval={args['eval']!r} is not an evaluation; choose one of {', '.join(available('eval'))}")
        cfg = OmegaConf.merge(cfg, {"eval": OmegaConf.load(CONFIG_DIR / "eval" / f"{args['eval']}.yaml")})
    overrides = {k: v for k, v in args.items() if k.startswith("eval.")}
    overrides.update({k: args[k] for k in ("device", "data_root") if args[k] is not None})
    try:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([f"{k}={v}" for k, v in overrides.items()]))
    except Exception as exc:  # noqa: BLE001 - a wrong type or an unknown eval key
        raise explain_config_error(exc, overrides) from None
    check_config(cfg)
    device = resolve_device(str(cfg.device))
    keep_freed_memory()  # the evaluator trains classifiers: its steps reuse freed memory as a training run's do
    gen = load_generator(run_dir / "generator.pt", device)
    data = load_config_dataset(cfg)
    metrics = evaluate_generator(gen, data, cfg, device)
    old = run_dir / "metrics.json"
    if old.exists():
        old.rename(run_dir / f"metrics.{time.strftime('%Y-%m-%d_%H-%M-%S')}.json")
    atomic_write_json(metrics, old)
    print(f"wrote {old}")


def cli(argv: list[str] | None = None) -> None:
    """The command line: ``main`` with one-line errors and exit code 2 (tests call this in-process)."""
    with user_errors():
        main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    cli()
