"""Operators launched per ensemble step against the number of members batched together (issue 24, CPU evidence).

A batched ensemble launches a fixed number of operators per chunk, whatever the chunk holds; a per-member loop
would launch that number per member. Counts the top-level ``aten::`` operators that torch.profiler records for one
G-PATE teacher step (n teachers, chunks of c) and one GS-WGAN/DPAC critic step of k members at once (the same
count on a GPU, where each becomes one or a few kernel launches).

    python bench/ensemble_kernels.py [--teachers 40] [--chunks 5,10,20,40] [--members 4,8,16]
"""
from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def top_level_ops(fn) -> int:
    """aten operators called by ``fn()`` directly (not those they call), after one untimed warm-up call."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None)


def main(argv: list[str] | None = None) -> list[tuple[str, int, int]]:
    from dpgen.gswgan.ensemble import critic_step
    from dpgen.ensemble import NetStack
    from dpgen.gswgan.nets import disc_forward, disc_init
    from dpgen.nets.spectral import sn_init
    from dpgen.gpate.ensemble import TeacherEnsemble
    from dpgen.gpate.nets import TeacherCNN

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teachers", type=int, default=40)
    ap.add_argument("--chunks", default="5,10,20,40")
    ap.add_argument("--members", default="4,8,16")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    cpu, m, shape = torch.device("cpu"), 8, [1, 28, 28]
    rows = []
    xr, yr = torch.rand(a.teachers, m, *shape) * 2 - 1, torch.randint(0, 10, (a.teachers, m))
    xf, yf = torch.rand(m, *shape) * 2 - 1, torch.randint(0, 10, (m,))
    batch = TeacherEnsemble.fixed_batch(xr, yr, torch.ones(a.teachers, m), xf, yf)
    for chunk in map(int, a.chunks.split(",")):
        ens = TeacherEnsemble(lambda: TeacherCNN(10, shape, df_dim=8, dfc_dim=32, norm="batch"), a.teachers, cpu,
                              chunk=chunk)
        rows.append((f"gpate teacher step, {a.teachers} teachers", chunk, top_level_ops(lambda: ens.train_step(batch))))
    for k in map(int, a.members.split(",")):
        disc = NetStack(partial(disc_init, 10, shape, 8), sn_init, k, torch.Generator().manual_seed(0), cpu)
        x, y, alpha = torch.rand(k, m, *shape) * 2 - 1, torch.randint(0, 10, (k, m)), torch.rand(k, m)
        step = partial(critic_step, disc, disc_forward, torch.arange(k), x, y, x, y, alpha, 10.0, 0.0, 1e-4, (0.0, 0.99))
        rows.append(("dpac critic step", k, top_level_ops(step)))
    print("| step | members per chunk | top-level aten ops |\n|---|---|---|")
    for name, size, ops in rows:
        print(f"| {name} | {size} | {ops} |")
    return rows


if __name__ == "__main__":
    main()
