"""FLOPs of the GS-WGAN family's discriminator pre-training, counted per convolution group, by part.

One pre-training iteration of a chunk (dpgen.gswgan.train.pretrain) is ``critic_iters`` × (the warm-up generators'
fakes without gradients, then one WGAN-GP critic step) and one warm-up generator step, for every (D, G) pair of the
chunk at once. This runs one such iteration on the CPU at the config's sizes (random inputs: the count depends on
shapes only) and counts its FLOPs with ``torch.utils.flop_counter`` and bench/gpu_profile.py's per-group formula
for the convolutions' backward. vmap makes each pair's convolutions one group of a grouped convolution, and torch's
own formula counts a grouped convolution's weight gradient as a dense one, so its count grows with the pairs per
chunk; the per-group count per pair does not. The table gives both, torch's extrapolated to the chunk, which is
what the GPU check's TFLOP/s column divided by its seconds.

    python bench/pretrain_flops.py [--method gswgan] [--profile paper] [--dataset fmnist] [--pairs 2]
                                   [--shape 1,28,28] [--rate 664] [--seconds 1.87,1.25,1.28]

``--rate``: a card's measured matmul TFLOP/s (the floor is the whole pre-training at that rate); ``--seconds``:
measured seconds per chunk iteration, each turned into the TFLOP/s it achieved.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PARTS = ("fakes", "critic", "generator")


def _gpu_profile():
    spec = importlib.util.spec_from_file_location("gpu_profile", ROOT / "bench" / "gpu_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def count_iteration(hp, shape: list[int], num_classes: int, pairs: int,
                    vmapped: bool = True) -> tuple[dict[str, int], dict[str, int]]:
    """(per-group FLOPs, torch's count minus them) of one pre-training iteration of ``pairs`` pairs, by part
    (:data:`PARTS`), summed over the pairs. ``vmapped``: the warm-up generators as on a GPU (the discriminators'
    steps are vmapped everywhere)."""
    from torch.utils.flop_counter import FlopCounterMode, conv_backward_flop

    from dpgen.ensemble import NetStack
    from dpgen.ensemble.functional import batched_forward
    from dpgen.gswgan.ensemble import GeneratorStack, critic_step
    from dpgen.gswgan.nets import ResNetGenerator, disc_forward, disc_init
    from dpgen.gswgan.train import generator_lr
    from dpgen.nets.spectral import sn_init

    gp = _gpu_profile()
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
    flops, excess = dict.fromkeys(PARTS, 0), dict.fromkeys(PARTS, 0)

    def counted(part: str, fn):
        extra = [0]

        def per_group(*shapes, **kw):
            ours = gp.grouped_conv_backward_flop(*shapes, **kw)
            extra[0] += conv_backward_flop.__wrapped__(*shapes, **kw) - ours  # torch's formula, on shapes
            return ours

        mode = FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: per_group})
        if hasattr(mode, "mod_tracker"):
            mode.mod_tracker = gp._GlobalOnly()
        with mode:
            out = fn()
        flops[part] += int(mode.get_total_flops())
        excess[part] += extra[0]
        return out

    for _ in range(critic):
        with torch.no_grad():
            xf = counted("fakes", lambda: gens(gens.sample_z(b, g), y))
        alpha = torch.rand(pairs, b, generator=g)
        counted("critic", lambda: critic_step(disc, disc_forward, idx, x, y, xf, y, alpha, float(hp.gp_weight),
                                              float(hp.drift), lr, betas))
    counted("generator", lambda: gens.step(lambda xg: -batched_forward(disc, disc_forward, idx, xg, y).mean(1).sum(),
                                           gens.sample_z(b, g), y))
    return flops, excess


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="gswgan", choices=("gswgan", "dpac", "efsgd"))
    ap.add_argument("--profile", default="paper")
    ap.add_argument("--dataset", default="fmnist", help="the config's dataset (its hyperparameters)")
    ap.add_argument("--shape", default="1,28,28", help="the images' C,H,W (F-MNIST's by default)")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--pairs", type=int, default=2, help="pairs counted at once (at least 2: torch's count grows "
                                                          "with them, and two points give its slope)")
    ap.add_argument("--rate", type=float, default=664.0, help="a card's matmul TFLOP/s, for the floor")
    ap.add_argument("--seconds", default="", help="measured seconds per chunk iteration, comma-separated")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    a = ap.parse_args(argv)
    if a.pairs < 2:
        ap.error("--pairs must be at least 2")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    cfg = _gpu_profile()._compose(a.method, a.dataset, "1", a.profile, list(a.set))
    hp = cfg[a.method]
    shape, ncls = [int(v) for v in a.shape.split(",")], int(a.classes)
    flops, excess = count_iteration(hp, shape, ncls, a.pairs)
    chunk, k, iters = int(hp.pretrain_chunk or 100), int(hp.num_discriminators), int(hp.pretrain_iters)
    per_pair = {p: flops[p] / a.pairs for p in PARTS}
    # torch's count per pair is the per-group count plus (pairs - 1) x the weight gradients' share
    torch_chunk = {p: per_pair[p] + excess[p] / a.pairs * (chunk - 1) / (a.pairs - 1) for p in PARTS}
    total = sum(per_pair.values())
    print(f"{a.method}, profile={a.profile}, {a.dataset}: K = {k}, {iters} warm-up iterations, chunks of {chunk} pairs, "
          f"batch {int(hp.batch_size)}, {int(hp.critic_iters)} critic steps per iteration")
    print("| part | GFLOP per pair-iteration | share | torch's count per pair, chunks of "
          f"{chunk} (GFLOP) |\n|---|---|---|---|")
    names = {"fakes": "warm-up generators' fakes (no gradients)", "critic": "critic steps (WGAN-GP)",
             "generator": "warm-up generator step"}
    for p in PARTS:
        print(f"| {names[p]} | {per_pair[p] / 1e9:.1f} | {100 * per_pair[p] / total:.0f} % | "
              f"{torch_chunk[p] / 1e9:.1f} |")
    print(f"| all | {total / 1e9:.1f} | 100 % | {sum(torch_chunk.values()) / 1e9:.1f} |")
    whole = total * k * iters
    floor_h = whole / (a.rate * 1e12) / 3600
    print(f"per chunk iteration: {total * chunk / 1e12:.1f} TFLOP (torch's count: "
          f"{sum(torch_chunk.values()) * chunk / 1e12:.1f}); whole pre-training: {whole / 1e18:.2f} EFLOP, "
          f"{floor_h * 60:.0f} min at {a.rate:g} TFLOP/s")
    achieved = []
    for s in filter(None, a.seconds.split(",")):
        sec = float(s)
        rate = total * chunk / sec / 1e12
        achieved.append((sec, rate, sum(torch_chunk.values()) * chunk / sec / 1e12))
        print(f"{sec:g} s per chunk iteration: {rate:.1f} TFLOP/s ({100 * rate / a.rate:.1f} % of {a.rate:g}); "
              f"torch's count would read {achieved[-1][2]:.0f}")
    return {"per_pair": per_pair, "torch_chunk": torch_chunk, "whole": whole, "floor_h": floor_h,
            "achieved": achieved}


if __name__ == "__main__":
    main()
