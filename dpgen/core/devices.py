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

Admission by memory (issue 24): six paper jobs on one 80 GB card died of CUDA out-of-memory. Each job also
records the memory it expects (``memory_gb``: the method's peak measured on an H100, :data:`PEAK_GB`, or a
number) in a claims file shared by the user's sweeps; a job that finds no free GPU shares one only where the
claims plus its own fit the card, and otherwise WAITS (polling) until a job ends, instead of dying mid-run. On a
machine with one GPU the jobs queue the same way. A job that still runs out of memory ends with one line naming
the memory it wanted (:func:`oom_message`).
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

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


#: peak GPU memory (GB) of one profile=paper job, F-MNIST, measured on an H100 (issue 24, bench/gpu_profile.py),
#: rounded up with a margin; other datasets are not measured (set the callback's memory_gb). profile=quick: QUICK_GB.
PEAK_GB: dict[str, float] = {"dpgan": 1.5, "dpaf": 2.5, "gpate": 28.0, "feta": 44.0, "dpdm": 44.0, "gswgan": 54.0,
                             "dpac": 54.0, "efsgd": 54.0}
QUICK_GB = 2.0


def expected_gb(config: DictConfig, memory_gb: float | str | None) -> float | None:
    """The memory a job claims: ``memory_gb`` if a number, :data:`PEAK_GB` for ``"auto"``, None (no admission)."""
    if memory_gb is None:
        return None
    if str(memory_gb) != "auto":
        return float(memory_gb)
    profile = str(config.get("profile", {}).get("name", "quick")) if isinstance(config.get("profile"), DictConfig) \
        else str(config.get("profile", "quick"))
    method = str(config.get("method", {}).get("name", "")) if isinstance(config.get("method"), DictConfig) else ""
    return PEAK_GB.get(method, QUICK_GB) if profile == "paper" else QUICK_GB


class MemoryClaims:
    """The memory every running sweep job of this user expects on each GPU: ``claims.json`` under a flock, entries
    of processes that died dropped on every read."""

    def __init__(self, lock_dir: Path, alive: Callable[[int], bool] | None = None) -> None:
        self.dir = Path(lock_dir)
        self.alive = alive or _pid_alive

    @contextmanager
    def _locked(self) -> Iterator[dict]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "claims.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.dir / "claims.json"
            try:
                claims = json.loads(path.read_text()) if path.exists() else {}
            except (OSError, ValueError):
                claims = {}  # a torn or foreign file: start over (a claim only delays jobs)
            claims = {k: v for k, v in claims.items() if self.alive(int(k.split(":")[0]))}
            yield claims
            path.write_text(json.dumps(claims))

    def admit(self, key: str, gb: float, totals_gb: list[float], prefer: int, exclusive: int | None) -> int | None:
        """Record ``gb`` on a GPU and return its index, or None if no GPU has room: ``exclusive`` (a GPU this job holds
        alone) always; otherwise the first GPU from ``prefer`` whose claims plus ``gb`` fit its memory."""
        with self._locked() as claims:
            n = len(totals_gb)
            order = [exclusive] if exclusive is not None else [(prefer + k) % n for k in range(n)]
            for i in order:
                used = sum(g for j, g in claims.values() if j == i)
                if exclusive is not None or used + gb <= totals_gb[i]:
                    claims[key] = [i, gb]
                    return i
            return None

    def release(self, key: str) -> None:
        with self._locked() as claims:
            claims.pop(key, None)

    def used(self) -> dict[int, float]:
        with self._locked() as claims:
            out: dict[int, float] = {}
            for i, g in claims.values():
                out[i] = out.get(i, 0.0) + g
            return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def oom_message(exc: BaseException, device: torch.device | None = None) -> str:
    """One line for a CUDA out-of-memory error: what the run tried to allocate, what it held, the card's size."""
    asked = re.search(r"Tried to allocate ([0-9.]+ [KMGT]?i?B)", str(exc))
    parts = [f"out of memory on {device or 'the GPU'}"]
    if asked:
        parts.append(f"the run wanted {asked.group(1)} more")
    if torch.cuda.is_available():
        dev = device if device is not None and device.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
        total = torch.cuda.get_device_properties(dev).total_memory / 2**30
        parts.append(f"after a peak of {torch.cuda.max_memory_allocated(dev) / 2**30:.1f} GiB of {total:.1f} GiB")
    return ", ".join(parts) + ("; lower the ensemble chunk or micro-batch, or give the job more memory "
                               "(a GPU of its own; sweeps: hydra.callbacks.sweep_gpus.memory_gb)")


