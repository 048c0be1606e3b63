"""Issue 25: feta/dpdm (DP-SGD) and gpate (sharded teachers) on several processes with torchrun, tested on a CPU
(gloo, 2 processes).

* a 2-process dpdm run and a 1-process run with the same config (same ``privacy.noise_seed``) record the same
  ledger and ε and release the same generator up to float summation order;
* the noise is added once: on a zero-gradient toy the ranks' noisy gradients are identical and their std is
  σC/B (not √W·σC/B);
* only rank 0 writes (nothing outside its run directory, no scratch directory left);
* a 2-process run stopped by ``debug.stop_after`` and resumed ends bit-identical to the uninterrupted 2-process run;
* a method that trains in one process, or the opacus backend, is refused in one line before anything is written;
* gpate: the teachers split over the ranks vote, after the all-reduce, exactly as one process's teachers do, rank 0
  gathers them into a checkpoint that does not depend on the number of ranks, and the released generator is
  bit-identical to a 1-process run's;
* gswgan/dpac/efsgd: the ranks pre-train their blocks of discriminators and exchange them, ending with the ensemble
  one process pre-trains, bit for bit; a 2-process gswgan run releases a 1-process run's generator.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp

from conftest import ROOT
from inprocess import call, files_in, one_error

#: the largest difference allowed between 1- and 2-process weights: the sums of clipped gradients are added
#: in another order (measured: 7.5e-9)
WEIGHT_TOL = 1e-6

TINY_DPDM = ["method=dpdm", "dataset=digits", "eps=10", "feta.iters=4", "feta.batch_size=64", "feta.multiplicity=2",
             "feta.micro_batch=16", "feta.unet.nf=4", "feta.sampler.steps=2", "privacy.noise_seed=3", "progress=false",
             "tensorboard=false", "threads=1", "checkpoint_every=1", "eval.num_samples=100", "eval.epochs=1",
             "eval.classifiers=[mlp]", "eval.fid=false", "eval.inception_score=false", "eval.r2g=false",
             "eval.real_baseline=false", "eval.cnn_fid=false"]


def _start(cwd, run_dir, *extra: str, procs: int = 1, base: list[str] = TINY_DPDM) -> subprocess.Popen:
    launcher = [sys.executable] if procs == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                     f"--nproc_per_node={procs}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DPGEN_DATA": str(cwd / "data"), "TMPDIR": str(cwd / "tmp"),
           "PYTHONUNBUFFERED": "1"}
    (cwd / "tmp").mkdir(exist_ok=True)
    args = [*launcher, str(ROOT / "scripts" / "train.py"), *base, *extra, f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _train(cwd, run_dir, *extra: str, procs: int = 1, base: list[str] = TINY_DPDM) -> subprocess.CompletedProcess:
    return _finish(_start(cwd, run_dir, *extra, procs=procs, base=base))


def _train_side_by_side(cwd, base: list[str] = TINY_DPDM) -> tuple[subprocess.CompletedProcess, ...]:
    """The 1-process run (``cwd/one``) and the 2-process run (``cwd/two``) at the same time: they share nothing but
    the read-only data, and the interpreters' start-up (most of a tiny run) overlaps when a core is free."""
    one, two = _start(cwd, cwd / "one", base=base), _start(cwd, cwd / "two", procs=2, base=base)
    return _finish(one), _finish(two)


def _weights(run_dir) -> dict[str, torch.Tensor]:
    from dpgen.core.generator import load_generator

    return load_generator(run_dir / "generator.pt").state_dict()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("mp")
    one, two = _train_side_by_side(cwd)
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.returncode == 0, two.stderr[-3000:]
    return cwd


