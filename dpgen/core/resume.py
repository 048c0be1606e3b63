"""``resume=auto``: continue from this job's own checkpoint if a previous attempt left one, else start.

A SLURM job that is preempted or hits its time limit is requeued by submitit with the same overrides, so it
runs again in the same run directory (``configs/hydra/launcher/slurm.yaml``). With ``resume=auto`` that
second attempt picks up ``checkpoints/last.pt`` instead of training from scratch. The checkpoint is then
loaded exactly as for ``resume=<dir>`` (fingerprint check, ledger, RNG states), so a leftover checkpoint of
a different configuration is refused with a one-line error, never silently continued.
"""
from __future__ import annotations

from pathlib import Path

from dpgen.errors import DpgenError

AUTO = "auto"
CHECKPOINT = Path("checkpoints") / "last.pt"


def resume_dir(resume: str | Path | None, run_dir: str | Path) -> Path | None:
    """The run directory whose checkpoint this job continues, or None to start fresh.

    ``resume=None``: start. ``resume=auto``: ``run_dir`` if ``run_dir/checkpoints/last.pt`` exists, else
    start. ``resume=<dir>``: that directory, which must hold a checkpoint.
    """
    if resume is None or str(resume) in ("", "null"):
        return None
    if str(resume) == AUTO:
        run_dir = Path(run_dir)
        return run_dir if (run_dir / CHECKPOINT).is_file() else None
    path = Path(resume).expanduser()
    if not (path / CHECKPOINT).is_file():
        raise DpgenError(f"resume={resume}: no checkpoint at {path / CHECKPOINT} (use resume=auto to start when absent)")
    return path
