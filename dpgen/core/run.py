"""The run context a method trains in: device, random streams, logging, progress, checkpoints.

A method never writes files itself; it reports steps to :class:`Run`, which keeps the
tqdm bar (step, ε spent, losses), tensorboard, ``train.log`` and ``checkpoints/last.pt``.
Its random streams (:class:`~dpgen.core.streams.RandomStreams`) are public (:meth:`Run.rng`, fixed by
``seed``) or secret (:meth:`Run.secret_rng`, from OS entropy): every draw a privacy analysis treats as
random comes from a secret one.

In a multi-process run (:mod:`dpgen.core.dist`) every rank holds a ``Run`` with the same streams (rank 0's
secret root, broadcast), so all ranks draw the same samples and noise; rank 0 alone writes the checkpoint,
tensorboard and the progress bar, and every rank restores from that one checkpoint.
"""
from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm import tqdm

from dpgen.core.checkpoint import fingerprint_diff, load_checkpoint, rng_state, set_rng_state
from dpgen.core.dist import SINGLE, Dist
from dpgen.core.streams import RandomStreams, fixed_root
from dpgen.io import atomic_save
from dpgen.errors import DpgenError
from dpgen.privacy import PrivacyLedger, compute_epsilon
from dpgen.privacy.randomness import SecretGenerator

log = logging.getLogger("dpgen")


def progress_epsilon(ledger: PrivacyLedger) -> tuple[str, float]:
    """(name, value) of the ε the progress bar and logs show; cheap enough for every ``log_every`` steps.

    With the RDP accountant this is the reported ε itself (the per-release RDP curves are cached, so a
    refresh costs ~0.1 ms, paper analyses included). The PLD accountant needs ~1 s per refresh (a GPU would
    idle ~20 min of a 20k-step run at log_every=20), so a PLD ledger shows ``epsilon_rdp``: the sound ε of
    the same releases from the cached RDP curves, an upper bound that PLD only tightens. The exact value is
    logged at the end and written to privacy.json; budget guards always use the ledger's own accountant.
    """
    if not ledger.entries:
        return "epsilon", 0.0
    if ledger.accountant == "rdp":
        return "epsilon", float(ledger.report_epsilon())
    return "epsilon_rdp", float(compute_epsilon(ledger.entries, ledger.delta, accountant="rdp"))


class TrainingInterrupted(Exception):
    """Raised by ``debug.stop_after`` to simulate a crash right after a checkpoint."""


