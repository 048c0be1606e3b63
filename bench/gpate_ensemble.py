"""Time one G-PATE iteration's teacher work with n teachers: batched ensemble vs a per-teacher loop.

One iteration = one teacher training step on (real, fake) + every teacher's ∂L/∂x on the fake
batch (what DPGradAgg consumes).  Both variants run in this process on the same parameters.
The batched variant is TeacherEnsemble (grouped convolutions / bmm, fused Adam); ``--layout`` picks the
memory layout of its grouped convolutions (NCHW is dpgen.gpate.nets' default); ``--vmap``
also times the older torch.func.vmap path on the same ensemble.  The loop costs the same for every
teacher, so with ``--loop-teachers m < n`` only m teachers are looped and the time is scaled by n/m.

``--memory`` prints, per dataset at profile=paper sizes, the bytes per teacher (parameters and Adam's two
moments, float32; a chunk's gradients and activations come on top) and how many teachers fit in a given
budget (default 80 GB) next to a chunk of 500 teachers' gradients.

    python bench/gpate_ensemble.py --teachers 2000 --batch 30 [--device cpu] [--threads 1] [--loop-teachers 200]
    python bench/gpate_ensemble.py --memory [--budget-gb 80]
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from dpgen.gpate.ensemble import TeacherEnsemble, ensemble_bytes
from dpgen.gpate.nets import TeacherCNN

#: (classes, image shape) of the image datasets G-PATE's Table 1/2 use
DATASETS = {"mnist / fmnist": (10, [1, 28, 28]), "celeba32": (2, [3, 32, 32]), "celeba64": (2, [3, 64, 64]),
            "celeba_hair64": (3, [3, 64, 64])}


def batched_iteration(ens: TeacherEnsemble, xr, yr, w, xf, yf) -> None:
    ens.train_step(TeacherEnsemble.fixed_batch(xr, yr, w, xf, yf))
    for _ in ens.input_grads_chunks(xf, yf):
        pass


def vmap_iteration(ens: TeacherEnsemble, xr, yr, w, xf, yf) -> None:
    ens.use_stacked = False  # TeacherEnsemble.forward then takes its torch.func.vmap fallback
    try:
        batched_iteration(ens, xr, yr, w, xf, yf)
    finally:
        ens.use_stacked = True


def looped_iteration(teachers, opts, xr, yr, xf, yf) -> None:
    for i, (t, opt) in enumerate(zip(teachers, opts)):
        opt.zero_grad(set_to_none=True)
        loss = F.binary_cross_entropy_with_logits(t(xr[i], yr[i]), torch.ones(len(yr[i]), device=xr.device)) + \
            F.binary_cross_entropy_with_logits(t(xf, yf), torch.zeros(len(yf), device=xr.device))
        loss.backward()
        opt.step()
        x = xf.clone().requires_grad_(True)
        g_loss = F.binary_cross_entropy_with_logits(t(x, yf), torch.ones(len(yf), device=xr.device))
        torch.autograd.grad(g_loss, x)


def timed(fn, reps: int) -> float:
    fn()  # warm-up
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def memory_table(budget_gb: float, df_dim: int, dfc_dim: int, chunk: int = 500) -> None:
    """Teachers that fit in ``budget_gb`` by their persistent state, with one chunk's gradients (activations of
    a chunk of c teachers × batch b come on top; ``gpate.chunk`` bounds them)."""
    print(f"teacher state (params + Adam m, v; float32) at df={df_dim} dfc={dfc_dim}, plus the gradients of a chunk "
          f"of {chunk}; budget {budget_gb:g} GB")
    for name, (k, shape) in DATASETS.items():
        p = sum(v.numel() for v in TeacherCNN(k, shape, df_dim=df_dim, dfc_dim=dfc_dim).parameters())
        per = ensemble_bytes(p, 1)
        fit = int((budget_gb * 1e9 - ensemble_bytes(p, 0, chunk)) // per)
        print(f"  {name:15s} {p / 1e6:6.3f}M params/teacher  {per / 1e6:7.2f} MB/teacher  "
              f"2000 teachers {ensemble_bytes(p, 2000, chunk) / 1e9:6.1f} GB  4000 teachers "
              f"{ensemble_bytes(p, 4000, chunk) / 1e9:6.1f} GB  fit in {budget_gb:g} GB: {fit}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teachers", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=30, help="real records per teacher = fake samples (official: 30)")
    ap.add_argument("--df-dim", type=int, default=32)
    ap.add_argument("--dfc-dim", type=int, default=256)
    ap.add_argument("--norm", default="batch", choices=["none", "layer", "batch"])
    ap.add_argument("--layout", default="nchw", choices=["channels_last", "nchw"])
    ap.add_argument("--chunk", type=int, default=0, help="teachers per chunk (0: all)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--loop-teachers", type=int, default=0, help="loop over only this many teachers and scale (0: all)")
    ap.add_argument("--vmap", action="store_true", help="also time the torch.func.vmap path")
    ap.add_argument("--no-loop", action="store_true", help="time the batched ensemble only")
    ap.add_argument("--memory", action="store_true", help="print the teacher-count table and exit")
    ap.add_argument("--budget-gb", type=float, default=80.0)
    a = ap.parse_args()
    if a.memory:
        memory_table(a.budget_gb, a.df_dim, a.dfc_dim)
        return
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    make = lambda: TeacherCNN(10, [1, 28, 28], df_dim=a.df_dim, dfc_dim=a.dfc_dim, norm=a.norm)  # noqa: E731
    ens = TeacherEnsemble(make, a.teachers, dev, chunk=a.chunk or None, seed=0)
    ens.base.channels_last = a.layout == "channels_last"
    g = torch.Generator(device=dev).manual_seed(0)
    xr = torch.rand(a.teachers, a.batch, 1, 28, 28, generator=g, device=dev)
    yr = torch.randint(0, 10, (a.teachers, a.batch), generator=g, device=dev)
    w = torch.ones(a.teachers, a.batch, device=dev)
    xf = torch.rand(a.batch, 1, 28, 28, generator=g, device=dev)
    yf = torch.randint(0, 10, (a.batch,), generator=g, device=dev)
    tb = timed(lambda: batched_iteration(ens, xr, yr, w, xf, yf), a.reps)
    print(f"teachers={a.teachers} batch={a.batch} df={a.df_dim} dfc={a.dfc_dim} norm={a.norm} layout={a.layout} "
          f"chunk={a.chunk or a.teachers} device={dev} threads={torch.get_num_threads()} "
          f"params/teacher={ens.num_params // a.teachers}")
    if a.no_loop:
        print(f"batched: {tb:.3f} s/iteration")
    else:
        n_loop = min(a.loop_teachers or a.teachers, a.teachers)
        teachers = []
        for i in range(n_loop):
            t = make().to(dev)
            t.load_state_dict(ens.teacher_params(i))
            teachers.append(t)
        opts = [torch.optim.Adam(t.parameters(), lr=1e-3, betas=(0.5, 0.999)) for t in teachers]
        tl = timed(lambda: looped_iteration(teachers, opts, xr, yr, xf, yf), a.reps) * a.teachers / n_loop
        scaled = f" (timed {n_loop} teachers, scaled x{a.teachers / n_loop:g})" if n_loop < a.teachers else ""
        print(f"batched: {tb:.3f} s/iteration   looped: {tl:.3f} s/iteration{scaled}   "
              f"ratio looped/batched: {tl / tb:.1f}x")
    if a.vmap:
        tv = timed(lambda: vmap_iteration(ens, xr, yr, w, xf, yf), a.reps)
        print(f"vmap: {tv:.3f} s/iteration   ratio batched/vmap: {tv / tb:.1f}x")


if __name__ == "__main__":
    main()
