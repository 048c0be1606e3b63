"""Operators launched per ensemble step against the number of members batched together (issue 24, CPU evidence).

A batched ensemble launches a fixed number of operators per chunk, whatever the chunk holds; a per-member loop
would launch that number per member. Counts the top-level ``aten::`` operators that torch.profiler records for one
G-PATE teacher step (n teachers, chunks of c) and one GS-WGAN/DPAC critic step of k members at once (the same
count on a GPU, where each becomes one or a few kernel launches).

    python bench/ensemble_kernels.py [--teachers 40] [--chunks 5,10,20,40] [--members 4,8,16]

``--layouts`` instead times the two layouts of the members' convolutions (``ensemble.conv=grouped|batched``:
torch's grouped convolutions against unfold + one batched matmul, dpgen/ensemble/compute.py) side by side in one
process, interleaved rep by rep, for the same two steps; ``--device cuda`` times them on a GPU:

    python bench/ensemble_kernels.py --layouts [--reps 5] [--teachers 40] [--members 8] [--device cpu]
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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_layouts(teachers: int, members: int, reps: int, device: torch.device) -> list[tuple[str, float, float]]:
    """Median seconds of one G-PATE teacher step and one GS-WGAN critic step under ``ensemble.conv=grouped`` and
    ``batched``, the two layouts alternating rep by rep (one untimed warm-up each), on ``device``."""
    import statistics
    import time

    from dpgen.core.precision import ensemble_settings
    from dpgen.gswgan.ensemble import critic_step
    from dpgen.gswgan.nets import disc_forward, disc_init
    from dpgen.ensemble import NetStack
    from dpgen.gpate.ensemble import TeacherEnsemble
    from dpgen.gpate.nets import TeacherCNN
    from dpgen.nets.spectral import sn_init

    m, shape = 8, [1, 28, 28]
    g = torch.Generator(device=device).manual_seed(0)
    xr = torch.rand(teachers, m, *shape, generator=g, device=device) * 2 - 1
    yr = torch.randint(0, 10, (teachers, m), generator=g, device=device)
    xf = torch.rand(m, *shape, generator=g, device=device) * 2 - 1
    yf = torch.randint(0, 10, (m,), generator=g, device=device)
    batch = TeacherEnsemble.fixed_batch(xr, yr, torch.ones(teachers, m, device=device), xf, yf)
    ens = TeacherEnsemble(lambda: TeacherCNN(10, shape, df_dim=8, dfc_dim=32, norm="batch"), teachers, device)
    disc = NetStack(partial(disc_init, 10, shape, 8), sn_init, members, torch.Generator(device=device).manual_seed(0),
                    device)
    x = torch.rand(members, m, *shape, generator=g, device=device) * 2 - 1
    y = torch.randint(0, 10, (members, m), generator=g, device=device)
    alpha = torch.rand(members, m, generator=g, device=device)
    idx = torch.arange(members, device=device)
    steps = {f"gpate teacher step, {teachers} teachers": lambda: ens.train_step(batch),
             f"gswgan critic step, {members} members": lambda: critic_step(disc, disc_forward, idx, x, y, x, y, alpha,
                                                                           10.0, 0.0, 1e-4, (0.0, 0.99))}
    rows = []
    for name, step in steps.items():
        times: dict[str, list[float]] = {"grouped": [], "batched": []}
        for rep in range(reps + 1):
            for conv in times:
                with ensemble_settings(conv=conv):
                    _sync(device)
                    t0 = time.perf_counter()
                    step()
                    _sync(device)
                    if rep:  # rep 0 warms up
                        times[conv].append(time.perf_counter() - t0)
        rows.append((name, statistics.median(times["grouped"]), statistics.median(times["batched"])))
    return rows


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
    ap.add_argument("--layouts", action="store_true", help="time ensemble.conv=grouped against batched instead")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    if a.layouts:
        members = int(a.members.split(",")[-1]) if "," in a.members else int(a.members)
        timed = time_layouts(a.teachers, members, a.reps, torch.device(a.device))
        print(f"| step ({a.device}) | grouped s | batched s | batched ÷ grouped |\n|---|---|---|---|")
        for name, grouped, batched in timed:
            print(f"| {name} | {grouped:.4f} | {batched:.4f} | {batched / grouped:.2f} |")
        return [(name, 0, 0) for name, _, _ in timed]
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
