"""Per-method profile at profile=paper sizes: a short timed run, extrapolated to the full paper run.

For each method, ``train()`` runs on the real paper-sized config for ``--warmup`` + ``--steps`` training
steps (the steps ``Run.step_done`` counts: generator iterations, DP-SGD steps, dpaf groups) and is then
stopped, without writing a checkpoint. Reported per method: seconds per step and steps/s after the warm-up
steps (the device is synchronised before every timestamp), the FLOPs of one step and the achieved TFLOP/s
(FLOPs per step / s per step), peak memory (``torch.cuda.max_memory_allocated`` on CUDA, the process's max
RSS on a CPU), the setup time as run, and the extrapolated wall time of the full run = setup + planned
steps x s/step. Pre-training of the GS-WGAN/DPAC/EFSGD discriminators is run for ``--pretrain-iters`` warm-up
iterations per discriminator only and scaled to the paper's count (it is linear in it); the notes give its
time per (discriminator, warm-up generator) pair and iteration, its FLOPs and TFLOP/s. Evaluation (FID,
classifiers) is not included. Each method runs in its own subprocess (clean peak memory).

FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` (matmuls, convolutions and their
backward passes, a grouped convolution's weight gradient per group: :func:`grouped_conv_backward_flop`;
element-wise work is not counted) over one step that is never timed: the first step of the
run, and for a run with a first phase (below) also the first step of the main phase; for the ensembles also
the first warm-up iteration of the pre-training. The counter costs Python time per operator, so it stays off
while steps are timed; its overhead lands in the setup time.

While it runs it prints a progress line per phase to stderr (setup, pretrain, first phase, main: the step
reached and the s/step so far): every step for the first few, then at most every 10 s. ``--budget S`` stops a
method after S seconds of wall time (from its start, pre-training included) and reports what was measured by
then, with a note; in subprocess mode the parent kills a child that is not back after S s plus a margin.

    python bench/gpu_profile.py [--methods dpgan,...] [--dataset fmnist] [--eps 10] [--device cuda] [--out FILE]
                                [--budget S] [--set gswgan.pretrain_chunk=50 ...]
    python bench/gpu_profile.py --tiny        # CPU smoke test: tiny configs on the embedded digits

Prints a Markdown table (and writes it to ``--out``; docs/performance.md, "GPUs").
bench/gpu_check.py calls :func:`profile_one` in one process for each precision/compile variant of four methods.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import logging
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the dpgen of this checkout, in subprocesses too
METHODS = ("dpgan", "gswgan", "dpac", "efsgd", "gpate", "dpaf", "feta", "dpdm")
ENSEMBLES = ("gswgan", "dpac", "efsgd")  # discriminator pre-training before the first step
COLUMNS = ("method", "dataset", "device", "s/step", "GFLOP/step", "TFLOP/s", "steps/s", "steps (full)", "setup s",
           "peak GB", "full run h", "notes")
PROGRESS_EVERY = 10.0  # seconds between progress lines of one phase, after its first few
PROGRESS_FIRST = 3  # lines printed for every step at the start of a phase
# What the parent waits beyond --budget before it kills a child: the child's clock starts after its imports,
# and a budget stop lands at the next step boundary (or the alarm backstop), not at once.
KILL_MARGIN_S = 60.0
KILL_MARGIN_FRAC = 0.1


class _Enough(Exception):
    """Raised after the timed steps: the profile ends without a checkpoint."""


class _OutOfBudget(BaseException):
    """Raised once ``--budget`` seconds are spent.

    A BaseException like KeyboardInterrupt: the alarm backstop can raise it anywhere inside the training
    code, and no ``except Exception`` there may swallow it.
    """


def _compose(method: str, dataset: str, eps: str, profile: str, overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from dpgen.core.config import register_resolvers
    from dpgen.core.methods import CONFIG_DIR

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"method={method}", f"dataset={dataset}", f"eps={eps}",
                                          f"profile={profile}", *overrides])
    OmegaConf.resolve(cfg)
    return cfg


def base_config(method: str, tiny: bool, profile: str | None = None) -> tuple[str, list[str]]:
    """(profile, overrides) of the config a method is profiled from: the paper's (or ``profile``'s, e.g. quick
    for bench/quick_step.py), or with ``tiny`` the quick profile with tests/tiny.py's overrides (a CPU smoke
    test)."""
    if not tiny:
        return profile or "paper", []
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from tiny import TINY

    return "quick", list(TINY[method])


def _first_phase(method: str, hp, data) -> tuple[str | None, int]:
    """(config key, paper length) of a first phase whose steps cost differently from the rest, or (None, 0).

    dpac/efsgd: iterations before the classifier starts (t_c); feta: warm-up on the central images; dpaf:
    phase 1 (C by DP-SGD). Its steps are timed apart from the main phase's and extrapolated separately.
    """
    if method in ("dpac", "efsgd"):
        module = {"dpac": "dpgen.dpac.method", "efsgd": "dpgen.efsgd.train"}[method]
        start = importlib.import_module(module).classifier_start(hp)
        return ("classifier.start", int(start)) if start else (None, 0)
    if method == "feta" and str(hp.central) != "none":
        return "warmup_iters", int(hp.warmup_iters)
    if method == "dpaf" and hp.conv1 == "transfer":
        from dpgen.dpaf.nets import resolve_layers

        if resolve_layers(hp.layers, list(data.shape)[1])[0] > 0:
            return "c_epochs", int(math.ceil(float(hp.c_epochs) * len(data.train) / int(hp.c_batch_size)))
    return None, 0


def _shorten(key: str, n: int, hp, data) -> str:
    """The override value that makes the first phase ``n`` steps long."""
    if key == "c_epochs":  # t1 = ceil(c_epochs * N / B_C)
        return f"{(n - 0.5) * int(hp.c_batch_size) / len(data.train):.12g}"
    return str(n)


def _applicable(overrides: list[str], cfg) -> list[str]:
    """The ``--set`` overrides that apply to ``cfg``: one list serves several methods, and a ``dpgan.iters=...``
    would make Hydra fail on gswgan's config, whose ``dpgan`` group is null (not loaded)."""
    def loaded(o: str) -> bool:
        key = o.split("=", 1)[0].lstrip("+~")
        return "." not in key or cfg.get(key.split(".", 1)[0]) is not None

    return [o for o in overrides if loaded(o)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def _hms(seconds: float) -> str:
    """A duration for progress lines and notes: seconds, minutes or hours, whichever reads best."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


# ---- pieces the hooks share ------------------------------------------------------------------------------

class _Progress:
    """Progress lines on stderr, flushed: every call for the first few of a phase, then one per interval."""

    def __init__(self, method: str, t0: float, every: float = PROGRESS_EVERY, first: int = PROGRESS_FIRST) -> None:
        self.method, self.t0, self.every, self.first = method, t0, every, first
        self.counts: dict[str, int] = {}
        self.last: dict[str, float] = {}

    def say(self, text: str) -> None:
        print(f"[gpu_profile {self.method} {time.perf_counter() - self.t0:.1f} s] {text}", file=sys.stderr,
              flush=True)

    def tick(self, phase: str, text: str, force: bool = False) -> None:
        """One event of ``phase``; printed if it is among the phase's first few, or the interval has passed."""
        n = self.counts[phase] = self.counts.get(phase, 0) + 1
        now = time.perf_counter()
        if force or n <= self.first or now - self.last.get(phase, -math.inf) >= self.every:
            self.last[phase] = now
            self.say(f"{phase}: {text}")


class _Budget:
    """``--budget`` seconds from the method's start; :meth:`check` raises :class:`_OutOfBudget` past them."""

    def __init__(self, seconds: float | None, t0: float) -> None:
        self.seconds, self.t0 = seconds, t0
        self.where: str | None = None  # set when it stopped the run: the phase and step reached
        self._old_handler: Any = None
        self._armed = False

    @property
    def deadline(self) -> float:
        return math.inf if self.seconds is None else self.t0 + self.seconds

    def check(self, where: Callable[[], str]) -> None:
        if time.perf_counter() >= self.deadline:
            self.where = where()
            raise _OutOfBudget

    def arm(self, where: Callable[[], str]) -> None:
        """A SIGALRM backstop a little after the deadline, for code between the hooks' checks.

        Phases no hook sees (gpate's teacher warm-up, feta's central query, a pre-training that no longer calls
        the hooked names) still stop then. Armed only in the main thread, and only where no one else uses
        the real-time timer (pytest-timeout does under pytest): there the cooperative checks alone apply.
        """
        if (self.seconds is None or not hasattr(signal, "setitimer")
                or threading.current_thread() is not threading.main_thread()
                or signal.getitimer(signal.ITIMER_REAL)[0] > 0
                or signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, None)):
            return

        def on_alarm(signum, frame) -> None:
            if self._armed:
                self._armed = False
                self.where = where() + " (alarm)"
                raise _OutOfBudget

        grace = max(2.0, 0.05 * self.seconds)  # the hooks' clean stops come first where they can
        self._old_handler = signal.signal(signal.SIGALRM, on_alarm)
        self._armed = True
        signal.setitimer(signal.ITIMER_REAL, max(0.01, self.deadline - time.perf_counter() + grace))

    def disarm(self) -> None:
        if self._old_handler is not None:
            self._armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old_handler)
            self._old_handler = None


