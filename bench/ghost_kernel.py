"""Time one convolution's per-record gradients on a CPU, each way the ghost clipper can take them, beside oneDNN's
weight gradient of the whole batch (the non-private step's product, the same multiply-adds).

Layers: dpgan's D at a width (default 32, the quick profile's; 64 is the paper's) on 28×28 inputs, ``--batch``
rows. Ways, interleaved rep by rep in this process, thread CPU time, median:
  kernel    dpgen's CPU kernel (dpgen/privacy/ghost_kernel.cpp): per-record gradients and squared norms
  patches   the unfolded patches and a batched product, then the norms (ghost.py's PATCHES, with its buffers)
  grouped   a convolution with one group per record, then the norms (ghost.py's GROUPED)
  wgrad     oneDNN's weight gradient of the batch (no per-record gradient: the non-private step's share)

    OMP_NUM_THREADS=1 python bench/ghost_kernel.py [--batch 64] [--width 32] [--reps 40]
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from dpgen.privacy import ghost, ghost_kernel


def ways(conv: nn.Conv2d, x: torch.Tensor, gz: torch.Tensor) -> dict:
    """One callable per way for a batch of ``x.shape[0]`` records of one row each."""
    b = x.shape[0]
    scratch: dict = {}

    def buffer(role, shape):
        if role not in scratch or scratch[role].shape != torch.Size(shape):
            scratch[role] = torch.zeros(shape)
        return scratch[role]

    op = -(-conv.out_channels // 16) * 16
    grads, sq = torch.zeros(b, conv.weight[0].numel(), op), torch.zeros(b)

    def kernel():
        ghost_kernel.conv_record_grads(x, gz, grads, sq, 1, conv.kernel_size, conv.stride, conv.padding,
                                       conv.dilation)

    def patches():
        a = ghost._conv_patches(conv, x, b, buffer)
        pg = ghost._bmm(gz.flatten(2), a.transpose(1, 2), buffer)
        return pg.flatten(1).square().sum(1)

    def grouped():
        return ghost._conv_record_grads(conv, x, gz, b).flatten(1).square().sum(1)

    def wgrad():
        return torch.ops.aten.convolution_backward(gz, x, conv.weight, None, conv.stride, conv.padding,
                                                   conv.dilation, False, [0, 0], 1, [False, True, False])[1]

    out = {"kernel": kernel} if ghost_kernel.available() else {}
    return {**out, "patches": patches, "grouped": grouped, "wgrad": wgrad}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--reps", type=int, default=40)
    a = ap.parse_args()
    torch.manual_seed(0)
    shapes, (c, size, w) = [], (1, 28, a.width)
    while size > 4:  # dpgen.nets.dcgan.ProjectionDiscriminator's convolutions
        shapes.append((c, w, size))
        c, size, w = w, (size - 1) // 2 + 1, min(w * 2, 2 * a.width)
    print(f"batch {a.batch}, width {a.width}, {a.reps} reps, thread CPU time in ms (median); GFLOP/s of the kernel")
    for cin, cout, size in shapes:
        conv = nn.Conv2d(cin, cout, 3, 2, 1)
        out = (size - 1) // 2 + 1
        x, gz = torch.randn(a.batch, cin, size, size), torch.randn(a.batch, cout, out, out)
        fns = ways(conv, x, gz)
        times = {k: [] for k in fns}
        for _ in range(a.reps):
            for k, fn in fns.items():
                t = time.thread_time()
                fn()
                times[k].append(time.thread_time() - t)
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        flop = 2 * a.batch * out * out * cin * 9 * cout
        rate = f", kernel {flop / med['kernel'] / 1e9:.0f} GFLOP/s" if "kernel" in med else ""
        print(f"  {cin:3d} -> {cout:3d} ({out * out} positions): "
              + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in med.items()) + rate)


if __name__ == "__main__":
    main()
