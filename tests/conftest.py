"""Shared helpers: run the real CLI scripts in a subprocess, in a scratch working directory."""
from __future__ import annotations

import hashlib
import os
import random
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# No test downloads anything (dpgen.eval.inception's eval.inception_download); CLI subprocesses inherit it.
os.environ["DPGEN_OFFLINE"] = "1"


def _share_the_cores() -> None:
    """Under pytest-xdist (``make test``: ``-n auto``) workers x torch threads must not exceed the cores: each worker
    and every subprocess it starts gets cores // workers threads (OMP_NUM_THREADS is inherited)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 0:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
        import torch

        torch.set_num_threads(threads)


_share_the_cores()

#: The longest work units (an xdist ``loadscope`` unit is a module, or a class inside one), longest first. ``make test``
#: (``--no-loadscope-reorder``) hands units to the workers in collection order, so these start at once and the
#: many short modules fill in around them; a long unit handed out last would finish alone on one core.
#: Each worker starts with two units (1st and 3rd to one, 2nd and 4th to the other): the 2-process units are
#: 1st and 3rd, so the other worker is not running processes of its own meanwhile. Measured one worker at a time
#: (``pytest -p no:xdist --durations=0``); unlisted units keep their file order.
LONGEST_FIRST = (
    "tests/test_multi_process.py::TestDpdmRuns",
    "tests/test_eval_toy.py",
    "tests/test_multi_process.py::TestGpateRuns",
    "tests/test_cli.py",  # builds the session's trained_run early, before the other modules that read it
    "tests/test_multi_process.py",
    "tests/test_docs.py",
    "tests/test_efsgd_cli.py",
    "tests/test_data_folder.py",  # two quick-profile runs on the image-folder fixture
    "tests/test_eval_readings.py",
    "tests/test_secret_randomness.py",
    "tests/test_gpate_cli.py",
    "tests/test_experiments.py",
    "tests/test_notebooks.py",
    "tests/test_dpac_isolation.py",
    "tests/test_dpaf_cli.py",
    "tests/test_feta_model.py",
)


def _unit_rank(nodeid: str) -> int:
    for i, unit in enumerate(LONGEST_FIRST):
        if nodeid == unit or nodeid.startswith(unit + "::"):
            return i
    return len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items) -> None:
    """Under pytest-xdist only: the units of ``LONGEST_FIRST`` first (a stable sort: a unit's tests stay in order).
    A plain ``pytest`` run keeps the file order."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: _unit_rank(item.nodeid))


def pytest_addoption(parser) -> None:
    parser.addoption("--unmarked-limit", type=float, default=30.0, metavar="SECONDS",
                     help="list the tests not marked slow that took longer than this (setup + call + teardown)")
    parser.addoption("--entropy-seed", type=int, default=None, metavar="N",
                     help="replay a run's secret randomness in this process's tests (the seed the header printed)")


#: the session's entropy seed, chosen by the controller and inherited by the xdist workers (test processes only:
#: dpgen itself never reads it, so a CLI subprocess still seeds its secret streams from OS entropy)
ENTROPY_ENV = "DPGEN_TEST_ENTROPY_SEED"


def pytest_configure(config) -> None:
    seed = config.getoption("entropy_seed")
    if seed is None and ENTROPY_ENV not in os.environ:
        seed = secrets.randbits(32)
    if seed is not None:
        os.environ[ENTROPY_ENV] = str(seed)


def pytest_report_header(config) -> str:
    return f"secret randomness of in-process tests: --entropy-seed {os.environ[ENTROPY_ENV]} replays it"


class ReplayableEntropy:
    """Stands in for the ``secrets`` module where dpgen seeds its secret streams (``randbits``, ``token_hex``), in
    this process only: every test still draws fresh secret randomness each session, and a failure that depends on
    the draw is replayed with the ``--entropy-seed`` the header printed. Seeded per test (session seed and node
    id), so a test's draws do not depend on which tests its xdist worker ran before it."""

    def __init__(self, seed: str) -> None:
        self._rng = random.Random(hashlib.blake2b(seed.encode(), digest_size=16).digest())

    def randbits(self, k: int) -> int:
        return self._rng.getrandbits(k)

    def token_hex(self, nbytes: int = 32) -> str:
        return self._rng.getrandbits(8 * nbytes).to_bytes(nbytes, "big").hex()


@pytest.fixture(autouse=True)
def replayable_entropy(request, monkeypatch) -> None:
    """Every in-process test's secret streams come from :class:`ReplayableEntropy` (a test that patches
    ``secrets`` itself patches over this)."""
    from dpgen.core import run, streams
    from dpgen.privacy import randomness

    entropy = ReplayableEntropy(f"{os.environ[ENTROPY_ENV]}:{request.node.nodeid}")
    for module in (randomness, streams, run):
        monkeypatch.setattr(module, "secrets", entropy)


_seconds: dict[str, float] = {}
_marked_slow: set[str] = set()


def pytest_runtest_logreport(report) -> None:
    # Under xdist the controller receives every worker's reports here, so the summary covers the whole run.
    _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration
    if "slow" in report.keywords:
        _marked_slow.add(report.nodeid)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """A test over ``--unmarked-limit`` that is not ``@pytest.mark.slow`` is reported, not failed: a timing under
    load would make the suite flaky. ``make test`` must not list any on an idle machine. After a failure, the
    entropy seed that replays the in-process tests' secret draws."""
    if exitstatus not in (0, 5):  # a failure may depend on the secret draws: say how to replay them (-q hides the header)
        terminalreporter.write_line(pytest_report_header(config))
    limit = config.getoption("unmarked_limit")
    over = sorted(((s, n) for n, s in _seconds.items() if s > limit and n not in _marked_slow), reverse=True)
    if over:
        terminalreporter.write_sep("=", f"{len(over)} unmarked test(s) over {limit:g} s: make faster or mark slow "
                                   "(covered by a faster test)", yellow=True)
        for s, n in over:
            terminalreporter.write_line(f"{s:8.2f}s {n}")

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


def in_memory_run(run_dir: Path, ledger, device=None, **kwargs):
    """A Run for calling a method's train() directly: on ``device`` (default the CPU), seed 0, no progress bar or
    tensorboard (``kwargs``: e.g. ``stop_after``, ``resume``, ``checkpoint_every``)."""
    import torch

    from dpgen.core.run import Run

    return Run(run_dir, ledger, torch.device("cpu") if device is None else device, 0, {}, progress=False,
               tensorboard=False, **kwargs)


@pytest.fixture
def one_torch_thread():
    """One intra-op thread: two OpenMP threads contending with other jobs on 2 cores are several times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def shared_dir(tmp_path_factory, name: str, build) -> Path:
    """A directory built once per test session and shared by every pytest-xdist worker (``build(path)`` fills it,
    under a file lock; the workers' temporary roots share one parent). For fixtures whose tests only READ what was
    built: a test that changes it works on a copy."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / f"shared-{name}"
    with FileLock(str(root / f"shared-{name}.lock")):
        if not (path / ".built").exists():
            import shutil

            shutil.rmtree(path, ignore_errors=True)
            path.mkdir()
            build(path)
            (path / ".built").touch()
    return path


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> Path:
    """One finished tiny default run (digits, dpgen), built once for the whole session (all workers) and shared by
    the output-contract tests, which only read it (``stdout.txt`` beside it: what train.py printed)."""
    def build(cwd: Path) -> None:
        res = run_script("train.py", *TINY, f"hydra.run.dir={cwd / 'run'}", cwd=cwd)
        assert res.returncode == 0, res.stderr[-3000:]
        (cwd / "stdout.txt").write_text(res.stdout)

    return shared_dir(tmp_path_factory, "trained_run", build) / "run"
