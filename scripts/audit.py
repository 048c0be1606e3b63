#!/usr/bin/env python
"""Audit what one training run leaks: ``python scripts/audit.py method=<m> dataset=<d> eps=<ε> [audit.canaries=m
audit.guesses=k audit.bound=fdp|sn key=value ...]``.

One training run (the config of scripts/train.py, every key; configs/audit.yaml adds the ``audit`` block) with
m canaries in its mechanisms (docs/auditing.md). Besides the run's files it writes ``audit.json`` (claimed (ε, δ),
canaries, guesses, correct guesses, both lower bounds on ε at the confidence (the f-DP test of Mahloujifar, Melis &
Chaudhuri 2025 and Steinke, Nasr & Jagielski 2023's), a Gaussian-limit estimate, where the canaries were inserted)
and ``audit/coins.npy`` (the secret coins; nowhere else), and ends with one line:
``audit: dpgan eps=2 claimed, eps_lb=0.41 (fdp, 95 %), 10000 canaries, 612/1000 correct``.

Exit codes as scripts/train.py: 0 ok, 2 user error (one line on stderr, nothing written).
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from dpgen.cli import fail, precheck, remove_fresh_run_dir, user_errors
from dpgen.core.config import register_configs
from dpgen.core.methods import CONFIG_DIR
from dpgen.errors import DpgenError

log = logging.getLogger("dpgen")
register_configs()


@hydra.main(config_path=str(CONFIG_DIR), config_name="audit", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from dpgen.audit.report import summary_line
    from dpgen.core.pipeline import run_training

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        run_training(cfg, run_dir, evaluate=bool(cfg.audit.evaluate))
    except DpgenError as exc:
        log.error("%s", exc)
        remove_fresh_run_dir(run_dir)  # an audit never resumes: nothing of this run is worth keeping
        fail(str(exc))
    except torch.OutOfMemoryError as exc:
        from dpgen.core.devices import oom_message

        log.error("%s", exc)
        fail(oom_message(exc))
    report = json.loads((run_dir / "audit.json").read_text())
    print(f"run directory: {run_dir}")
    print(summary_line(report))


def check_args(argv: list[str]) -> None:
    """Every value of every job checked before Hydra creates anything (one line, exit code 2 otherwise)."""
    if "--help" not in argv and "-h" not in argv and "--cfg" not in argv:
        with user_errors():
            precheck(argv, config_name="audit")


if __name__ == "__main__":
    check_args(sys.argv[1:])
    main()
