"""Issue 25: one run on several tasks of one job started by Hydra's submitit launcher
(``hydra.launcher.tasks_per_node=W``), tested on a CPU with ``hydra/launcher=submitit_local`` (gloo, 2 tasks).

* :func:`dpgen.core.dist.adopt_job_env` turns a task's submitit variables (SLURM's, or the local controller's
  ``SUBMITIT_LOCAL_*``) into torch.distributed's: one port per job, the same on all its tasks; torchrun's variables
  win; a single-task job is left alone;
* a ``-m hydra/launcher=submitit_local hydra.launcher.tasks_per_node=2`` gpate run ends OK, rank 0 alone writes the
  run directory (Hydra's ``.hydra/`` and ``train.log`` included) and the released generator equals a 1-process
  run's bit for bit.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

#: the variables adopt_job_env reads or sets: cleared (and restored afterwards) by every test here
_JOB_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SUBMITIT_EXECUTOR",
             "SUBMITIT_LOCAL_NTASKS", "SUBMITIT_LOCAL_GLOBALID", "SUBMITIT_LOCAL_LOCALID", "SUBMITIT_LOCAL_JOB_ID",
             "SUBMITIT_LOCAL_NODEID", "SUBMITIT_LOCAL_JOB_NUM_NODES", "SLURM_JOB_ID", "SLURM_NTASKS",
             "SLURM_STEP_NUM_TASKS", "SLURM_JOB_NUM_NODES", "SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURM_PROCID",
             "SLURM_LOCALID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID")


@pytest.fixture
def job_env(monkeypatch):
    """A clean slate: none of the job variables set; what a test (or adopt_job_env) sets is undone afterwards."""
    for key in _JOB_VARS:
        monkeypatch.setenv(key, "")  # recorded, so that monkeypatch removes what adopt_job_env sets
        monkeypatch.delenv(key)

    def task(**values: str) -> dict[str, str]:
        for key in _JOB_VARS:
            os.environ.pop(key, None)
        os.environ.update(values)
        from dpgen.core.dist import adopt_job_env

        adopt_job_env()
        return {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
                if k in os.environ}

    return task


def _local(rank: int, job: str = "31337", ntasks: int = 2) -> dict[str, str]:
    """What submitit's local controller (pid ``job``) gives task ``rank`` (dpgen.core.dist's reading of it)."""
    return dict(SUBMITIT_EXECUTOR="local", SUBMITIT_LOCAL_NTASKS=str(ntasks), SUBMITIT_LOCAL_GLOBALID=str(rank),
                SUBMITIT_LOCAL_LOCALID=str(rank), SUBMITIT_LOCAL_JOB_ID=job, SUBMITIT_LOCAL_NODEID="0",
                SUBMITIT_LOCAL_JOB_NUM_NODES="1")


def test_the_tasks_of_a_local_submitit_job_form_one_process_group(job_env):
    from dpgen.core.dist import launch_rank, launched_multi_process

    r0, r1 = job_env(**_local(0)), job_env(**_local(1))
    assert r1 == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": str(20000 + 31337 % 40000)}
    assert r0 == {**r1, "RANK": "0", "LOCAL_RANK": "0"}, "every task of one job meets at the same address and port"
    assert launched_multi_process() and launch_rank() == 1
    assert job_env(**_local(0, job="31338"))["MASTER_PORT"] != r0["MASTER_PORT"], "another job: another port"
    assert job_env(**_local(0, ntasks=1)) == {}, "a single-task job stays one process"
    assert not launched_multi_process() and launch_rank() == 0


def test_the_tasks_of_a_slurm_job_form_one_process_group(job_env):
    """``srun`` tasks, e.g. of ``hydra/launcher=slurm hydra.launcher.nodes=2 hydra.launcher.tasks_per_node=4``."""
    slurm = dict(SUBMITIT_EXECUTOR="slurm", SLURM_JOB_ID="777", SLURM_NTASKS="8", SLURM_STEP_NUM_TASKS="8",
                 SLURM_JOB_NUM_NODES="2", SLURM_NODEID="1", SLURM_JOB_NODELIST="gpu[07-08]", SLURM_PROCID="5",
                 SLURM_LOCALID="1")
    assert job_env(**slurm) == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "gpu07",
                                "MASTER_PORT": str(20000 + 777)}
    assert job_env(**{**slurm, "SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}) == {}
    # the sbatch batch step (no srun): one task even in an allocation of several
    assert job_env(**{k: v for k, v in slurm.items() if k not in ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID")}) == {}


def test_torchrun_and_job_script_variables_win(job_env):
    torchrun = dict(WORLD_SIZE="4", RANK="3", LOCAL_RANK="3", MASTER_ADDR="10.0.0.1", MASTER_PORT="29500")
    assert job_env(**_local(1), **torchrun) == torchrun
    assert job_env(**_local(1), MASTER_PORT="23456")["MASTER_PORT"] == "23456"


def test_each_task_finds_its_gpu_whether_or_not_the_scheduler_binds_one_per_task():
    from dpgen.core.dist import rank_gpu
    from dpgen.errors import DpgenError

    assert [rank_gpu(r, 4) for r in range(4)] == [0, 1, 2, 3], "all of a node's GPUs visible: rank r takes cuda:r"
    assert [rank_gpu(r, 1) for r in range(4)] == [0, 0, 0, 0], "one GPU bound per task: it is that task's cuda:0"
    with pytest.raises(DpgenError, match="^local rank 2 has no GPU \\(2 visible\\)"):
        rank_gpu(2, 2)


def test_only_rank_zero_writes_the_hydra_config(job_env):
    """Hydra saves ``.hydra/`` in every task of a job before the task function runs: ranks > 0 get no directory."""
    from dpgen.core.config import _hydra_subdir

    job_env(**_local(1))
    assert _hydra_subdir(None, ".") is None and _hydra_subdir("auto", ".") is None
    job_env(**_local(0))
    assert _hydra_subdir(None, ".") == ".hydra"


# ---- end to end: a gpate run on 2 tasks of one submitit_local job ------------------------------------------------
TINY_GPATE = ["method=gpate", "dataset=digits", "eps=10", "gpate.teachers=5", "gpate.iters=3", "gpate.batch_size=4",
              "gpate.proj_dim=3", "gpate.teacher_warmup=1", "gpate.gf_dim=4", "gpate.gfc_dim=16", "gpate.df_dim=4",
              "gpate.dfc_dim=8", "gpate.chunk=2", "privacy.noise_seed=3", "progress=false", "tensorboard=false",
              "threads=1", "checkpoint_every=1", "eval.num_samples=100", "eval.epochs=1", "eval.classifiers=[mlp]",
              "eval.fid=false", "eval.inception_score=false", "eval.r2g=false", "eval.real_baseline=false",
              "eval.cnn_fid=false"]


def _train(cwd, *args: str, multirun: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in _JOB_VARS and not k.startswith(("SLURM_", "SUBMITIT_"))}
    env.update(OMP_NUM_THREADS="1", DPGEN_DATA=str(cwd / "data"), PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="1")
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), *(["-m"] if multirun else []), *TINY_GPATE, *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _files(run_dir) -> list[str]:
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())


@pytest.mark.slow
def test_two_submitit_tasks_run_one_job_that_releases_what_one_process_does(tmp_path):
    one = _train(tmp_path, f"hydra.run.dir={tmp_path / 'one'}")
    assert one.returncode == 0, one.stderr[-3000:]
    sweep = tmp_path / "sweep"
    two = _train(tmp_path, "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2",
                 f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=two", multirun=True)
    assert two.returncode == 0, two.stdout[-2000:] + two.stderr[-3000:]

    # rank 0 alone wrote the run directory: the files of a 1-process run, each once
    run = sweep / "two"
    assert _files(run) == _files(tmp_path / "one")
    assert sorted(p.name for p in sweep.iterdir()) == [".submitit", "multirun.yaml", "two"]
    assert sorted(p.name for p in (run / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    log = (run / "train.log").read_text()
    assert "2 processes" in log and "this one holds 0-1" in log and "holds 2-4" not in log, log
    lines = [line for line in log.splitlines() if line.strip()]
    assert len(lines) == len(set(lines)), "no line twice (rank 1 logs to its own stdout)"
    (job,) = (sweep / ".submitit").glob("[0-9]*")  # the controller's pid names the job
    rank1 = (job / f"{job.name}_1_log.out").read_text()
    assert "this one holds 2-4" in rank1 and "files: " not in rank1, rank1[-2000:]
    assert "files: " in (job / f"{job.name}_0_log.out").read_text()

    # the same ledger and, bit for bit, the same generator as one process
    from dpgen.core.generator import load_generator

    pa, pb = (json.loads((d / "privacy.json").read_text()) for d in (tmp_path / "one", run))
    assert pa["entries"] == pb["entries"] and pa["epsilon"] == pb["epsilon"]
    a, b = (load_generator(d / "generator.pt").state_dict() for d in (tmp_path / "one", run))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
