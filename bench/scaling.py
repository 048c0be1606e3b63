"""Multi-process scaling (issue 25): steps/s of each method's multi-process path for 1 and W processes, side by side.

For each method a small configuration on the embedded digits is trained under ``torchrun`` (gloo on a CPU, NCCL on
GPUs) by worker processes of this script, each timing what its rank does:

* dpdm, feta: DP-SGD steps/s (the global Poisson batch split over the ranks, clipped sums all-reduced);
* gswgan: discriminator pre-training, (D, warm-up G) pairs per second (chunks split over the ranks);
* gpate: generator iterations per second, each = ``d_steps`` steps of every teacher + their votes (teachers split).

Rows come in groups per method: 1 process with 1 thread, W processes with 1 thread each, and 1 process with W threads
(what the same cores give without torchrun). ``speed-up`` is each row's rate over the 1-process, 1-thread row's.

    python bench/scaling.py [--methods dpdm,feta,gswgan,gpate] [--procs 2] [--steps 6] [--device cpu|cuda] [--out F]

On a CPU the processes share the machine's cores (CI's has 2), so W is at most the number of cores.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: method -> (config overrides on top of profile=quick, dataset digits; the unit timed)
SIZES: dict[str, tuple[list[str], str]] = {
    "dpdm": (["feta.batch_size=256", "feta.multiplicity=4", "feta.micro_batch=64", "feta.unet.nf=8"], "DP-SGD steps"),
    "feta": (["feta.central=mean", "feta.warmup_iters=0", "feta.batch_size=256", "feta.multiplicity=4",
              "feta.micro_batch=64", "feta.unet.nf=8"], "DP-SGD steps"),
    "gswgan": (["gswgan.num_discriminators=16", "gswgan.partitions_per_iter=4", "gswgan.pretrain_chunk=4",
                "gswgan.pretrain_iters=3", "gswgan.critic_iters=2", "gswgan.batch_size=32", "gswgan.g_width=16",
                "gswgan.d_width=16"], "pre-trained pairs"),
    "gpate": (["gpate.teachers=40", "gpate.chunk=10", "gpate.batch_size=32", "gpate.proj_dim=10",
               "gpate.teacher_warmup=0"], "generator iterations"),
}
COLUMNS = ("method", "unit", "processes", "threads/process", "device", "per s", "speed-up", "s (timed)")


class _Enough(Exception):
    """Raised after the timed steps."""


def worker(method: str, steps: int, device: str, data_root: str) -> None:
    """One rank's measurement (started by torchrun); rank 0 prints the JSON row."""
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_profile import _compose

    from dpgen.core import dist as dist_mod
    from dpgen.core.methods import load_method
    from dpgen.core.pipeline import quiet_known_noise
    from dpgen.core.run import Run
    from dpgen.data import load_dataset
    from dpgen.privacy import PrivacyLedger, parse_epsilon

    quiet_known_noise()
    dist, dev = dist_mod.from_env(torch.device(device))
    overrides, unit = SIZES[method]
    iters = {"gswgan": ["gswgan.iters=1"], "gpate": [f"gpate.iters={steps + 1}"]}.get(method, [f"feta.iters={steps + 1}"])
    cfg = _compose(method, "digits", "10", "quick", [*overrides, *iters])
    data = load_dataset("digits", data_root)
    ledger = PrivacyLedger(delta=float(cfg.delta), target_epsilon=parse_epsilon(cfg.eps),
                           accountant=cfg.privacy.accountant, accounting=cfg.privacy.accounting)
    stamps: list[float] = []
    pre: list[float] = []

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    class TimedRun(Run):
        def step_done(self, step, scalars, state_fn) -> None:
            sync()
            stamps.append(time.perf_counter())
            if method == "gswgan" or len(stamps) > steps:
                raise _Enough

    tr = __import__("dpgen.gswgan.train", fromlist=["pretrain"])
    original = tr.pretrain

    def timed_pretrain(*a, **kw):
        dist.barrier()
        t = time.perf_counter()
        original(*a, **kw)
        sync()
        pre.append(time.perf_counter() - t)
        raise _Enough

    with tempfile.TemporaryDirectory() as tmp:
        run = TimedRun(tmp, ledger, dev, 0, {}, checkpoint_every=10**9, log_every=10**9, progress=False,
                       tensorboard=False, noise_seed=0, dist=dist)
        tr.pretrain = timed_pretrain
        try:
            load_method(cfg.method.module).train(cfg[cfg.method.hparams], data, ledger, run)
        except _Enough:
            pass
        finally:
            tr.pretrain = original
            run.close()
    if method == "gswgan":
        seconds, count = pre[0], int(cfg.gswgan.num_discriminators)
    else:  # the first step (compilation, caches, the teachers' first pass) is not timed
        seconds, count = stamps[-1] - stamps[0], len(stamps) - 1
    if dist.main:
        print(json.dumps({"method": method, "unit": unit, "processes": dist.world, "device": str(dev),
                          "per s": count / seconds, "s (timed)": seconds}), flush=True)
    dist.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(method: str, procs: int, threads: int, steps: int, device: str, data_root: str) -> dict:
    """Launch ``procs`` workers (torchrun when more than one) and return rank 0's row."""
    cmd = [sys.executable, __file__, "--worker", method, "--steps", str(steps), "--device", device,
           "--data-root", data_root]
    if procs > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={procs}",
               "--master_addr=127.0.0.1", f"--master_port={_free_port()}", *cmd[1:]]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    if res.returncode != 0 or not rows:
        tail = (res.stderr.strip().splitlines() or ["?"])[-1]
        return {"method": method, "processes": procs, "threads/process": threads, "device": device,
                "unit": f"failed: {tail}"}
    return {**rows[0], "threads/process": threads}


def table(rows: list[dict]) -> str:
    def fmt(v) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default=",".join(SIZES))
    ap.add_argument("--procs", type=int, default=2, help="W, the processes of the multi-process rows")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per measurement (after one untimed)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data-root", default=os.environ.get("DPGEN_DATA", "data"))
    ap.add_argument("--out", default=None, help="also write the Markdown table here")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.worker, a.steps, a.device, a.data_root)
        return []
    if a.procs < 2:
        raise SystemExit("error: --procs must be >= 2")
    rows = []
    for method in a.methods.split(","):
        if method not in SIZES:
            raise SystemExit(f"error: unknown method {method!r}; choose from {', '.join(SIZES)}")
        group = [measure(method, p, t, a.steps, a.device, a.data_root) for p, t in ((1, 1), (a.procs, 1), (1, a.procs))]
        base = group[0].get("per s")
        for r in group:
            if base and "per s" in r:
                r["speed-up"] = r["per s"] / base
            print(table([r]).splitlines()[-1], file=sys.stderr, flush=True)
        rows += group
    out = table(rows)
    print(out)
    if a.out:
        Path(a.out).write_text(out + "\n")
    return rows


if __name__ == "__main__":
    main()
