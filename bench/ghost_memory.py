"""Peak memory of one ghost-clipping step (dpgen.privacy.ghost): the per-record norms and the clipped sum of one
micro-batch, on a CPU, as the process's peak resident set size above what it held before the first step.

Each network runs in its own subprocess, so one network's peak does not hide another's (``ru_maxrss`` only grows).
The step is run ``--reps`` times, holding the last step's gradients as a training loop does until the next step.

    OMP_NUM_THREADS=1 python bench/ghost_memory.py [--nets dpgan_D,feta_unet] [--batch 64]
        [--multiplicity 32 --unet paper --batch 2] [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def measure(name: str, batch: int, k: int, unet: str, reps: int) -> dict:
    from dpsgd_overhead import NETS

    from dpgen.privacy.ghost import GhostClipper

    build, width = NETS[name]
    bench, data = build(batch, width, k if name == "feta_unet" else 1, unet)
    clipper = GhostClipper(bench.net)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    grads = None
    for _ in range(reps):
        rec = clipper.record(lambda: bench.records(*data))
        grads = rec.clipped_sum((1.0 / (rec.norms + 1e-6)).clamp(max=1.0))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert grads is not None
    return {"net": name, "rows": batch * (k if name == "feta_unet" else 1), "before_mib": before / 1024,
            "peak_mib": peak / 1024, "step_mib": (peak - before) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="dpgan_D,feta_unet")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--multiplicity", type=int, default=1, help="feta_unet: K rows per record")
    ap.add_argument("--unet", default="quick", choices=("quick", "paper"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the subprocess: measure this network, print JSON
    a = ap.parse_args()
    if a.one:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        print(json.dumps(measure(a.one, a.batch, a.multiplicity, a.unet, a.reps)))
        return
    print(f"ghost step peak memory, batch {a.batch}, K={a.multiplicity} (feta_unet, {a.unet} UNet), {a.reps} steps, "
          f"torch {torch.__version__}")
    print(f"{'network':<10} {'rows':>5} {'before MiB':>11} {'peak MiB':>9} {'step MiB':>9}")
    for name in a.nets.split(","):
        out = subprocess.run([sys.executable, __file__, "--one", name, "--batch", str(a.batch), "--multiplicity",
                              str(a.multiplicity), "--unet", a.unet, "--reps", str(a.reps)],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{r['net']:<10} {r['rows']:>5} {r['before_mib']:>11.0f} {r['peak_mib']:>9.0f} {r['step_mib']:>9.0f}")


if __name__ == "__main__":
    main()