class _GlobalOnly:
    """Stands in for FlopCounterMode's ModuleTracker, which attributes FLOPs to modules.

    Only the global total is used here, and the tracker's global module hooks break the ensembles' steps:
    under ``functional_call`` a spectral-norm parametrisation's input has no grad_fn, and the tracker's
    ``register_multi_grad_hook`` then raises "Expected gradient function to be set".
    """

    parents = {"Global"}

    def __enter__(self) -> "_GlobalOnly":
        return self

    def __exit__(self, *exc) -> None:
        return None


def grouped_conv_backward_flop(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                               _output_padding, groups, output_mask, out_shape, **_kw) -> int:
    """FLOPs of ``aten.convolution_backward``, the weight gradient counted per group.

    torch's own formula (``torch.utils.flop_counter.conv_backward_flop``) counts the weight gradient of a convolution
    with g groups as a dense one: every input channel times every output channel, g times the real work. vmap turns
    the ensembles' members into groups (100 pairs: 100 groups), so its count of GS-WGAN's pre-training came out above
    the card's matmul rate. Here each output channel meets its own group's ``C_in / g`` input channels only; the
    input gradient, already counted per group there, is torch's.
    """
    from torch.utils.flop_counter import conv_flop_count

    def t(shape):
        return [shape[1], shape[0], *shape[2:]]

    flops = 0
    if output_mask[0]:
        flops += conv_flop_count(grad_out_shape, w_shape, out_shape[0], not transposed)
    if output_mask[1]:
        pair = (t(grad_out_shape), t(x_shape)) if transposed else (t(x_shape), t(grad_out_shape))
        flops += conv_flop_count(*pair, t(out_shape[1]), transposed=False) // max(1, int(groups))
    return flops


