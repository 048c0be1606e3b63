"""feta/dpdm's sampler eager against ``compile=true`` (the denoiser call compiled), interleaved in one process.

The quick-profile UNet (28 px, nf 8, ch_mult 1,2, attention at 7) with EDM's Heun sampler and guidance 1, as
scripts/sample.py runs it; images in chunks of the CPU's default 100. Prints the compilation's cost (the first
compiled call) and the median time of each variant.

    OMP_NUM_THREADS=1 python bench/sampler_compile.py [--device cpu|cuda] [--images 200] [--steps 10] [--reps 3]
"""
from __future__ import annotations

import argparse
import time

import torch

from dpgen.core.compile import compiling
from dpgen.feta.generator import FetaGenerator


def _timed(gen: FetaGenerator, labels: torch.Tensor, compile_: bool) -> float:
    with compiling(compile_):
        if labels.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        gen.generate(labels, torch.Generator(device=labels.device).manual_seed(0))
        if labels.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    gen = FetaGenerator(10, [1, 28, 28], {"nf": 8, "ch_mult": [1, 2], "num_res_blocks": 1, "attn_res": [7]},
                        {"name": "edm", "steps": a.steps, "guidance": 1.0}).to(dev).eval()
    labels = torch.arange(a.images, device=dev) % 10
    print(f"device {dev}, {a.images} images, {a.steps} Heun steps, chunk {gen.chunk_size(dev)}, "
          f"{torch.get_num_threads()} thread(s)")
    print(f"compilation + first compiled call: {_timed(gen, labels, True):.1f} s")
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(a.reps):  # interleaved: load on a shared machine hits both alike
        for c in (False, True):
            times[c].append(_timed(gen, labels, c))
    eager, comp = (sorted(times[c])[len(times[c]) // 2] for c in (False, True))
    print(f"eager {eager:.2f} s, compiled {comp:.2f} s: speed-up {eager / comp:.2f}x")


if __name__ == "__main__":
    main()