def sweep_job_num(config: DictConfig) -> int | None:
    """This job's index in a multirun sweep, None for a single run."""
    hydra = config.get("hydra")
    if hydra is None or not str(hydra.get("mode")).endswith("MULTIRUN"):  # RunMode.MULTIRUN
        return None
    num = hydra.job.get("num")
    return None if num is None else int(num)


class SweepGPUs(Callback):
    """Hydra callback: each local sweep job on its own GPU, admitted by memory (see the module docstring).

    ``memory_gb``: ``"auto"`` (:func:`expected_gb`), a number of GB, or None (no admission: share round robin).
    """

    def __init__(self, lock_dir: str | None = None, memory_gb: float | str | None = "auto", poll_s: float = 10.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.lock_dir = Path(lock_dir) if lock_dir else default_lock_dir()
        self.memory_gb, self.poll_s, self._sleep = memory_gb, float(poll_s), sleep
        self._claim: GpuClaim | None = None
        self._key: str | None = None

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        num = sweep_job_num(config)
        if num is None or str(config.get("device", "auto")) not in ("auto", "cuda"):
            return
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        want = expected_gb(config, self.memory_gb)
        if n < (1 if want is not None else 2):
            return
        if want is None:
            self._claim = claim_gpu(num, n, self.lock_dir)
        else:
            self._claim = self._admit(num, n, want)
        if n > 1:
            torch.cuda.set_device(self._claim.index)
        log.info("sweep job %d: GPU %d of %d%s%s", num, self._claim.index, n,
                 "" if self._claim.exclusive else " (shared: more jobs than GPUs)",
                 "" if want is None else f", {want:g} GB claimed")

    def _admit(self, num: int, n: int, want: float) -> GpuClaim:
        totals = [torch.cuda.get_device_properties(i).total_memory / 1e9 for i in range(n)]
        if want > max(totals):
            from dpgen.errors import DpgenError

            raise DpgenError(f"sweep job {num} expects {want:g} GB of GPU memory; the largest GPU here has "
                             f"{max(totals):.0f} GB (set hydra.callbacks.sweep_gpus.memory_gb, or a smaller chunk)")
        claims, self._key, waited = MemoryClaims(self.lock_dir), f"{os.getpid()}:{num}", False
        while True:
            claim = claim_gpu(num, n, self.lock_dir)
            index = claims.admit(self._key, want, totals, num % n, claim.index if claim.exclusive else None)
            if index is not None:
                return GpuClaim(index, claim._handle) if claim.exclusive else claim_shared(index, claim)
            claim.release()
            if not waited:
                log.info("sweep job %d waits for %g GB of GPU memory (claimed per GPU: %s)", num, want,
                         {i: round(g, 1) for i, g in sorted(claims.used().items())})
                waited = True
            self._sleep(self.poll_s)

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        if self._key is not None:
            MemoryClaims(self.lock_dir).release(self._key)
            self._key = None
        if self._claim is not None:
            self._claim.release()
            self._claim = None


def claim_shared(index: int, fallback: GpuClaim) -> GpuClaim:
    """A shared claim on GPU ``index`` (the memory claims chose it); the fallback's lock, if any, is dropped."""
    fallback.release()
    return GpuClaim(index, None)
