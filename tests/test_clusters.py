"""Sweeps and clusters (issue 14 §5): one GPU per local sweep job, SLURM sizing and requeue, resume=auto.

No GPU here: torch.cuda's device count and set_device are faked.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from dpgen.core.devices import PEAK_GB, MemoryClaims, SweepGPUs, claim_gpu, oom_message
from dpgen.core.resume import resume_dir
from dpgen.errors import DpgenError

METHODS = ("dpgan", "gswgan", "dpac", "efsgd", "gpate", "dpaf", "feta", "dpdm")


@pytest.fixture
def gpus(monkeypatch):
    """Pretend ``n`` CUDA devices are visible; returns the list of set_device calls."""
    calls: list[int] = []

    def fake(n: int, gb: float = 80.0) -> list[int]:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=gb * 1e9))
        monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls.append(int(i)))
        return calls

    return fake


def _job(num: int, device: str = "auto", mode: str = "MULTIRUN", method: str = "dpgan", profile: str = "quick"):
    return OmegaConf.create({"device": device, "method": {"name": method}, "profile": {"name": profile},
                             "hydra": {"mode": mode, "job": {"num": num}}})


def test_sweep_jobs_get_one_gpu_each(gpus, tmp_path):
    calls = gpus(4)
    jobs = [SweepGPUs(str(tmp_path)) for _ in range(4)]  # one callback copy per worker, as joblib pickles it
    for num, cb in enumerate(jobs):
        cb.on_job_start(_job(num))
    assert calls == [0, 1, 2, 3]
    jobs[2].on_job_end(_job(2))  # job 2 finishes first; job 4 takes its free GPU, not busy GPU 0 (4 % 4)
    nxt = SweepGPUs(str(tmp_path))
    nxt.on_job_start(_job(4))
    assert calls[-1] == 2


def test_more_jobs_than_gpus_share_round_robin(gpus, tmp_path):
    calls = gpus(2)
    running = [SweepGPUs(str(tmp_path)) for _ in range(5)]
    for num, cb in enumerate(running):
        cb.on_job_start(_job(num))  # none ends: both GPUs stay claimed, later jobs share
    assert calls == [0, 1, 0, 1, 0]
    assert [cb._claim.exclusive for cb in running] == [True, True, False, False, False]


def test_named_devices_single_runs_and_one_gpu_are_left_alone(gpus, tmp_path):
    calls = gpus(4)
    for cfg in (_job(1, "cpu"), _job(1, "cuda:3"), _job(1, mode="RUN"), OmegaConf.create({"device": "auto"})):
        SweepGPUs(str(tmp_path)).on_job_start(cfg)
    assert calls == []
    calls = gpus(1)
    SweepGPUs(str(tmp_path)).on_job_start(_job(3))
    calls_none = gpus(0)
    SweepGPUs(str(tmp_path)).on_job_start(_job(3))
    assert calls == calls_none == []


def test_a_claim_is_exclusive_until_released(tmp_path):
    a = claim_gpu(0, 2, tmp_path)
    b = claim_gpu(0, 2, tmp_path)
    assert (a.index, a.exclusive, b.index, b.exclusive) == (0, True, 1, True)
    c = claim_gpu(0, 2, tmp_path)
    assert (c.index, c.exclusive) == (0, False)
    a.release()
    assert claim_gpu(1, 2, tmp_path).index == 0  # job 1 would start at GPU 1 (held by b): takes the freed 0


def test_jobs_wait_for_memory_instead_of_dying(gpus, tmp_path):
    """Paper gswgan jobs (54 GB each) on one 80 GB card: the second waits until the first ends, then runs."""
    gpus(1, gb=80.0)
    first = SweepGPUs(str(tmp_path))
    first.on_job_start(_job(0, method="gswgan", profile="paper"))
    slept: list[float] = []

    def sleep(s: float) -> None:  # while job 1 waits, job 0 ends
        slept.append(s)
        first.on_job_end(_job(0))

    second = SweepGPUs(str(tmp_path), poll_s=7.0, sleep=sleep)
    second.on_job_start(_job(1, method="gswgan", profile="paper"))
    assert slept == [7.0] and second._claim.index == 0
    assert MemoryClaims(tmp_path).used() == {0: PEAK_GB["gswgan"]}


def test_jobs_share_a_gpu_only_where_their_memory_fits(gpus, tmp_path):
    calls = gpus(2, gb=80.0)
    jobs = [SweepGPUs(str(tmp_path), sleep=lambda s: pytest.fail("no job should wait")) for _ in range(5)]
    for num, (cb, method) in enumerate(zip(jobs, ("feta", "gpate", "gpate", "dpgan", "gpate"))):
        cb.on_job_start(_job(num, method=method, profile="paper"))
    # feta (44 GB) and gpate (28) get a GPU each; then no GPU is free: the second gpate shares GPU 0 (2 % 2; 72 GB),
    # dpgan GPU 1 (29.5), and the third gpate does not fit GPU 0 (100 > 80), so it goes to GPU 1 (57.5)
    assert calls == [0, 1, 0, 1, 1]
    assert MemoryClaims(tmp_path).used() == {0: 72.0, 1: 57.5}


def test_a_job_larger_than_any_gpu_and_dead_claims(gpus, tmp_path):
    from dpgen.errors import DpgenError

    gpus(1, gb=40.0)
    with pytest.raises(DpgenError, match="expects 54 GB of GPU memory; the largest GPU here has 40 GB"):
        SweepGPUs(str(tmp_path)).on_job_start(_job(0, method="dpac", profile="paper"))
    stale = MemoryClaims(tmp_path)
    assert stale.admit("999999999:0", 39.0, [40.0], 0, None) == 0
    # a claim whose process died no longer counts (pid 999999999 does not exist)
    assert MemoryClaims(tmp_path).admit("1:1", 30.0, [40.0], 0, None) == 0


def test_an_out_of_memory_error_is_one_line_naming_the_memory_wanted(tmp_path):
    import os
    import subprocess
    import sys

    from conftest import ROOT
    from inprocess import one_error

    msg = oom_message(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has ..."))
    assert "the run wanted 3.50 GiB more" in msg and "\n" not in msg
    # scripts/train.py in a subprocess whose training runs out of memory (sitecustomize swaps run_training)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import torch\nimport dpgen.core.pipeline as p\n"
        "def oom(cfg, run_dir):\n"
        "    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has 79 GiB')\n"
        "p.run_training = oom\n")
    env = {**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{ROOT}", "DPGEN_DATA": str(tmp_path / "data")}
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), f"hydra.run.dir={tmp_path / 'run'}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    line = one_error(res.returncode, res.stderr)
    assert "out of memory" in line and "wanted 3.50 GiB" in line


def _compose(*overrides: str):
    from hydra import compose, initialize_config_dir

    from dpgen.core.config import register_resolvers
    from dpgen.core.methods import CONFIG_DIR

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


def test_local_launcher_enables_the_gpu_callback():
    from hydra.utils import instantiate

    cfg = _compose("hydra/launcher=local", "hydra.launcher.n_jobs=4")
    assert cfg.hydra.launcher.n_jobs == 4 and cfg.hydra.launcher._target_.endswith("JoblibLauncher")
    assert isinstance(instantiate(cfg.hydra.callbacks.sweep_gpus), SweepGPUs)


@pytest.mark.parametrize("method", METHODS)
def test_slurm_requeues_and_sizes_each_method(method):
    launcher = {}
    for dataset in ("fmnist", "celeba32", "celeba64"):
        for profile in ("paper", "quick"):
            cfg = _compose("hydra/launcher=slurm", f"method={method}", f"dataset={dataset}", f"profile={profile}")
            launcher[dataset, profile] = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    for conf in launcher.values():
        assert conf["_target_"].endswith("SlurmLauncher") and conf["max_num_timeout"] >= 1
        assert conf["additional_parameters"]["requeue"] is True and conf["gpus_per_node"] == 1
        assert isinstance(conf["timeout_min"], int) and isinstance(conf["mem_gb"], int) and conf["mem_gb"] >= 32
    assert launcher["fmnist", "quick"]["timeout_min"] == 120
    paper_hours = launcher["fmnist", "paper"]["timeout_min"] / 60
    attempts = 1 + launcher["fmnist", "paper"]["max_num_timeout"]
    # the slowest run measured on one GPU (docs/data/gpu.yaml): the GS-WGAN family's discriminator pre-training is
    # not checkpointed, so one attempt must hold it; feta continues from its checkpoints over the attempts
    measured = yaml.safe_load((Path(__file__).resolve().parents[1] / "docs/data/gpu.yaml").read_text())
    slowest = measured["slowest_full_run_h"]
    need_one_attempt = {"gswgan": slowest["gswgan_pretraining"], "dpac": slowest["gswgan_pretraining"],
                        "efsgd": slowest["gswgan_pretraining"], "dpgan": slowest["dpgan"], "gpate": slowest["gpate"]}
    if method in need_one_attempt:
        assert paper_hours >= need_one_attempt[method]
    if method in ("feta", "dpdm"):
        assert paper_hours * attempts >= slowest["feta"]
    if method == "gpate":
        assert launcher["celeba64", "paper"]["mem_gb"] > 32  # the teacher ensemble is built on the host


def test_resume_auto_starts_fresh_then_continues_its_own_checkpoint(tmp_path):
    run = tmp_path / "sweep" / "job3"
    assert resume_dir("auto", run) is None  # first attempt: nothing to continue
    (run / "checkpoints").mkdir(parents=True)
    assert resume_dir("auto", run) is None  # an empty checkpoints/ folder is not a checkpoint
    (run / "checkpoints" / "last.pt").write_bytes(b"x")
    assert resume_dir("auto", run) == run  # requeued attempt: continue
    assert resume_dir(None, run) is None and resume_dir("null", run) is None
    assert resume_dir(str(run), tmp_path / "elsewhere") == run  # resume=<dir> names its own directory
    with pytest.raises(DpgenError, match=r"^resume=.*no checkpoint at"):
        resume_dir(str(tmp_path / "missing"), run)