class Run:
    """Everything a method's ``train`` needs besides its data and ledger."""

    def __init__(
        self,
        run_dir: str | Path,
        ledger: PrivacyLedger,
        device: torch.device,
        seed: int,
        fingerprint: dict,
        checkpoint_every: int = 500,
        log_every: int = 20,
        stop_after: int | None = None,
        resume: bool = False,
        tensorboard: bool = True,
        progress: bool = True,
        noise_seed: int | None = None,
        secure_noise: bool = True,
        dist: Dist = SINGLE,
    ) -> None:
        self.dir = Path(run_dir)
        self.ledger = ledger
        self.device = device
        self.seed = seed
        self.fingerprint = fingerprint
        self.checkpoint_every = max(1, int(checkpoint_every))
        self.log_every = max(1, int(log_every))
        self.stop_after = stop_after
        self.dist = dist
        self.show_progress = progress and dist.main
        self._writer = None
        self._tensorboard = tensorboard and dist.main
        self._pbar: tqdm | None = None
        self._eps_cache: tuple[int, tuple[str, float]] | None = None
        self._t0 = time.time()
        self.resume_state: dict | None = None
        #: training statistics a method wants in metrics.json (under "training"); must be
        #: computed from released/DP quantities or be clearly diagnostic, like the evaluator's
        self.extra_metrics: dict[str, Any] = {}
        #: the canaries of an audit run (:class:`dpgen.audit.Canaries`, set by the pipeline when the config has an
        #: ``audit`` block); None in every other run, and then no mechanism computes anything for them
        self.audit: Any = None
        # the secret root: OS entropy, or fixed by privacy.noise_seed (then the run has no DP guarantee); rank 0's
        # on every rank, sent over the process group
        root = dist.broadcast(secrets.token_hex(32) if noise_seed is None else fixed_root(noise_seed))
        self.streams = RandomStreams(device, seed, root, secure_noise=secure_noise)
        if resume:
            self._load_resume_state()

    # ---- random streams ------------------------------------------------------------------
    def rng(self, name: str) -> torch.Generator:
        """The public stream ``name`` on the run's device, fixed by ``seed``: initialisation, latents, loss draws
        (anything a privacy analysis does not treat as random)."""
        return self.streams.public(name)

    def secret_rng(self, name: str) -> SecretGenerator:
        """The secret stream ``name`` on the run's device: sampling, partition draws, every mechanism's noise."""
        return self.streams.secret(name)

    def restore_rngs(self) -> None:
        """On resume (no-op otherwise): every stream handed out so far, and any handed out later, continues
        where the interrupted run left it. Call it once the models are rebuilt (their initialisation may
        draw from a stream)."""
        if self.resume_state:
            self.streams.restore(self.resume_state["streams"])

    # ---- checkpoints ---------------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        return self.dir / "checkpoints" / "last.pt"

    def _load_resume_state(self) -> None:
        ckpt = load_checkpoint(self.checkpoint_path)
        shown = fingerprint_diff(ckpt.get("fingerprint", {}), self.fingerprint)
        if shown:
            raise DpgenError(f"resume config differs from the checkpoint ({shown}); resume with the original settings")
        self.ledger.load_state_dict(ckpt["ledger"])
        self.streams.load_root(ckpt["streams"])
        set_rng_state(ckpt["rng"])
        self.resume_state = ckpt
        log.info("resumed from %s at step %d (epsilon so far %.4f)", self.checkpoint_path, ckpt["step"],
                 self.ledger.epsilon() if self.ledger.entries else 0.0)

    def save_checkpoint(self, step: int, state: dict[str, Any]) -> None:
        """Atomically write ``checkpoints/last.pt`` with the method state, ledger and RNG states.

        The checkpoint holds the secret root and the non-private ensemble states: it is private (docs/privacy.md,
        "Threat model"). Rank 0 writes it; every rank's streams and state are the same."""
        if not self.dist.main:
            return
        payload = {
            "step": int(step),
            "state": state,
            "streams": self.streams.state_dict(),
            "ledger": self.ledger.state_dict(),
            "rng": rng_state(),
            "fingerprint": self.fingerprint,
        }
        atomic_save(payload, self.checkpoint_path)

    @property
    def start_step(self) -> int:
        return int(self.resume_state["step"]) if self.resume_state else 0

    # ---- progress and logging ------------------------------------------------------------
    @property
    def writer(self):
        if self._writer is None and self._tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.dir / "tb"))
        return self._writer

    def epsilon_spent(self, step: int) -> tuple[str, float]:
        """The progress ε (:func:`progress_epsilon`) as (name, value), recomputed at most once per step."""
        if self._eps_cache is None or self._eps_cache[0] != step:
            self._eps_cache = (step, progress_epsilon(self.ledger))
        return self._eps_cache[1]

    def start(self, total: int, desc: str) -> None:
        self._pbar = tqdm(total=total, initial=self.start_step, desc=desc, dynamic_ncols=True,
                          disable=not self.show_progress, mininterval=1.0)

    def step_done(self, step: int, scalars: dict[str, float], state_fn: Callable[[], dict]) -> None:
        """Report a finished training step: progress, logs, periodic checkpoint, debug stop."""
        if self._pbar is not None:
            self._pbar.update(step - self._pbar.n)
        if step % self.log_every == 0:
            eps_name, eps = self.epsilon_spent(step)
            scalars = {**{k: float(v) for k, v in scalars.items()}, eps_name: eps}
            if self._pbar is not None:
                self._pbar.set_postfix({k: f"{v:.3g}" for k, v in scalars.items()}, refresh=False)
            if self.writer is not None:
                for k, v in scalars.items():
                    self.writer.add_scalar(f"train/{k}", v, step)
            log.info("step %d %s", step, " ".join(f"{k}={v:.4g}" for k, v in scalars.items()))
        if step % self.checkpoint_every == 0 or (self.stop_after is not None and step >= self.stop_after):
            self.save_checkpoint(step, state_fn())
        if self.stop_after is not None and step >= self.stop_after:
            raise TrainingInterrupted(f"debug.stop_after={self.stop_after} reached at step {step}")

    def finish(self, step: int, state: dict) -> None:
        """Final checkpoint and closing log line."""
        self.save_checkpoint(step, state)
        if self._pbar is not None:
            self._pbar.close()
        log.info("training finished at step %d in %.1fs, epsilon=%.4f (%s accountant)", step, time.time() - self._t0,
                 self.ledger.report_epsilon() if self.ledger.entries else 0.0, self.ledger.accountant)

    def close(self) -> None:
        if self._pbar is not None:
            self._pbar.close()
        if self._writer is not None:
            self._writer.close()


class RecordingRun(Run):
    """A Run for diagnostics (``python -m dpgen.<method>.diagnose``): keeps every step's scalars in ``rows`` (use
    ``log_every=1``) and writes no checkpoint."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rows: list[dict[str, float]] = []

    def step_done(self, step, scalars, state_fn) -> None:
        self.rows.append({k: float(v) for k, v in scalars.items()})
        super().step_done(step, scalars, state_fn)

    def save_checkpoint(self, step, state) -> None:
        pass  # a diagnostic run needs no checkpoint