# The classes are pytest-xdist work units (``--dist loadscope``): each runs on one worker with the module-scoped
# runs it reads, and the units spread over the workers (tests/conftest.py starts the longest first).
class TestDpdmRuns:
    """dpdm on 1 and 2 processes (``runs``): one xdist work unit, the module's longest."""

    def test_two_processes_release_what_one_process_does(self, runs):
        import json

        one, two = (json.loads((runs / d / "privacy.json").read_text()) for d in ("one", "two"))
        assert one["entries"] == two["entries"] and one["epsilon"] == two["epsilon"]
        a, b = _weights(runs / "one"), _weights(runs / "two")
        assert a.keys() == b.keys()
        diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
        assert 0 <= diff <= WEIGHT_TOL, diff
        assert "2 processes" in (runs / "two" / "train.log").read_text()

    def test_only_rank_zero_writes(self, runs):
        assert sorted(p.name for p in (runs / "two").iterdir()) == sorted(p.name for p in (runs / "one").iterdir())
        assert sorted(p.name for p in runs.iterdir()) == ["one", "tmp", "two"], "nothing outside the run directories"
        assert not list((runs / "tmp").glob("dpgen-rank*")), "the other rank's scratch directory is removed"

    def test_a_two_process_run_resumes_bit_exactly(self, runs):
        cut = runs / "cut"
        first = _train(runs, cut, "debug.stop_after=2", procs=2)
        assert first.returncode != 0 and (cut / "checkpoints" / "last.pt").is_file(), first.stderr[-2000:]
        assert not list((runs / "tmp").glob("dpgen-rank*")), "an interrupted rank removes its scratch directory too"
        second = _train(runs, cut, f"resume={cut}", procs=2)
        assert second.returncode == 0, second.stderr[-3000:]
        a, b = _weights(runs / "two"), _weights(cut)
        for k in a:
            assert torch.equal(a[k], b[k]), k

    @pytest.mark.slow  # SLURM's variables to a torchrun world: tests/test_submitit_tasks.py (job_env), in seconds
    def test_srun_tasks_join_like_torchrun_ranks(self, runs):
        """``srun -n 2 python scripts/train.py ...`` (SLURM's variables, no torchrun): the two tasks form one run that
        releases the 2-process torchrun run's generator (same split, same order of sums)."""
        env = {**os.environ, "OMP_NUM_THREADS": "1", "DPGEN_DATA": str(runs / "data"), "TMPDIR": str(runs / "tmp"),
               "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_JOB_NUM_NODES": "1",
               "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "127.0.0.1", "MASTER_PORT": str(_free_port())}
        for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR"):
            env.pop(key, None)
        cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), *TINY_DPDM, f"hydra.run.dir={runs / 'srun'}"]
        procs = [subprocess.Popen(cmd, cwd=runs, env={**env, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
        outs = [p.communicate(timeout=600) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs[0][1][-3000:] + outs[1][1][-3000:]
        a, b = _weights(runs / "two"), _weights(runs / "srun")
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert "2 processes" in (runs / "srun" / "train.log").read_text()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_gloo(rank: int, world: int, out) -> None:
    """Join a gloo world whose ranks meet in a file under ``out`` (one per world size): no TCP port to pick, so no
    other test's process can take it between the pick and the rendezvous (a rank then aborted in make test)."""
    import torch.distributed as td

    td.init_process_group("gloo", init_method=(out / f"gloo-world{world}.store").as_uri(), rank=rank,
                          world_size=world)


def _world_of_one(fn, out) -> None:
    """``fn`` as the only rank of a 1-process gloo world, in this process: the reference a spawned 2-process world
    must equal, without the seconds a spawned interpreter spends importing torch. Run under ``one_torch_thread``,
    like the spawned ranks."""
    with torch.random.fork_rng(devices=[]):  # fn seeds the global generator: this process's stays as it was
        fn(0, 1, out)


def _noise_once(rank: int, world: int, out) -> None:
    """One DP-SGD noise step of feta on a zero-gradient toy, on ``rank`` of ``world`` gloo processes."""
    import torch.distributed as td

    from dpgen.core.dist import Dist
    from dpgen.core.run import Run
    from dpgen.feta.dpsgd import set_noisy_grads
    from dpgen.privacy import PrivacyLedger

    _init_gloo(rank, world, out)
    try:
        dist = Dist(rank=rank, world=world)
        run = Run(out / f"r{rank}", PrivacyLedger(delta=1e-5), torch.device("cpu"), 0, {}, tensorboard=False,
                  progress=False, dist=dist)
        p = torch.nn.Parameter(torch.zeros(200, 100))
        sums = [torch.zeros(200, 100)]  # every record's clipped gradient is 0: the release is the noise alone
        dist.all_reduce_(sums)
        set_noisy_grads([p], sums, sigma=2.0, clip=1.5, expected_batch=30.0, generator=run.secret_rng("noise"))
        torch.save(p.grad, out / f"grad{rank}.pt")
    finally:
        td.destroy_process_group()


def test_the_noise_is_added_once(tmp_path):
    mp.spawn(_noise_once, args=(2, tmp_path), nprocs=2, join=True)
    g0, g1 = torch.load(tmp_path / "grad0.pt"), torch.load(tmp_path / "grad1.pt")
    assert torch.equal(g0, g1), "every rank adds the same draw (a secret stream shared over the process group)"
    assert float((g0 * 30.0).std()) == pytest.approx(2.0 * 1.5, rel=0.03)  # σC, not √2·σC


def test_single_process_methods_and_the_opacus_backend_are_refused_under_torchrun(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPGEN_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    code, _, err = call(capsys, "train", "method=dpgan")
    assert "method=dpgan trains in one process" in one_error(code, err)
    code, _, err = call(capsys, "train", "method=dpdm", "feta.grad_backend=opacus")
    assert "feta.grad_backend='opacus' is invalid; expected ghost or torch_func under torchrun" in one_error(code, err)
    assert files_in(tmp_path) == {}


def test_a_job_of_several_tasks_is_refused_before_submitting_for_a_single_process_method(tmp_path, capsys, monkeypatch):
    """hydra.launcher.tasks_per_node=W: the refusal comes at submission, not inside a job that queued for hours."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPGEN_DATA", str(tmp_path / "data"))
    code, _, err = call(capsys, "train", "-m", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2",
                        "method=dpgan", "dataset=digits")
    assert "method=dpgan trains in one process" in one_error(code, err)
    assert files_in(tmp_path) == {}
    code, _, err = call(capsys, "train", "-m", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=1",
                        "method=dpgan", "dataset=digits")
    assert code == 0, err


# ---- gpate: the teachers sharded over the ranks ------------------------------------------------------------------
TINY_GPATE = ["method=gpate", "dataset=digits", "eps=10", "gpate.teachers=5", "gpate.iters=3", "gpate.batch_size=4",
              "gpate.proj_dim=3", "gpate.teacher_warmup=1", "gpate.gf_dim=4", "gpate.gfc_dim=16", "gpate.df_dim=4",
              "gpate.dfc_dim=8", "gpate.chunk=2", *TINY_DPDM[TINY_DPDM.index("privacy.noise_seed=3"):]]


def _sharded_votes(rank: int, world: int, out) -> None:
    """A 5-teacher ensemble on ``rank`` of ``world`` gloo processes: one training step, its votes, its state."""
    import torch.distributed as td

    from dpgen.core.dist import Dist
    from dpgen.gpate.aggregate import projection_matrices, vote_histogram
    from dpgen.gpate.ensemble import TeacherEnsemble
    from dpgen.gpate.nets import TeacherCNN

    torch.set_num_threads(1)  # as the in-process world of one (``one_torch_thread``): the same kernels, bit for bit
    _init_gloo(rank, world, out)
    try:
        torch.manual_seed(0)
        n, m = 5, 4
        xr, yr = torch.rand(n, m, 1, 8, 8) * 2 - 1, torch.randint(0, 10, (n, m))
        xf, yf = torch.rand(m, 1, 8, 8) * 2 - 1, torch.randint(0, 10, (m,))
        x, y = torch.rand(m, 1, 8, 8) * 2 - 1, torch.randint(0, 10, (m,))
        proj = projection_matrices(m, 64, 3, torch.Generator().manual_seed(1), torch.device("cpu"))
        dist = Dist(rank=rank, world=world)
        make = lambda: TeacherCNN(10, [1, 8, 8], df_dim=4, dfc_dim=8, norm="batch")  # noqa: E731
        ens = TeacherEnsemble(make, n, torch.device("cpu"), chunk=2, seed=7, dist=dist)
        ens.train_step(TeacherEnsemble.fixed_batch(xr, yr, torch.ones(n, m), xf, yf))
        hist = vote_histogram(ens.input_grads_chunks(x, y), proj, 0.01, 5, reduce=dist.all_reduce_)
        state = ens.state_dict()
        if dist.main:
            torch.save({"hist": hist, "state": state, "members": list(ens.members)}, out / f"world{world}.pt")
    finally:
        td.destroy_process_group()


def test_sharded_gpate_votes_and_teachers_equal_the_single_process_ones(tmp_path, one_torch_thread):
    """5 teachers over 2 ranks (2 + 3): after a training step the gathered teachers and the all-reduced vote
    histogram equal one process's bit for bit (teacher i's init, batch and chunk do not depend on the split)."""
    _world_of_one(_sharded_votes, tmp_path)
    mp.spawn(_sharded_votes, args=(2, tmp_path), nprocs=2, join=True)
    one, two = torch.load(tmp_path / "world1.pt"), torch.load(tmp_path / "world2.pt")
    assert two["members"] == [0, 1] and one["members"] == [0, 1, 2, 3, 4]  # rank 0's shard; rank 1 holds 2-4
    assert torch.equal(one["hist"], two["hist"]) and int(one["hist"].sum()) == 5 * 4 * 3  # one vote per teacher
    for name in ("params", "m", "v"):
        for k, v in one["state"][name].items():
            assert torch.equal(v, two["state"][name][k]), (name, k)


@pytest.fixture(scope="module")
def gpate_runs(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("mp_gpate")
    # chunks of 2 teachers: (0, 1) (2, 3) (4) in one process and on the ranks (0-1 | 2-4), so the same kernels run
    one, two = _train_side_by_side(cwd, base=TINY_GPATE)
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.returncode == 0, two.stderr[-3000:]
    return cwd


class TestGpateRuns:
    """gpate on 1 and 2 processes (``gpate_runs``): a work unit of its own."""

    def test_a_two_process_gpate_run_releases_what_one_process_does(self, gpate_runs):
        import json

        one, two = (json.loads((gpate_runs / d / "privacy.json").read_text()) for d in ("one", "two"))
        assert one["entries"] == two["entries"] and one["epsilon"] == two["epsilon"]
        a, b = _weights(gpate_runs / "one"), _weights(gpate_runs / "two")
        assert all(torch.equal(a[k], b[k]) for k in a), "the same votes, the same noise, the same generator"
        ca, cb = (torch.load(gpate_runs / d / "checkpoints" / "last.pt", weights_only=False)["state"]["teachers"]
                  for d in ("one", "two"))
        assert all(torch.equal(ca["params"][k], cb["params"][k]) for k in ca["params"]), "rank 0 gathered all teachers"
        assert "teachers sharded over 2 processes" in (gpate_runs / "two" / "train.log").read_text()

    @pytest.mark.slow  # a 2-process resume: TestDpdmRuns; gpate's own resume: tests/test_gpate_train.py
    def test_a_two_process_gpate_checkpoint_resumes_bit_exactly(self, gpate_runs):
        cut = gpate_runs / "cut"
        first = _train(gpate_runs, cut, "debug.stop_after=2", procs=2, base=TINY_GPATE)
        assert first.returncode != 0 and (cut / "checkpoints" / "last.pt").is_file(), first.stderr[-2000:]
        second = _train(gpate_runs, cut, f"resume={cut}", procs=2, base=TINY_GPATE)
        assert second.returncode == 0, second.stderr[-3000:]
        a, b = _weights(gpate_runs / "two"), _weights(cut)
        assert all(torch.equal(a[k], b[k]) for k in a)


# ---- gswgan/dpac/efsgd: the discriminator pre-training sharded over the ranks ------------------------------------
def _sharded_pretrain(rank: int, world: int, out) -> None:
    """7 (D, warm-up G) pairs in chunks of 2 (4 chunks: 2 per rank), pre-trained on ``world`` gloo processes."""
    from functools import partial

    import torch.distributed as td
    from omegaconf import OmegaConf

    from dpgen.core.dist import Dist
    from dpgen.gswgan.nets import ResNetGenerator, disc_init
    from dpgen.gswgan.train import Partitions, pretrain
    from dpgen.ensemble import NetStack
    from dpgen.nets.spectral import sn_init
    from dpgen.privacy.randomness import secret_generator

    torch.set_num_threads(1)  # as the in-process world of one (``one_torch_thread``): the same kernels, bit for bit
    _init_gloo(rank, world, out)
    try:
        k, shape = 7, [1, 8, 8]
        data = torch.Generator().manual_seed(0)
        x, y = torch.rand(70, *shape, generator=data) * 2 - 1, torch.randint(0, 10, (70,), generator=data)
        parts = Partitions([list(range(i, 70, k)) for i in range(k)], torch.device("cpu"))
        disc = NetStack(partial(disc_init, 10, shape, 4), sn_init, k, torch.Generator().manual_seed(1),
                        torch.device("cpu"))
        hp = OmegaConf.create({"pretrain_iters": 2, "critic_iters": 2, "pretrain_chunk": 2, "batch_size": 5, "lr": 1e-4,
                               "betas": [0.0, 0.99], "gp_weight": 10.0, "drift": 0.0, "g_lr": None})
        pretrain(disc, parts, x, y, partial(ResNetGenerator, 10, shape, 8, 8), hp, secret_generator("cpu", seed=5), 10,
                 seed=0, dist=Dist(rank=rank, world=world))
        torch.save(disc.state_dict(), out / f"pre{world}_r{rank}.pt")
    finally:
        td.destroy_process_group()


def test_sharded_pretraining_equals_the_single_process_one(tmp_path, one_torch_thread):
    """Each rank pre-trains its block of chunks (a chunk's streams depend on its index only), then the ranks
    exchange their blocks: every rank holds the ensemble one process pre-trains, bit for bit."""
    _world_of_one(_sharded_pretrain, tmp_path)
    mp.spawn(_sharded_pretrain, args=(2, tmp_path), nprocs=2, join=True)
    one = torch.load(tmp_path / "pre1_r0.pt")
    for rank in (0, 1):
        two = torch.load(tmp_path / f"pre2_r{rank}.pt")
        assert torch.equal(one["t"], two["t"]) and int(one["t"].min()) == 2 * 2, "every member pre-trained once"
        for name in ("params", "buffers", "m", "v"):
            for n, v in one[name].items():
                assert torch.equal(v, two[name][n]), (rank, name, n)


class TestGswganRun:
    """gswgan on 1 and 2 processes: a work unit of its own (``make test-slow``)."""

    # 40-50 s (three interpreters, each calibrating the noise). Outside ``make test``, which covers its parts faster:
    # the sharded pre-training, the only stage the ranks split (dpgen/gswgan/train.py), bit for bit
    # (test_sharded_pretraining_equals_the_single_process_one), and the pipeline's 2-process path: the same ledger
    # and weights, rank 0 alone writing (TestDpdmRuns, TestGpateRuns).
    @pytest.mark.slow
    def test_a_two_process_gswgan_run_releases_what_one_process_does(self, tmp_path):
        import json
        import sys as _sys

        _sys.path.insert(0, str(ROOT / "tests"))
        from tiny import TINY

        base = [*TINY["gswgan"], "gswgan.num_discriminators=4", "gswgan.pretrain_chunk=2",
                *[o for o in TINY_DPDM if not o.startswith(("method=", "feta.", "eps="))], "method=gswgan", "eps=10"]
        one, two = _train_side_by_side(tmp_path, base=base)
        assert one.returncode == 0, one.stderr[-3000:]
        assert two.returncode == 0, two.stderr[-3000:]
        pa, pb = (json.loads((tmp_path / d / "privacy.json").read_text()) for d in ("one", "two"))
        assert pa["entries"] == pb["entries"] and pa["epsilon"] == pb["epsilon"]
        a, b = _weights(tmp_path / "one"), _weights(tmp_path / "two")
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert "chunks done on rank 0" in (tmp_path / "two" / "train.log").read_text()


def _least(rank: int, world: int, out) -> None:
    import torch.distributed as td

    from dpgen.core.dist import Dist

    _init_gloo(rank, world, out)
    try:
        (out / f"least{rank}.txt").write_text(str(Dist(rank=rank, world=world).min([64, 16][rank])))
    finally:
        td.destroy_process_group()


def test_ranks_agree_on_the_least_of_their_measured_micro_batches(tmp_path):
    """A memory-sized micro-batch is measured on each rank; the ranks then split the micro-batches by index, so all
    use the least one (feta's train() passes its micro-batch through Dist.min)."""
    from dpgen.core.dist import Dist

    mp.spawn(_least, args=(2, tmp_path), nprocs=2, join=True)
    assert [(tmp_path / f"least{r}.txt").read_text() for r in range(2)] == ["16", "16"]
    assert Dist(rank=0, world=1).min(64) == 64
