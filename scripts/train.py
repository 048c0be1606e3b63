#!/usr/bin/env python
"""Train a DP generator: ``python scripts/train.py method=<m> dataset=<d> eps=<ε> [key=value ...]``.

See docs/usage.md for the run-directory contract. Exit codes: 0 ok, 2 user error (one line on
stderr, nothing overwritten), 3 interrupted by ``debug.stop_after``.
"""
from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from dpgen.cli import fail, precheck, remove_fresh_run_dir, user_errors, worker_overrides
from dpgen.core.config import register_configs
from dpgen.core.dist import launch_rank
from dpgen.core.methods import CONFIG_DIR
from dpgen.core.run import TrainingInterrupted
from dpgen.errors import DpgenError

log = logging.getLogger("dpgen")
register_configs()


def _log_to_console_only() -> None:
    """A task > 0 of a multi-task submitit job (``hydra.launcher.tasks_per_node`` > 1) shares rank 0's run directory,
    where Hydra set up its file log too: its lines go to its own stdout (submitit's per-task log), not to train.log."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        root.removeHandler(handler)
        handler.close()


@hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from dpgen.core.pipeline import run_training
    from dpgen.core.resume import resume_dir

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    fresh = resume_dir(cfg.resume, run_dir) is None  # resume=auto with no checkpoint yet is a fresh run too
    scratch = run_dir.name.startswith("dpgen-rank")  # a torchrun rank > 0 (rank 0 writes the run): see worker_overrides
    rank = launch_rank()  # > 0: a torchrun rank, or a task > 0 of a multi-task submitit job (rank 0's directory)
    if rank > 0:
        _log_to_console_only()
    try:
        metrics = run_training(cfg, run_dir)
    except DpgenError as exc:
        log.error("%s", exc)
        if fresh and rank == 0 and not (run_dir / "checkpoints").exists():
            remove_fresh_run_dir(run_dir)
        fail(str(exc))
    except torch.OutOfMemoryError as exc:  # one line naming the memory wanted; the checkpoint so far is kept
        from dpgen.core.devices import oom_message

        log.error("%s", exc)
        fail(oom_message(exc))
    except TrainingInterrupted as exc:
        log.warning("%s; resume with resume=%s", exc, run_dir)
        sys.exit(3)
    finally:
        if scratch:
            shutil.rmtree(run_dir, ignore_errors=True)
    if rank > 0:
        return
    from dpgen.core.summary import run_summary

    print(run_summary(run_dir, metrics))


def check_args(argv: list[str]) -> None:
    """Every value of every job checked before Hydra creates anything (one line, exit code 2 otherwise);
    tests call this in-process."""
    if "--help" not in argv and "-h" not in argv and "--cfg" not in argv:
        with user_errors():
            precheck(argv)


if __name__ == "__main__":
    check_args(sys.argv[1:])
    with user_errors():
        extra = worker_overrides(sys.argv[1:])
    if extra:  # ranks > 0 of torchrun: their own scratch directory replaces any given one
        sys.argv = [a for a in sys.argv if not a.startswith(("hydra.run.dir=", "hydra.output_subdir="))] + extra
    main()