def count_flops(fn: Callable[[], Any]) -> tuple[Any, int, int]:
    """(``fn()``, its FLOPs counted per convolution group, what torch's own formula adds to them): the surplus is
    the grouped convolutions' weight gradients counted (groups - 1) times too often (bench/flops.py)."""
    from torch.utils.flop_counter import FlopCounterMode, conv_backward_flop

    surplus = [0]

    def per_group(*shapes, **kw):
        ours = grouped_conv_backward_flop(*shapes, **kw)
        surplus[0] += conv_backward_flop.__wrapped__(*shapes, **kw) - ours  # torch's formula, on shapes
        return ours

    mode = FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: per_group})
    if hasattr(mode, "mod_tracker"):
        mode.mod_tracker = _GlobalOnly()
    with mode:
        out = fn()
    return out, int(mode.get_total_flops()), surplus[0]


class _FlopWindow:
    """A ``FlopCounterMode`` opened by one hook and closed by another (the start and end of one step).

    ``flops`` is set only by a window closed at its regular end; a window left by an exception counts nothing.
    """

    def __init__(self) -> None:
        self.mode = None
        self.flops: int | None = None
        self.error: str | None = None
        self.unsupported: list[str] = []

    def open(self) -> None:
        import inspect

        from torch.utils.flop_counter import FlopCounterMode

        try:
            # skip_unsupported (newer torch): higher-order ops without a formula (compiled graphs) run uncounted,
            # not fail; older torch has no such option and counts what it knows
            extra = ({"skip_unsupported": True}
                     if "skip_unsupported" in inspect.signature(FlopCounterMode.__init__).parameters else {})
            mode = FlopCounterMode(display=False, custom_mapping={
                torch.ops.aten.convolution_backward: grouped_conv_backward_flop}, **extra)
            if hasattr(mode, "mod_tracker"):  # torch >= 2.4's per-module attribution (private, hence the check)
                mode.mod_tracker = _GlobalOnly()
            mode.__enter__()
            self.mode = mode
        except Exception as exc:  # the row then says why the column is empty
            self.error = f"{type(exc).__name__}: {exc}"

    def close(self, complete: bool = True) -> None:
        if self.mode is None:
            return
        mode, self.mode = self.mode, None
        try:
            mode.__exit__(None, None, None)
            if complete:
                self.flops = int(mode.get_total_flops())
                self.unsupported = sorted(getattr(mode, "get_unsupported_ops", list)())
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"


