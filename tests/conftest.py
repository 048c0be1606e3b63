"""Shared helpers: run the real CLI scripts in a subprocess, in a scratch working directory."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# No test downloads anything (dpgen.eval.inception's eval.inception_download); CLI subprocesses inherit it.
os.environ["DPGEN_OFFLINE"] = "1"

# Small enough for CI, big enough to exercise every stage (training, checkpoint, release, eval).
TINY = [
    "dpgan.iters=12", "dpgan.batch_size=64", "dpgan.g_width=8", "dpgan.d_width=8",
    "checkpoint_every=4", "log_every=4", "samples_per_class=4", "progress=false",
    "eval.num_samples=200", "eval.epochs=1", "eval.fid=false", "eval.classifiers=[cnn]",
]


def run_script(script: str, *args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "DPGEN_DATA": str(cwd / "data"), "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def in_memory_run(run_dir: Path, ledger, **kwargs):
    """A Run for calling a method's train() directly: CPU, seed 0, no progress bar or tensorboard
    (``kwargs``: e.g. ``stop_after``, ``resume``, ``checkpoint_every``)."""
    import torch

    from dpgen.core.run import Run

    return Run(run_dir, ledger, torch.device("cpu"), 0, {}, progress=False, tensorboard=False, **kwargs)


@pytest.fixture
def one_torch_thread():
    """One intra-op thread: two OpenMP threads contending with other jobs on 2 cores are several times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> Path:
    """One finished tiny default run (digits, dpgan), shared by the output-contract tests."""
    cwd = tmp_path_factory.mktemp("cli")
    run_dir = cwd / "run"
    res = run_script("train.py", *TINY, f"hydra.run.dir={run_dir}", cwd=cwd)
    assert res.returncode == 0, res.stderr[-3000:]
    (cwd / "stdout.txt").write_text(res.stdout)  # the closing summary (tests/test_cli.py)
    return run_dir
