#!/usr/bin/env python
"""Write synthetic data from a run's generator.pt alone.

    python scripts/sample.py run=<run dir> n=60000 out=<file.npz> [labels=0,1,...] [seed=0] [device=auto] [compile=false]

The .npz holds ``x`` (uint8 N×C×H×W, or float32 N×D for tabular data) and ``y`` (int64);
labels are balanced over classes unless ``labels`` lists one label per sample (or a
single label for all). An existing ``out`` file is never overwritten. ``compile=true`` compiles the sampler's
network call (feta/dpdm: torch.compile of the denoiser; docs/performance.md), the same samples within fp32
rounding.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from dpgen.cli import user_errors
from dpgen.core.compile import compiling
from dpgen.core.generator import load_generator
from dpgen.core.pipeline import resolve_device
from dpgen.data.torch_utils import to_uint8
from dpgen.errors import DpgenError
from dpgen.scripts_util import parse_int, parse_kv


def main(argv: list[str]) -> None:
    args = parse_kv(argv, required=("run", "n", "out"), optional={"labels": None, "seed": "0", "device": "auto",
                                                                     "compile": "false"})
    out = Path(args["out"])
    if out.exists():
        raise DpgenError(f"{out} exists; choose another out= (nothing was overwritten)")
    n, seed = parse_int("n", args["n"], 1), parse_int("seed", args["seed"], 0)
    if str(args["compile"]).lower() not in ("true", "false"):
        raise DpgenError(f"compile={args['compile']!r} is invalid; expected true or false")
    gen = load_generator(Path(args["run"]) / "generator.pt", resolve_device(args["device"]))
    labels = None
    if args["labels"] is not None:
        values = [parse_int("labels", v, 0) for v in str(args["labels"]).split(",")]
        labels = torch.tensor(values * n if len(values) == 1 else values)
        if len(labels) != n or labels.min() < 0 or labels.max() >= gen.num_classes:
            raise DpgenError(f"labels must be one value or {n} values in 0..{gen.num_classes - 1}")
    with compiling(str(args["compile"]).lower() == "true"):
        x, y = gen.sample(n, labels=labels, seed=seed)
    x_out = x.numpy().astype(np.float32) if len(gen.sample_shape) == 1 else to_uint8(x)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.stem}.tmp.npz")
    np.savez_compressed(tmp, x=x_out, y=y.numpy().astype(np.int64))
    tmp.replace(out)
    print(f"wrote {n} samples to {out}")


def cli(argv: list[str] | None = None) -> None:
    """The command line: ``main`` with one-line errors and exit code 2 (tests call this in-process)."""
    with user_errors():
        main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    cli()
