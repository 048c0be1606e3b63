"""Memory per record of feta's DP-SGD micro-batch step on a CPU, per backend and conv path, against the estimate that
``feta.micro_batch=null`` uses off CUDA (dpgen.privacy.micro_batch.record_footprint).

Each (path, records) pair runs in its own subprocess: one micro-batch step of the real MicroStep (the paper UNet on
28 px at K = ``--multiplicity`` by default), measured as the growth of the process's peak resident set size over the
step. The footprint per record is the slope between the two record counts (``--records``), so what every step holds
whatever its size (the model, the interpreter) cancels. Paths: ``fused`` (ghost with dpgen's CPU kernel, the CPU
default), ``grouped`` and ``patches`` (ghost without the kernel, as on a GPU: ``feta.ghost_conv``), ``torch_func``.

    python bench/feta_footprint.py [--paths fused,grouped,patches,torch_func] [--records 1,3] [--unet paper]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # feta_step

PATHS = ("fused", "grouped", "patches", "torch_func")


def one(path: str, records: int, k: int, unet: str) -> float:
    """MiB the step adds to the peak RSS, in this process (call it in a fresh one)."""
    from feta_step import build

    from dpgen.feta.dpsgd import MicroStep, clipped_grad_sum_func
    from dpgen.privacy import ghost_kernel
    from dpgen.privacy.randomness import secret_generator

    net = build(unet, torch.device("cpu"))
    if path in ("grouped", "patches"):
        ghost_kernel.available = lambda: False  # as on a GPU: the conv path decides
    step = MicroStep(net, 1.0, grad_backend="torch_func" if path == "torch_func" else "ghost",
                     ghost_conv=path if path in ("grouped", "patches") else "auto")
    x = torch.rand(records, 1, 28, 28) * 2 - 1
    y = torch.randint(0, 10, (records,))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    clipped_grad_sum_func(net, x, y, k, 1.0, records, secret_generator("cpu", seed=0), step=step)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--records", default="1,3", help="two record counts: the footprint is the slope between them")
    ap.add_argument("--multiplicity", type=int, default=32)
    ap.add_argument("--unet", default="paper", choices=("paper", "quick"))
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # path:records, in a subprocess
    a = ap.parse_args(argv)
    if a.one:
        path, records = a.one.split(":")
        print(json.dumps(one(path, int(records), a.multiplicity, a.unet)))
        return []
    lo, hi = (int(r) for r in a.records.split(","))
    from dpgen.privacy.micro_batch import record_footprint
    from feta_step import build

    net = build(a.unet, torch.device("cpu"))

    def example(dev: torch.device) -> tuple:
        return (torch.zeros(1, 1, 28, 28, device=dev), torch.ones(1, device=dev),
                torch.zeros(1, dtype=torch.long, device=dev))
    estimate = record_footprint(net, example, a.multiplicity) / 2**30
    rows = [{"path": "estimate (meta device)", "GiB/record": estimate}]
    for path in a.paths.split(","):
        mib = []
        for records in (lo, hi):
            out = subprocess.run([sys.executable, __file__, "--one", f"{path}:{records}", "--multiplicity",
                                  str(a.multiplicity), "--unet", a.unet], capture_output=True, text=True, check=True)
            mib.append(json.loads(out.stdout.strip().splitlines()[-1]))
        rows.append({"path": path, "GiB/record": (mib[1] - mib[0]) / (hi - lo) / 1024,
                     f"MiB at {lo}": mib[0], f"MiB at {hi}": mib[1]})
    print(f"feta micro-batch step, {a.unet} UNet, K={a.multiplicity}, peak RSS growth per record ({lo} -> {hi})\n")
    print("| path | GiB per record | ratio to the estimate |\n|---|---|---|")
    for r in rows:
        print(f"| {r['path']} | {r['GiB/record']:.2f} | {r['GiB/record'] / estimate:.1f} |")
    return rows


if __name__ == "__main__":
    main()