class _Pretrain:
    """What the hooks saw of the ensembles' discriminator pre-training (dpgen.gswgan.train.pretrain).

    (A plain class, not a dataclass: tests load this file by path, outside sys.modules, where dataclasses
    cannot resolve the postponed annotations.)
    """

    def __init__(self) -> None:
        self.members = 0  # discriminators (= warm-up generators) in the ensemble
        self.chunk = 0  # pairs trained at once
        self.iters = 0  # warm-up iterations per pair in this run
        self.iters_full = 0  # ... in the configuration profiled (the paper's, before --pretrain-iters)
        self.t_start = 0.0
        self.t_end: float | None = None  # None while running or when stopped
        self.chunk_lo = -1  # first member of the current chunk
        self.chunk_m = 0
        self.iter_start = 0.0
        self.done: list[tuple[float, int]] = []  # (seconds, members) of each finished warm-up iteration
        self.flops = _FlopWindow()  # the first warm-up iteration (of a chunk)
        self.flops_pairs = 0  # (D, G) pair-iterations the window covered
        self.profiled = -1  # the warm-up iteration a kernel profile covered (left out of the timing)

    def per_pair(self) -> tuple[float | None, bool]:
        """(seconds per (D, G) pair and warm-up iteration, whether the FLOP-counted first iteration is in it)."""
        # the first carries the counter's overhead, a kernel-profiled one the profiler's
        timed = ([d for i, d in enumerate(self.done) if i not in (0, self.profiled)] or self.done[1:]
                 or self.done)
        if not timed:
            return None, False
        return sum(t for t, _ in timed) / sum(m for _, m in timed), len(self.done) == 1

    def total_pairs(self, iters: int) -> int:
        return self.members * iters

    def run_iterations(self) -> int:
        """Warm-up iterations of this run, over all chunks (a chunk's pairs step together)."""
        return self.iters * -(-self.members // max(1, self.chunk))

    def position(self) -> str:
        return (f"members {self.chunk_lo}..{self.chunk_lo + self.chunk_m - 1} of {self.members}, warm-up iteration "
                f"{len(self.done)} of {self.run_iterations()}")


# ---- one method ------------------------------------------------------------------------------------------

def profile_one(method: str, dataset: str, eps: str, device: str, steps: int, warmup: int, tiny: bool,
                pretrain_iters: int, data_root: str, budget: float | None = None,
                overrides: list[str] | None = None, data: Any = None, first_steps: int | None = None,
                profile: str | None = None, kernels: Any = None) -> dict:
    """Train ``method`` for warmup + steps steps (or until ``budget`` s) and return one table row.

    See the module docstring. ``overrides`` are Hydra overrides applied after the tiny ones (``--set``).
    ``data``: the dataset already loaded (bench/gpu_check.py profiles many variants in one process), else it
    is loaded from ``data_root``. ``first_steps``: the steps of a first phase profiled (default warmup + steps;
    more than ``warmup``), for a caller that lets ``budget`` rather than ``steps`` end the main phase.
    ``profile``: the config profile when not ``tiny`` (default paper; bench/quick_step.py passes quick).
    ``kernels``: an object with ``start()`` and ``stop(complete=True)`` (bench/gpu_check.py's ``--kernels``)
    started and stopped around ONE untimed step: the last warm-up step of the main phase (the FLOP-counted one
    when ``warmup`` is 1), or for the ensembles the second warm-up iteration of the pre-training, which is then
    left out of the pre-training's timing. Stopped before that step's timestamp: its overhead stays untimed.
    """
    t_begin = time.perf_counter()
    progress = _Progress(method, t_begin)
    progress.tick("setup", f"composing the config and loading {dataset} on {device}")
    from dpgen.core.methods import load_method
    from dpgen.core.pipeline import quiet_known_noise, seed_everything
    from dpgen.core.precision import run_precision
    from dpgen.core.run import Run
    from dpgen.data import load_config_dataset
    from dpgen.privacy import PrivacyLedger, parse_epsilon

    quiet_known_noise()
    logging.getLogger("absl").setLevel(logging.ERROR)
    dev = torch.device(device)
    notes: list[str] = []
    profile, base = base_config(method, tiny, profile)
    overrides = [*base, *_applicable(overrides or [], _compose(method, dataset, eps, profile, base))]
    cfg = _compose(method, dataset, eps, profile, overrides)
    hp = cfg[cfg.method.hparams]
    if data is None or data.name != cfg.dataset.name:
        data = load_config_dataset(cfg, data_root)
    prefix = cfg.method.hparams
    pre = _Pretrain()
    if method in ENSEMBLES:
        pre.iters_full = int(hp.pretrain_iters)
    if method in ENSEMBLES and not tiny and int(hp.pretrain_iters) > pretrain_iters:
        overrides.append(f"{prefix}.pretrain_iters={pretrain_iters}")
    key, phase1_full = _first_phase(method, hp, data)
    p1 = warmup + steps if first_steps is None else max(first_steps, warmup + 1)
    n1 = p1 if key and phase1_full > p1 else 0
    if n1:
        overrides.append(f"{prefix}.{key}={_shorten(key, n1, hp, data)}")
    elif key:  # a run no longer than the profile (--tiny): its steps are timed together
        notes.append(f"first phase ({key}, {phase1_full} steps) timed with the rest; step 1's FLOPs are of it")
    cfg = _compose(method, dataset, eps, profile, overrides)
    if str(cfg.precision) != "fp32" or bool(cfg.cudnn_benchmark):  # the row says what it measured
        notes.append(f"precision={cfg.precision}" + (", cudnn_benchmark" if bool(cfg.cudnn_benchmark) else ""))
    ledger = PrivacyLedger(delta=float(cfg.delta), target_epsilon=parse_epsilon(cfg.eps),
                           accountant=cfg.privacy.accountant, accounting=cfg.privacy.accounting)
    stamps: list[float] = []
    planned: list[int] = []
    t_pretrain: list[float] = []
    step_flops, main_flops = _FlopWindow(), (_FlopWindow() if n1 else None)
    budget_ = _Budget(budget, t_begin)
    phase = ["setup"]  # the phase reached, for progress lines and the budget's note

    def where() -> str:
        if phase[0] == "pretrain":
            return f"pretrain ({pre.position()})"
        if phase[0] in ("main", "first phase"):
            return f"{phase[0]}, step {len(stamps)}"
        return phase[0]

    def so_far(lo: int) -> str:  # s/step over the stamps from index lo (the phase's FLOP-counted step excluded)
        k = len(stamps) - 1 - lo
        return f"{(stamps[-1] - stamps[lo]) / k:.4g} s/step so far" if k > 0 else "first step done"

    class ProfileRun(Run):
        def start(self, total: int, desc: str) -> None:
            planned.append(int(total))
            super().start(total, desc)
            phase[0] = "first phase" if n1 else "main"
            progress.tick(phase[0], f"training starts ({int(total)} steps planned in this run, profiling the "
                                    f"first {n1 + warmup + steps}); counting the FLOPs of step 1", force=True)
            if len(planned) == 1:
                if kernels is not None and n1 + warmup == 1:  # step 1 is the only untimed step
                    kernels.start()
                step_flops.open()  # step 1: never timed (it ends where the timed steps start at the earliest)

        def step_done(self, step, scalars, state_fn) -> None:
            c = len(stamps) + 1  # this step's number in the profile
            # close a counting window BEFORE the timestamp, open one after: its overhead stays outside the timed steps
            if c == 1:
                step_flops.close()
            if n1 and c == n1 + 1:
                main_flops.close()
            if kernels is not None and c == n1 + warmup:
                kernels.stop()  # before the timestamp: the profiler's overhead stays out of the timed steps
            _sync(dev)
            stamps.append(time.perf_counter())
            if kernels is not None and c == n1 + warmup - 1 and c >= 1:
                kernels.start()  # the next step: the last untimed one
            if n1 and c == n1:
                main_flops.open()  # step n1 + 1, the main phase's first: a warm-up step, never timed
            if n1 and c <= n1:
                phase[0] = "first phase"
                progress.tick(phase[0], f"({key}) step {c} of {n1} profiled ({phase1_full} in full), {so_far(0)}")
            else:
                phase[0] = "main"
                timed = max(0, c - n1 - warmup)
                progress.tick(phase[0], f"step {c - n1} ({timed} timed of {steps}), {so_far(n1)}")
            if c >= n1 + warmup + steps:
                raise _Enough
            budget_.check(where)

    train_mod = importlib.import_module("dpgen.gswgan.train")  # the module (dpgen.gswgan.train is also its function)
    # the names pretrain() looks up in its module; one that a refactor removed is simply not observed (the
    # alarm backstop still enforces the budget, the notes say what could not be measured)
    originals = {name: getattr(train_mod, name) for name in ("pretrain", "critic_step", "GeneratorStack")
                 if hasattr(train_mod, name)}

    def pretrain_progress() -> str:
        per, _ = pre.per_pair()
        text = pre.position()
        if per is not None:
            text += (f", {per * pre.chunk_m:.4g} s per iteration of {pre.chunk_m} pairs, ETA "
                     f"{_hms(per * (pre.total_pairs(pre.iters) - sum(m for _, m in pre.done)))}")
            if pre.iters_full > pre.iters:
                text += f" (full pre-training {_hms(per * pre.total_pairs(pre.iters_full))})"
        return text

    def timed_pretrain(*args, **kwargs):
        """dpgen.gswgan.train.pretrain, timed on its own (to scale it to the paper's length), FLOP-counted over its
        first warm-up iteration, reporting progress and stopped by the budget."""
        given = inspect.signature(originals["pretrain"]).bind_partial(*args, **kwargs).arguments
        disc, hp_ = given.get("disc"), given.get("hp")
        if disc is not None and hp_ is not None:
            pre.members, pre.iters = len(disc), int(hp_.pretrain_iters)
            # a chunk larger than the ensemble holds all of it; null (sized from memory): the first chunk's size
            pre.chunk = 0 if hp_.pretrain_chunk is None else min(int(hp_.pretrain_chunk), len(disc))
            pre.iters_full = max(pre.iters_full, pre.iters)
        phase[0] = "pretrain"
        chunks = pre.chunk or "pairs sized from memory"
        progress.tick("pretrain", f"{pre.members} discriminators in chunks of {chunks}, {pre.iters} warm-up "
                                  f"iterations each (the profiled config has {pre.iters_full})", force=True)
        _sync(dev)
        pre.t_start = t = time.perf_counter()
        pre.flops.open()
        try:
            originals["pretrain"](*args, **kwargs)
        except BaseException:
            pre.flops.close(complete=False)
            raise
        if kernels is not None:
            kernels.stop(complete=False)  # a pre-training of one warm-up iteration: no clean one was profiled
        if not pre.done:  # no iteration boundary seen (pretrain() changed): the window covered all of it
            pre.flops.close()
            pre.flops_pairs = pre.total_pairs(pre.iters)
        _sync(dev)
        pre.t_end = time.perf_counter()
        t_pretrain.append(pre.t_end - t)
        progress.tick("pretrain", f"done in {_hms(pre.t_end - t)}", force=True)
        phase[0] = "setup"  # what follows up to Run.start (noise calibration, the classifier) is setup again

    class ObservedGenerators(originals.get("GeneratorStack", object)):  # type: ignore[misc]
        """The warm-up generators of one chunk: their creation starts a chunk, each step ends a warm-up
        iteration (after its critic steps), the only boundaries pretrain() shows from outside."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            if phase[0] == "pretrain":  # chunks run in member order (pretrain's loop over lo)
                pre.chunk_lo = 0 if pre.chunk_lo < 0 else pre.chunk_lo + pre.chunk_m
                pre.chunk_m = self.m
                pre.chunk = pre.chunk or self.m
                _sync(dev)
                pre.iter_start = time.perf_counter()

        def step(self, *args, **kwargs):
            out = super().step(*args, **kwargs)
            if phase[0] == "pretrain":
                if not pre.done:
                    pre.flops.close()
                    pre.flops_pairs = self.m
                if kernels is not None and len(pre.done) == 1:
                    kernels.stop()
                    pre.profiled = 1
                _sync(dev)
                now = time.perf_counter()
                pre.done.append((now - pre.iter_start, self.m))
                pre.iter_start = now
                if kernels is not None and len(pre.done) == 1:
                    kernels.start()  # the second warm-up iteration
                progress.tick("pretrain", pretrain_progress())
                budget_.check(where)
            return out

    def checked_critic_step(*args, **kwargs):  # finer budget checks: a warm-up iteration holds several of these
        if phase[0] == "pretrain":
            budget_.check(where)
        return originals["critic_step"](*args, **kwargs)

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    stopped = False
    with tempfile.TemporaryDirectory() as tmp:
        run = ProfileRun(tmp, ledger, dev, 0, {}, checkpoint_every=10**9, log_every=10**9, progress=False,
                         tensorboard=False, secure_noise=bool(cfg.privacy.secure_noise))
        seed_everything(0)
        hooks = {"pretrain": timed_pretrain, "critic_step": checked_critic_step, "GeneratorStack": ObservedGenerators}
        for name in originals:
            setattr(train_mod, name, hooks[name])
        phase[0] = "setup"
        progress.tick("setup", "building the method's networks and data tensors", force=True)
        t0 = time.perf_counter()
        try:
            budget_.arm(where)
            budget_.check(where)  # a budget spent by the config and data alone
            # as the pipeline runs it: --set precision=bf16 / cudnn_benchmark=true are measured, not ignored
            with run_precision(cfg, dev):
                load_method(cfg.method.module).train(cfg[cfg.method.hparams], data, ledger, run)
        except _Enough:
            pass
        except _OutOfBudget:
            stopped = True
        finally:
            budget_.disarm()
            t_stop = time.perf_counter()
            for window in (step_flops, main_flops, pre.flops):
                if window is not None:
                    window.close(complete=False)
            if kernels is not None:
                kernels.stop(complete=False)  # a no-op unless a budget stop fell inside the profiled step
            for name, fn in originals.items():
                setattr(train_mod, name, fn)
            run.close()
    if stopped:
        progress.say(f"budget of {budget:g} s reached in {budget_.where}: reporting what was measured")
    return _row(method, cfg, dev, notes, stamps, planned, t0, t_stop, t_pretrain, pre, step_flops, main_flops,
                n1, key, phase1_full, warmup, steps, budget if stopped else None, budget_.where)


def _row(method: str, cfg, dev: torch.device, notes: list[str], stamps: list[float], planned: list[int], t0: float,
         t_stop: float, t_pretrain: list[float], pre: _Pretrain, step_flops: _FlopWindow,
         main_flops: _FlopWindow | None, n1: int, key: str | None, phase1_full: int, warmup: int, steps: int,
         budget: float | None, where: str | None) -> dict:
    """The table row from what profile_one measured (a budget stop leaves some of it missing)."""
    n = len(stamps)

    def per_step(lo: int, hi: int) -> float:  # mean step time of steps lo+1..hi (0-based stamps)
        return (stamps[hi - 1] - stamps[lo - 1]) / (hi - lo)

    if budget is not None:
        notes.append(f"stopped by --budget {budget:g} s in {where}")
    elif n < n1 + warmup + 1:
        raise SystemExit(f"{method}: only {n} steps ran; lower --warmup")

    # main phase: the timed steps, or under a budget stop whatever steps after the FLOP-counted one finished
    main_s: float | None = None
    timed = max(0, n - n1 - warmup)
    if timed:
        main_s = per_step(n1 + warmup, n)
        if budget is not None:
            notes.append(f"s/step from {timed} of {steps} timed steps")
    elif n >= n1 + 2:
        main_s = per_step(n1 + 1, n)
        notes.append(f"s/step from {n - n1 - 1} untimed warm-up steps only")
    elif budget is not None:
        notes.append("no main-phase step timed")

    first_s: float | None = main_s
    if n1:
        if n >= n1:
            first_s = per_step(warmup, n1)
        elif n >= warmup + 1:
            first_s = per_step(warmup, n)
        elif n >= 2:
            first_s = per_step(1, n)
        else:
            first_s = None
        if first_s is not None:
            text = f"first phase ({key}): {phase1_full} steps at {first_s:.3g} s/step"
            if step_flops.flops is not None:  # step 1 is the first phase's
                text += f", {step_flops.flops / 1e9:.4g} GFLOP/step ({step_flops.flops / first_s / 1e12:.3g} TFLOP/s)"
            notes.append(text)

    # FLOPs of one main-phase step, and the achieved rate
    window = main_flops if n1 else step_flops
    gflop = tflops = None
    if window.flops is not None:
        gflop = window.flops / 1e9
        tflops = window.flops / main_s / 1e12 if main_s else None
        if window.unsupported:
            notes.append(f"FLOPs of {', '.join(window.unsupported)} not counted")
    elif window.error or budget is None or n > n1:  # (a budget stop before the main phase said so already)
        notes.append(f"FLOPs not counted ({window.error or 'no main-phase step finished'})")

    # setup: up to the end of the first step, less that step; the pre-training scaled to the profiled length
    setup: float | None = None
    if n:  # without a step time (a budget stop after one step) the first step stays in: an upper bound
        setup = max(0.0, stamps[0] - t0 - (first_s or 0.0))
    per_pair, with_counter = pre.per_pair()
    pretrain_full: float | None = None
    if pre.members:
        if per_pair is not None:
            pretrain_full = per_pair * pre.total_pairs(pre.iters_full)
        elif t_pretrain and pre.iters:
            pretrain_full = t_pretrain[0] * pre.iters_full / pre.iters  # no iteration seen: scale the whole
        if pre.t_end is not None and pre.iters_full > pre.iters and setup is not None:
            # the run did pre.iters of the profiled config's pre.iters_full warm-up iterations (none: the
            # pre-training was skipped, bench/quick_step.py, and the setup stays without it)
            if per_pair is not None:
                setup += per_pair * pre.total_pairs(pre.iters_full - pre.iters)
            elif pre.iters:
                setup += t_pretrain[0] * (pre.iters_full / pre.iters - 1.0)
        if pre.t_end is None and pretrain_full is not None:  # stopped in it: no step ran
            setup = pre.t_start - t0 + pretrain_full
        notes.append(_pretrain_note(pre, per_pair, with_counter, pretrain_full))

    # dpac/efsgd's first phase is the start of the planned iterations (shortening it leaves their number);
    # feta's warm-up and dpaf's phase 1 come on top of the main phase's steps
    main_steps = (planned[0] if planned else 0) - (phase1_full if n1 and key == "classifier.start" else n1)
    phase1 = phase1_full if n1 else 0
    full_steps = phase1 + main_steps if planned else None
    full_h = None
    if setup is not None and main_s is not None and full_steps is not None and (not n1 or first_s is not None):
        full_h = (setup + phase1 * (first_s or 0.0) + main_steps * main_s) / 3600
    elif setup is not None and budget is not None:
        notes.append(f"full run > {setup / 3600:.3g} h (setup and pre-training alone)")
    elif budget is not None and not n:
        notes.append(f"setup > {t_stop - t0:.3g} s")
    return {"method": method, "dataset": cfg.dataset.name, "device": _device_name(dev), "s/step": main_s,
            "GFLOP/step": gflop, "TFLOP/s": tflops,
            "steps/s": (1.0 / main_s if main_s > 0 else math.inf) if main_s is not None else None,
            "steps (full)": full_steps, "setup s": setup, "peak GB": _peak_gb(dev), "full run h": full_h,
            "steps timed": timed,
            # training start to the first timed step (setup, first phase, warm-up steps: compilation lands here)
            "untimed s": stamps[n1 + warmup - 1] - t0 if n >= n1 + warmup else None,
            "step times": [b - a for a, b in zip(stamps[n1 + warmup - 1:], stamps[n1 + warmup:])],
            "stopped": where if budget is not None else None,
            **_pretrain_fields(pre, per_pair, pretrain_full), "notes": "; ".join(notes)}


def _pretrain_fields(pre: _Pretrain, per_pair: float | None, full: float | None) -> dict:
    """The ensembles' pre-training as numbers (bench/gpu_check.py's pre-training rows): seconds per warm-up
    iteration of one chunk (its pairs step together), the achieved TFLOP/s, the full pre-training in hours."""
    if not pre.members:
        return {}
    flops_pair = pre.flops.flops / pre.flops_pairs if pre.flops.flops is not None and pre.flops_pairs else None
    return {"pretrain s/iter": per_pair * pre.chunk if per_pair is not None else None,
            "pretrain TFLOP/s": flops_pair / per_pair / 1e12 if flops_pair and per_pair else None,
            "pretrain full h": full / 3600 if full is not None else None,
            "pretrain iters timed": max(0, len(pre.done) - 1) if len(pre.done) > 1 else len(pre.done),
            "pretrain pairs": pre.members, "pretrain chunk": pre.chunk, "pretrain iters (full)": pre.iters_full}


def _pretrain_note(pre: _Pretrain, per_pair: float | None, with_counter: bool, full: float | None) -> str:
    """The ensembles' pre-training in one note: time and FLOPs per (D, G) pair and warm-up iteration."""
    done = len(pre.done)
    text = (f"pre-training {pre.members} pairs x {pre.iters_full} warm-up iterations in chunks of {pre.chunk}: "
            f"{done} of {pre.run_iterations()} iterations run")
    if per_pair is None:
        return text + (", no iteration observed" + (f", {_hms(full)} by its total time" if full else ""))
    text += f", {per_pair * 1e3:.4g} ms per pair-iteration"
    if with_counter:
        text += " (one iteration, with the FLOP counter on)"
    if pre.flops.flops is not None and pre.flops_pairs:
        flop_pair = pre.flops.flops / pre.flops_pairs
        text += f", {flop_pair / 1e9:.4g} GFLOP per pair-iteration ({flop_pair / per_pair / 1e12:.3g} TFLOP/s)"
    if full is not None:
        measured_all = pre.t_end is not None and pre.iters_full == pre.iters
        text += f", full pre-training {_hms(full)}" + ("" if measured_all else " (extrapolated)")
    return text


