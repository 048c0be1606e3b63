"""FLOPs of the two missed GPU targets' work at profile=paper, counted per convolution group, by part.

torch's ``flop_counter`` counts a grouped convolution's weight gradient as a dense one's, g times its work. Two hot
paths are grouped convolutions on a GPU: vmap makes each (D, warm-up G) pair of GS-WGAN's pre-training one group
(100 pairs a chunk), and feta's ghost backend materialises the per-record gradients of a 3×3 convolution as a
convolution with one group per record (``feta.ghost_conv=grouped``, ``auto`` on a GPU). bench/gpu_check.py's TFLOP/s
column used that count until 2026-11-30. This counts the work on a CPU with bench/gpu_profile.py's per-group formula
(random inputs: a count depends on shapes only), gives torch's count beside it, extrapolated to the GPU's group
count (the surplus grows linearly with the groups), and turns measured seconds into TFLOP/s.

    python bench/flops.py gswgan [--method gswgan|dpac|efsgd] [--pairs 2] [--seconds 1.87,1.25,1.28]
    python bench/flops.py feta [--records 2] [--micro 32] [--conv grouped] [--seconds 15.0,15.8]

``gswgan``: one pre-training iteration (``critic_iters`` × (the warm-up generators' fakes without gradients, one
WGAN-GP critic step), then one warm-up generator step) per pair; seconds are per iteration of a chunk. ``feta``: one
DP-SGD micro-batch of the paper UNet at K = 32 per record (dpgen.feta.dpsgd.MicroStep, the code training runs);
seconds are per DP-SGD step of B = 4,096 records (counted with dpgen's CPU kernel off: it is not a torch operator, and
a GPU has none). ``--rate``: a card's measured matmul TFLOP/s, for the floor.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PARTS = ("fakes", "critic", "generator")
NAMES = {"fakes": "warm-up generators' fakes (no gradients)", "critic": "critic steps (WGAN-GP)",
         "generator": "warm-up generator step", "micro": "DP-SGD micro-batch (ghost clipping, K draws)"}


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def count_iteration(hp, shape: list[int], num_classes: int, pairs: int,
                    vmapped: bool = True) -> tuple[dict[str, int], dict[str, int]]:
    """(per-group FLOPs, torch's count minus them) of one pre-training iteration of ``pairs`` pairs, by part
    (:data:`PARTS`), summed over the pairs. ``vmapped``: the warm-up generators as on a GPU (the discriminators'
    steps are vmapped everywhere)."""
    from dpgen.ensemble import NetStack
    from dpgen.ensemble.functional import batched_forward
    from dpgen.gswgan.ensemble import GeneratorStack, critic_step
    from dpgen.gswgan.nets import ResNetGenerator, disc_forward, disc_init
    from dpgen.gswgan.train import generator_lr
    from dpgen.nets.spectral import sn_init

    count_flops = _bench("gpu_profile").count_flops
    b, critic, lr, betas = int(hp.batch_size), int(hp.critic_iters), float(hp.lr), tuple(hp.betas)
    width = hp.get("pretrain_g_width")
    width = int(hp.g_width if width is None else width)
    cpu, g = torch.device("cpu"), torch.Generator().manual_seed(0)
    disc = NetStack(partial(disc_init, num_classes, shape, int(hp.d_width)), sn_init, pairs, g, cpu)
    gens = GeneratorStack(partial(ResNetGenerator, num_classes, shape, int(hp.z_dim), width), pairs, cpu,
                          generator_lr(hp), betas, vmapped=vmapped)
    idx = torch.arange(pairs)
    x = torch.rand(pairs, b, *shape, generator=g) * 2 - 1
    y = torch.randint(0, num_classes, (pairs, b), generator=g)
    flops, surplus = dict.fromkeys(PARTS, 0), dict.fromkeys(PARTS, 0)

    def counted(part: str, fn):
        out, ours, extra = count_flops(fn)
        flops[part] += ours
        surplus[part] += extra
        return out

    for _ in range(critic):
        with torch.no_grad():
            xf = counted("fakes", lambda: gens(gens.sample_z(b, g), y))
        alpha = torch.rand(pairs, b, generator=g)
        counted("critic", lambda: critic_step(disc, disc_forward, idx, x, y, xf, y, alpha, float(hp.gp_weight),
                                              float(hp.drift), lr, betas))
    counted("generator", lambda: gens.step(lambda xg: -batched_forward(disc, disc_forward, idx, xg, y).mean(1).sum(),
                                           gens.sample_z(b, g), y))
    return flops, surplus


def count_micro(unet: str, records: int, k: int, conv: str, backend: str = "ghost") -> tuple[int, int]:
    """(per-group FLOPs, torch's count minus them) of one feta DP-SGD micro-batch of ``records`` records × ``k``
    draws (bench/feta_step.py's network and step), ``feta.ghost_conv=conv``."""
    from dpgen.feta.dpsgd import MicroStep, clipped_grad_sum_func
    from dpgen.privacy.randomness import secret_generator

    from dpgen.privacy.ghost_kernel import ENV

    fs = _bench("feta_step")
    cpu = torch.device("cpu")
    net = fs.build(unet, cpu)
    step = MicroStep(net, 1.0, grad_backend=backend, graph=False, ghost_conv=conv)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(records, 1, 28, 28, generator=g) * 2 - 1
    y = torch.randint(0, fs.CLASSES, (records,), generator=g)
    saved = os.environ.get(ENV)
    os.environ[ENV] = "0"  # dpgen's CPU kernel is not a torch operator (its work would go uncounted); a GPU has none
    try:
        _, ours, extra = _bench("gpu_profile").count_flops(
            lambda: clipped_grad_sum_func(net, x, y, k, 1.0, records, secret_generator(cpu, seed=0), step=step))
    finally:
        if saved is None:
            os.environ.pop(ENV)
        else:
            os.environ[ENV] = saved
    return ours, extra


def _report(rows: dict[str, tuple[float, float]], unit: int, units: int, per_run: str, whole_name: str, rate: float,
            seconds: list[float]) -> dict:
    """Prints the table (GFLOP per unit, per group and torch's at the GPU's group count) and the extrapolations;
    ``unit``s per timed span (``--seconds``), ``units`` in the whole run."""
    total = sum(v for v, _ in rows.values())
    torch_total = sum(t for _, t in rows.values())
    print(f"| part | GFLOP (per group) | share | torch's count (GFLOP) |\n|---|---|---|---|")
    for part, (v, t) in rows.items():
        print(f"| {NAMES[part]} | {v / 1e9:.1f} | {100 * v / total:.0f} % | {t / 1e9:.1f} |")
    if len(rows) > 1:
        print(f"| all | {total / 1e9:.1f} | | {torch_total / 1e9:.1f} |")
    whole = total * units
    floor_h = whole / (rate * 1e12) / 3600
    print(f"per {per_run}: {total * unit / 1e12:.1f} TFLOP (torch's count: {torch_total * unit / 1e12:.1f}); "
          f"{whole_name}: {whole / 1e18:.2f} EFLOP, {floor_h * 60:.0f} min at {rate:g} TFLOP/s")
    achieved = []
    for sec in seconds:
        achieved.append((sec, total * unit / sec / 1e12, torch_total * unit / sec / 1e12))
        print(f"{sec:g} s per {per_run}: {achieved[-1][1]:.1f} TFLOP/s ({100 * achieved[-1][1] / rate:.1f} % of "
              f"{rate:g}); torch's count would read {achieved[-1][2]:.0f}")
    return {"rows": rows, "per_unit": total, "torch_per_unit": torch_total, "whole": whole, "floor_h": floor_h,
            "achieved": achieved}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", choices=("gswgan", "feta"))
    ap.add_argument("--method", default=None, help="gswgan: gswgan (default), dpac or efsgd")
    ap.add_argument("--profile", default="paper")
    ap.add_argument("--dataset", default="fmnist", help="the config's dataset (its hyperparameters)")
    ap.add_argument("--shape", default="1,28,28", help="gswgan: the images' C,H,W (F-MNIST's by default)")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--pairs", type=int, default=2, help="gswgan: pairs counted at once (at least 2: torch's count "
                                                          "grows with them, and two points give its slope)")
    ap.add_argument("--records", type=int, default=2, help="feta: records counted in one micro-batch (at least 2)")
    ap.add_argument("--micro", type=int, default=32, help="feta: records per micro-batch on the GPU")
    ap.add_argument("--conv", default="grouped", help="feta: feta.ghost_conv (grouped: auto's choice on a GPU)")
    ap.add_argument("--unet", default="paper", choices=("paper", "quick"))
    ap.add_argument("--rate", type=float, default=664.0, help="a card's matmul TFLOP/s, for the floor")
    ap.add_argument("--seconds", default="", help="measured seconds per chunk iteration (gswgan) or DP-SGD step "
                                                  "(feta), comma-separated")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    a = ap.parse_args(argv)
    if min(a.pairs, a.records) < 2:
        ap.error("--pairs and --records must be at least 2")
    seconds = [float(s) for s in a.seconds.split(",") if s]
    method = a.method or a.target
    cfg = _bench("gpu_profile")._compose(method, a.dataset, "1", a.profile, list(a.set))
    hp = cfg[method]
    if a.target == "gswgan":
        shape = [int(v) for v in a.shape.split(",")]
        flops, surplus = count_iteration(hp, shape, int(a.classes), a.pairs)
        chunk, k, iters = int(hp.pretrain_chunk or 100), int(hp.num_discriminators), int(hp.pretrain_iters)
        print(f"{method}, profile={a.profile}, {a.dataset}: K = {k}, {iters} warm-up iterations, chunks of {chunk} "
              f"pairs, batch {int(hp.batch_size)}, {int(hp.critic_iters)} critic steps per iteration; GFLOP per "
              f"(D, warm-up G) pair and iteration, torch's count at {chunk} pairs")
        # torch's count per pair is the per-group count plus (pairs - 1) x the weight gradients' share
        rows = {p: (flops[p] / a.pairs, (flops[p] + surplus[p] * (chunk - 1) / (a.pairs - 1)) / a.pairs)
                for p in PARTS}
        return _report(rows, chunk, k * iters, f"iteration of {chunk} pairs", "the whole pre-training", a.rate,
                       seconds)
    k, batch, iters = int(hp.multiplicity), int(hp.batch_size), int(hp.iters)
    ours, surplus = count_micro(a.unet, a.records, k, a.conv)
    print(f"feta, profile={a.profile}, {a.dataset}: K = {k}, B = {batch}, {iters} DP-SGD steps, ghost_conv={a.conv}; "
          f"GFLOP per record, torch's count at {a.micro} records per micro-batch")
    rows = {"micro": (ours / a.records, (ours + surplus * (a.micro - 1) / (a.records - 1)) / a.records)}
    return _report(rows, batch, batch * iters, f"DP-SGD step of {batch} records", "the DP-SGD stage", a.rate,
                   seconds)


if __name__ == "__main__":
    main()
