"""DP-SGD micro-batches sized from device memory (``feta.micro_batch: null``).

A micro-batch of m records with K diffusion draws each holds, under torch.func's vmap(grad), the activations of
m·K rows for the backward pass and m per-record gradients (one parameter vector each; K-averaged inside
the record's loss before they exist, DPDM's noise multiplicity). :func:`record_footprint` estimates those bytes
per record on the meta device (no memory, no compute: one forward of a meta copy of the network, summing its
modules' outputs), :func:`auto_micro_batch` divides a fraction of the device's free memory by it with a
margin. The result is a power of two (a compiled bucket, :mod:`dpgen.core.compile`) capped by the largest useful
micro-batch (the expected Poisson batch, rounded up to a power of two).

On CUDA with the training step at hand, :func:`measured_footprint` replaces the estimate: the step runs on 2 and
then 6 records of zeros (public inputs, a throw-away generator: no record and no secret stream is touched) and the
growth of the peak allocated memory per record is the footprint, whatever the backend (ghost norms with or without
unfolded patches, torch.func) and the precision; the micro-batch then takes :data:`MEASURED_FRACTION` of the free
memory with :data:`MEASURED_MARGIN`. The estimate undercounts the paper UNet's step at K = 32 two to six times,
by backend (bench/feta_footprint.py on a CPU, docs/performance.md).

The micro-batch only splits the work: the clipped sum over a Poisson batch is the same whatever the split, so
its size is not a privacy parameter.
"""
from __future__ import annotations

import copy
import os
from typing import Any, Callable

import torch
from torch import nn

__all__ = ["record_footprint", "measured_footprint", "free_memory", "auto_micro_batch", "CudaMemory"]

#: the estimate is multiplied by this (autograd saves some ops' inputs as well as outputs, and temporaries)
MARGIN = 3.0
#: the share of the free memory the micro-batch may use (the rest: the model, optimizer, data, fragmentation)
FRACTION = 0.5


def record_footprint(module: nn.Module, example: Callable[[torch.device], tuple], rows: int) -> int:
    """Estimated bytes one record occupies in a vmap(grad) micro-batch: ``rows`` forward rows (K draws) times
    the bytes of every module output of a one-row forward, plus two parameter-sized vectors (its gradient and
    its clipped copy). ``example(device)`` returns the forward's arguments for ONE row on ``device``; the
    forward runs on the meta device (shapes only)."""
    meta = copy.deepcopy(module).to("meta")
    total = [0]

    def count(_m, _inp, out) -> None:
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                total[0] += t.numel() * t.element_size()

    hooks = [m.register_forward_hook(count) for m in meta.modules()]
    try:
        with torch.no_grad():
            meta(*example(torch.device("meta")))
    finally:
        for h in hooks:
            h.remove()
    params = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    return int(rows) * total[0] + 2 * params


#: with a measured footprint the margin covers fragmentation only, and the step may take more of the free memory
MEASURED_MARGIN = 1.25
MEASURED_FRACTION = 0.8
#: the probe's record counts: a warm-up run (one-time allocations: cuBLAS workspaces, cuDNN plans), then the two
#: runs whose peaks give the slope
PROBE_SIZES = (2, 2, 6)


class CudaMemory:
    """The allocator statistics :func:`measured_footprint` reads (CUDA's; tests pass a fake)."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)

    def start(self) -> int:
        """Synchronise, free the cache, reset the peak; the bytes allocated now."""
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        return int(torch.cuda.memory_allocated(self.device))

    def peak(self) -> int:
        """Synchronise; the peak bytes allocated since :meth:`start`."""
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device))


def measured_footprint(run: Callable[[int], Any], memory: Any) -> int:
    """Bytes per record of ``run(m)`` (one micro-batch step of m records): the peak's growth from
    :data:`PROBE_SIZES`' second to its third record count, per record, after a warm-up run; at least 1.
    ``memory``: :class:`CudaMemory` (or a fake with ``start()`` and ``peak()``)."""
    growth = []
    for i, m in enumerate(PROBE_SIZES):
        before = memory.start()
        run(m)
        if i:
            growth.append(memory.peak() - before)
    return max(1, (growth[1] - growth[0]) // (PROBE_SIZES[2] - PROBE_SIZES[1]))


def free_memory(device: torch.device) -> int:
    """Bytes free on ``device``: CUDA's ``mem_get_info``; on a CPU the available physical memory."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # no sysconf (not Linux): a conservative 4 GiB
        return 4 * 2**30


def auto_micro_batch(footprint: int, device: torch.device, cap: int, free: int | None = None,
                     margin: float = MARGIN, fraction: float = FRACTION) -> int:
    """Records per micro-batch: the largest power of two m <= ``cap`` (rounded up to a power of two) with
    m·``margin``·``footprint`` <= ``fraction``·free memory (``free``: measured by :func:`free_memory` when None);
    at least 1."""
    free = free_memory(device) if free is None else int(free)
    fit = int(fraction * free // max(1.0, margin * footprint))
    top = 1 << max(0, int(cap) - 1).bit_length()
    m = 1
    while m * 2 <= min(fit, top):
        m *= 2
    return m
