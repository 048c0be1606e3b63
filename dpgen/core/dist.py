"""The process group a run may span (torch.distributed), launched by ``torchrun``, ``srun`` or Hydra's submitit
launcher.

``torchrun --nproc_per_node=W scripts/train.py ...`` starts W processes with ``RANK``/``WORLD_SIZE``/
``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT`` set; ``srun`` with W tasks, and ``hydra.launcher.tasks_per_node=W``
under ``hydra/launcher=slurm`` or ``submitit_local``, start W tasks of one job, whose variables
:func:`adopt_job_env` translates (so one run spans several GPUs and nodes). :func:`from_env` joins them (NCCL on
CUDA, gloo on a CPU) and gives each process the GPU of its local rank. One process (no such variables) is
:data:`SINGLE`, and every helper below is then a no-op, so a single-process run is unchanged.

A run's randomness is shared by all ranks: rank 0 draws the secret root and broadcasts it over the process
group (never through a file), so every rank draws the same Poisson sample and the same noise. Methods split
the work (:meth:`Dist.owns`), all-reduce what each rank computed, and then take identical steps on every rank;
rank 0 alone writes files (:class:`dpgen.core.run.Run`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from dpgen.errors import DpgenError

__all__ = ["Dist", "SINGLE", "adopt_job_env", "adopt_slurm_env", "from_env", "launch_rank", "launched_multi_process"]


@dataclass(frozen=True)
class Dist:
    """This process's place in the run: ``rank`` of ``world`` processes, ``local_rank`` on its node."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0: the process that writes the run's files."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def shard(self, n: int) -> range:
        """This rank's contiguous block of n members (ensemble sharding): sizes differ by at most one, every member
        belongs to exactly one rank, and the blocks follow the ranks' order (rank 0 holds the first ones)."""
        return range(self.rank * n // self.world, (self.rank + 1) * n // self.world)

    def owns(self, part: int) -> bool:
        """Whether this rank computes part ``part`` of a round-robin split (every part is computed once)."""
        return part % self.world == self.rank

    def all_reduce_(self, tensors: list[torch.Tensor]) -> None:
        """Sum each tensor over the ranks, in place (every rank gets the same sums)."""
        if self.active:
            import torch.distributed as td

            for t in tensors:
                td.all_reduce(t, op=td.ReduceOp.SUM)

    def min(self, value: int) -> int:
        """The least of the ranks' ``value`` on every rank (one collective: every rank must call it). A setting that
        each rank measures for itself, such as a memory-sized micro-batch, must be the same on all of them."""
        if not self.active:
            return int(value)
        import torch.distributed as td

        t = torch.tensor([int(value)], dtype=torch.long)
        if td.get_backend() == "nccl":
            t = t.cuda()
        td.all_reduce(t, op=td.ReduceOp.MIN)
        return int(t.item())

    def gather_rows(self, t: torch.Tensor, n: int) -> torch.Tensor | None:
        """The n rows of a sharded tensor (each rank holds its :meth:`shard` of them) on rank 0, on the host; None
        on the other ranks. One collective per call: every rank must call it, in the same order."""
        if not self.active:
            return t.detach().cpu()
        import torch.distributed as td

        width = -(-n // self.world)  # the largest shard; shorter ones are padded (gather needs equal shapes)
        pad = torch.zeros((width, *t.shape[1:]), dtype=t.dtype, device=t.device)
        pad[:len(t)] = t.detach()
        bufs = [torch.empty_like(pad) for _ in range(self.world)] if self.main else None
        td.gather(pad, bufs, dst=0)
        if not self.main:
            return None
        blocks = [Dist(r, self.world).shard(n) for r in range(self.world)]
        return torch.cat([b[:len(rows)].cpu() for b, rows in zip(bufs, blocks)])

    def share_rows_(self, tensors: list[torch.Tensor], blocks: list[range]) -> None:
        """Rank r's rows ``blocks[r]`` of every tensor copied to every rank, in place (each rank computed its own
        block of a full-size tensor; afterwards all hold the whole). Exact: rows are copied, never summed."""
        if not self.active:
            return
        import torch.distributed as td

        for src, rows in enumerate(blocks):
            if not len(rows):
                continue
            for t in tensors:
                buf = t[rows.start:rows.stop].contiguous()
                td.broadcast(buf, src=src)
                t[rows.start:rows.stop] = buf

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (picklable Python objects: a path, a secret root)."""
        if not self.active:
            return obj
        import torch.distributed as td

        box = [obj]
        td.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.active:
            import torch.distributed as td

            td.barrier()

    def close(self) -> None:
        if self.active:
            import torch.distributed as td

            if td.is_initialized():
                td.destroy_process_group()


SINGLE = Dist()


def _submitit_job() -> Any:
    """submitit's description of the multi-task job this process is one task of (``srun`` with several tasks,
    submitit's SLURM or local executor with ``tasks_per_node`` > 1), or None."""
    env = os.environ
    try:
        if env.get("SUBMITIT_EXECUTOR") == "local" and "SUBMITIT_LOCAL_GLOBALID" in env:
            if int(env.get("SUBMITIT_LOCAL_NTASKS", "1")) > 1:  # a task of submitit's local controller
                from submitit.local.local import LocalJobEnvironment

                return LocalJobEnvironment()
        elif "SLURM_PROCID" in env and int(env.get("SLURM_STEP_NUM_TASKS", "1")) > 1:  # a task of an srun step
            from submitit.slurm.slurm import SlurmJobEnvironment  # SLURM's variables, its node-list syntax included

            return SlurmJobEnvironment()
    except ValueError:
        pass
    return None


def adopt_job_env() -> None:
    """In a task of a multi-task job (and no ``torchrun``), set torch.distributed's ``env://`` variables (RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR = the job's first node, MASTER_PORT from the job id) from the job's, read by
    submitit's job environment: ``srun -n W`` (SLURM's variables, in an sbatch script or under
    ``hydra/launcher=slurm hydra.launcher.tasks_per_node=W``) or ``hydra/launcher=submitit_local
    hydra.launcher.tasks_per_node=W`` (submitit's local controller: ``SUBMITIT_LOCAL_*``, one node, this host).
    A no-op otherwise: one task (``hydra/launcher=slurm`` jobs by default, ``sbatch`` batch steps) or a torchrun
    launch, whose variables win."""
    if "WORLD_SIZE" in os.environ:
        return
    job = _submitit_job()
    try:
        if job is None or job.num_tasks <= 1:
            return
        task = {"RANK": job.global_rank, "WORLD_SIZE": job.num_tasks, "LOCAL_RANK": job.local_rank}
    except ValueError:  # a malformed variable: no job to join
        return
    try:  # the SLURM job id (unique per array task too), or the local controller's pid
        job_id = int(job.raw_job_id)
    except (KeyError, ValueError):
        job_id = 0
    # every task of a job derives the same port from its id (another job: another port); CUDA_VISIBLE_DEVICES is
    # left alone (local rank r takes cuda:r, see from_env); a MASTER_ADDR/MASTER_PORT set by the job script wins
    master = "127.0.0.1" if job.cluster == "local" else job.hostnames[0]  # the local executor runs on this host
    for key, value in {"MASTER_ADDR": master, "MASTER_PORT": 20000 + job_id % 40000, **task}.items():
        os.environ.setdefault(key, str(value))


adopt_slurm_env = adopt_job_env  # the former name (it read SLURM's variables only)


def launched_multi_process() -> bool:
    """Whether this process is one of several of one run: started by ``torchrun``, or as a task of a multi-task job
    (``srun``, submitit's executors; :func:`adopt_job_env` then sets ``WORLD_SIZE``)."""
    adopt_job_env()
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def launch_rank() -> int:
    """This process's rank in a multi-process launch; 0 in a single-process run."""
    if not launched_multi_process():
        return 0
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


launched_by_torchrun = launched_multi_process  # the name schema.py imports (srun launches count too)


def rank_gpu(local_rank: int, visible: int) -> int:
    """The CUDA index of local rank r: r when the node's GPUs are all visible (torchrun, ``srun`` without GPU
    binding), 0 when the scheduler bound one GPU to each task (``--gpus-per-task=1``, ``--gpu-bind``: every task
    sees only its own GPU, as cuda:0)."""
    if visible == 1:
        return 0
    if local_rank >= visible:
        raise DpgenError(f"local rank {local_rank} has no GPU ({visible} visible); "
                         "use --nproc_per_node (or tasks per node) <= the number of GPUs")
    return local_rank


def from_env(device: torch.device) -> tuple[Dist, torch.device]:
    """Join the process group ``torchrun`` set up (or :data:`SINGLE` without one) and the device of this rank.

    ``device``: the run's device as configured; CUDA runs put local rank r on ``cuda:r`` (:func:`rank_gpu`).
    """
    if not launched_multi_process():
        return SINGLE, device
    import torch.distributed as td

    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except (KeyError, ValueError):
        raise DpgenError("WORLD_SIZE > 1 but RANK/LOCAL_RANK are missing: launch with torchrun") from None
    if device.type == "cuda":
        device = torch.device("cuda", rank_gpu(local, torch.cuda.device_count()))
        torch.cuda.set_device(device)
    if not td.is_initialized():
        td.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", init_method="env://")
    return Dist(rank=rank, world=world, local_rank=local), device