def _device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c)) for c in COLUMNS) + " |")
    return "\n".join(lines)


# ---- subprocess mode -------------------------------------------------------------------------------------

def run_child(cmd: list[str], timeout: float | None) -> tuple[int | None, str, str]:
    """Run ``cmd``, relaying its stderr line by line to ours as it comes; (return code, stdout, last stderr line).

    The return code is None when the child was still running after ``timeout`` seconds and was killed.
    stdout is collected (the child's JSON row); stderr is read by a thread so that progress shows live and a
    full pipe never blocks the child.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    last = [""]
    out: list[str] = []

    def relay() -> None:
        for line in proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            if line.strip():
                last[0] = line.strip()

    def collect() -> None:
        out.append(proc.stdout.read())

    threads = [threading.Thread(target=relay, daemon=True), threading.Thread(target=collect, daemon=True)]
    for t in threads:
        t.start()
    try:
        code: int | None = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = None
    for t in threads:
        t.join(timeout=10)
    return code, "".join(out), last[0]


def child_row(method: str, dataset: str, device: str, cmd: list[str], budget: float | None) -> dict:
    """One method profiled in a child process (``cmd``); a failed or overdue child gives a row saying why."""
    timeout = None if budget is None else budget + KILL_MARGIN_S + KILL_MARGIN_FRAC * budget
    code, stdout, last = run_child(cmd, timeout)
    if code == 0 and stdout.strip():
        return json.loads(stdout.strip().splitlines()[-1])
    if code is None:
        why = f"exceeded budget ({budget:g} s + {timeout - budget:.0f} s margin), killed"
    elif code < 0:
        why = f"killed by signal {-code} (out of memory?)"
    else:
        why = last or f"exit status {code}"
    return {"method": method, "dataset": dataset, "device": device, "notes": f"failed: {why}"}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--dataset", default=None, help="default: fmnist (paper), digits (--tiny)")
    ap.add_argument("--eps", default="10")
    ap.add_argument("--device", default=None, help="default: cuda if available (cpu with --tiny)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 20, 3 with --tiny)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed first steps (default 3, 1 with --tiny)")
    ap.add_argument("--pretrain-iters", type=int, default=5)
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds per method: stop it then and report what was measured (default: no limit)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="a Hydra override for every method profiled, e.g. gswgan.pretrain_chunk=50 (repeatable)")
    ap.add_argument("--tiny", action="store_true", help="tests/tiny.py's configs on digits: a CPU smoke test")
    ap.add_argument("--inline", action="store_true", help="run every method in this process (no subprocesses)")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--out", default=None, help="also write the Markdown table here")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child process: one method, JSON on stdout
    a = ap.parse_args(argv)
    if (a.warmup is not None and a.warmup < 1) or (a.steps is not None and a.steps < 1):
        raise SystemExit("error: --warmup and --steps must be >= 1")
    if a.budget is not None and a.budget <= 0:
        raise SystemExit("error: --budget must be > 0")

    device = a.device or ("cpu" if a.tiny or not torch.cuda.is_available() else "cuda")
    dataset = a.dataset or ("digits" if a.tiny else "fmnist")
    steps = a.steps if a.steps is not None else (3 if a.tiny else 20)
    warmup = a.warmup if a.warmup is not None else (1 if a.tiny else 3)
    data_root = a.data_root or os.environ.get("DPGEN_DATA", "data")
    args = (dataset, a.eps, device, steps, warmup, a.tiny, a.pretrain_iters, data_root, a.budget, a.overrides)
    if a.one:
        print(json.dumps(profile_one(a.one, *args)), flush=True)
        return []
    rows = []
    for method in a.methods.split(","):
        if method not in METHODS:
            raise SystemExit(f"error: unknown method {method!r}; choose from {', '.join(METHODS)}")
        if a.inline:
            rows.append(profile_one(method, *args))
        else:
            cmd = [sys.executable, __file__, "--one", method, "--dataset", dataset, "--eps", a.eps, "--device", device,
                   "--steps", str(steps), "--warmup", str(warmup), "--pretrain-iters", str(a.pretrain_iters),
                   "--data-root", data_root] + (["--tiny"] if a.tiny else [])
            cmd += (["--budget", repr(a.budget)] if a.budget is not None else [])
            cmd += [f"--set={o}" for o in a.overrides]
            rows.append(child_row(method, dataset, device, cmd, a.budget))
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    out = table(rows)
    print(out)
    if a.out:
        Path(a.out).write_text(out + "\n")
    return rows


if __name__ == "__main__":
    main()
