#!/usr/bin/env python
"""Diagnose a run's samples (``dpgen.eval.probe``): grids, a fixed-schedule classifier's confusion on real test
images, how reliably samples show their label, and sampling variants.

    python scripts/probe_samples.py run=<run dir> out=<new dir> [n=10000] [epochs=10] [seed=0] \\
        [variants=batch,smooth] [device=auto] [data_root=...]

Reads the run's generator.pt (as every user loads it) and its saved config (the dataset); writes
``probe.json``, ``samples_grid.png`` and ``real_grid.png`` into ``out``, which must not exist yet.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from dpgen.cli import user_errors
from dpgen.core.config import register_configs
from dpgen.core.generator import load_generator
from dpgen.core.pipeline import resolve_device
from dpgen.core.schema import load_run_config
from dpgen.data import load_config_dataset
from dpgen.errors import DpgenError
from dpgen.eval.probe import VARIANTS, probe
from dpgen.scripts_util import parse_int, parse_kv


def main(argv: list[str]) -> None:
    args = parse_kv(argv, required=("run", "out"), optional={"n": "10000", "epochs": "10", "seed": "0",
                                                             "variants": ",".join(VARIANTS), "device": "auto",
                                                             "data_root": None})
    out = Path(args["out"])
    if out.exists():
        raise DpgenError(f"{out} exists; choose another out= (nothing was overwritten)")
    n, epochs, seed = parse_int("n", args["n"], 2), parse_int("epochs", args["epochs"], 1), parse_int("seed", args["seed"], 0)
    variants = tuple(v for v in str(args["variants"]).split(",") if v)
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise DpgenError(f"variants={args['variants']} is invalid; expected a list drawn from {', '.join(VARIANTS)}")
    run_dir = Path(args["run"])
    register_configs()
    cfg = load_run_config(run_dir)
    device = resolve_device(args["device"])
    gen = load_generator(run_dir / "generator.pt", device)
    data = load_config_dataset(cfg, args["data_root"] or cfg.data_root)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    res = probe(gen, data, tmp, n=n, epochs=epochs, seed=seed, device=device, variants=variants)
    (tmp / "probe.json").write_text(json.dumps(res, indent=1) + "\n")
    tmp.replace(out)
    summary = {k: v for k, v in res.items() if k not in ("confusion", "diversity_samples", "diversity_real")}
    print(json.dumps(summary))


def cli(argv: list[str] | None = None) -> None:
    """The command line: ``main`` with one-line errors and exit code 2 (tests call this in-process)."""
    with user_errors():
        main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    cli()
