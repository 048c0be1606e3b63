"""One GPU per job in local multi-process sweeps (``hydra/launcher=local``), issue 14 §5.

Every sweep job resolves ``device=auto`` to ``cuda``, i.e. the process's current CUDA device, which is GPU 0
unless someone says otherwise: with 4 GPUs and ``n_jobs=4`` all four jobs would share GPU 0. The Hydra
callback :class:`SweepGPUs` (enabled by ``configs/hydra/launcher/local.yaml``) runs in the worker process at
the start of each job and makes one GPU that job's current device (``torch.cuda.set_device``), so
``cuda`` tensors, generators and modules land there without any change to the methods.

Which GPU: the job claims a free one with an exclusive ``flock`` on ``gpu<i>.lock`` in a per-user lock
folder, trying ``job_num % n`` first (round robin), then the others; it holds the lock until the job
ends (the OS drops it if the worker dies). When every GPU is taken (more jobs than GPUs) it shares
``job_num % n``. Plain round robin by job number alone would put a new job on a GPU whose earlier job is
still running while another GPU idles; the locks also keep two concurrent sweeps of one user apart.
Jobs that name a device (``device=cpu``, ``device=cuda:1``), single runs and machines with fewer than two
GPUs are left alone.
"""
from __future__ import annotations

import fcntl
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("dpgen")


def default_lock_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"dpgen-gpu-locks-{os.getuid()}"


class GpuClaim:
    """An exclusive claim on one of ``n`` GPUs, or a shared fallback; :meth:`release` gives it back."""

    def __init__(self, index: int, handle: Any | None) -> None:
        self.index, self._handle = index, handle

    @property
    def exclusive(self) -> bool:
        return self._handle is not None

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the file drops its flock
            self._handle = None


def claim_gpu(job_num: int, n: int, lock_dir: Path) -> GpuClaim:
    """The first free GPU starting at ``job_num % n`` (round robin), or ``job_num % n`` shared if none is free."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    for k in range(n):
        i = (job_num + k) % n
        handle = open(lock_dir / f"gpu{i}.lock", "a+")  # noqa: SIM115 - kept open while the claim lasts
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        return GpuClaim(i, handle)
    return GpuClaim(job_num % n, None)


def sweep_job_num(config: DictConfig) -> int | None:
    """This job's index in a multirun sweep, None for a single run."""
    hydra = config.get("hydra")
    if hydra is None or not str(hydra.get("mode")).endswith("MULTIRUN"):  # RunMode.MULTIRUN
        return None
    num = hydra.job.get("num")
    return None if num is None else int(num)


class SweepGPUs(Callback):
    """Hydra callback: each local sweep job on its own GPU (see the module docstring)."""

    def __init__(self, lock_dir: str | None = None) -> None:
        self.lock_dir = Path(lock_dir) if lock_dir else default_lock_dir()
        self._claim: GpuClaim | None = None

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        num = sweep_job_num(config)
        if num is None or str(config.get("device", "auto")) not in ("auto", "cuda"):
            return
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n < 2:
            return
        self._claim = claim_gpu(num, n, self.lock_dir)
        torch.cuda.set_device(self._claim.index)
        log.info("sweep job %d: GPU %d of %d%s", num, self._claim.index, n,
                 "" if self._claim.exclusive else " (shared: more jobs than GPUs)")

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        if self._claim is not None:
            self._claim.release()
            self._claim = None
