"""Per-record gradients with torch.func (vmap of grad over a functional call of the module).

The alternative backend to opacus' GradSampleModule hooks. bench/dpsgd_overhead.py measures both side
by side; methods pick the faster one per network (docs/performance.md).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.func import functional_call, grad, vmap


def per_record_grads(module: nn.Module, record_loss: Callable[..., torch.Tensor],
                     batch: tuple[torch.Tensor, ...]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """∇_θ record_loss(call, *record) for every record (dim 0 of each tensor in ``batch``).

    ``record_loss(call, *record)`` gets ``call(*args)`` = the module's forward with the current
    parameters and one record's slices (each record may hold several rows, e.g. K noise draws), and
    returns a scalar. Returns the per-record gradients of the trainable parameters, in
    ``module.parameters()`` order, each of shape (records, *param.shape), and the per-record losses.

    Under ``precision=bf16`` the forward and backward run in bf16 where autocast lowers them; the gradients
    are returned in the parameters' dtype (fp32), the dtype the clipping that follows needs.
    """
    names = [n for n, p in module.named_parameters() if p.requires_grad]
    train = {n: p.detach() for n, p in module.named_parameters() if p.requires_grad}
    frozen = {n: p.detach() for n, p in module.named_parameters() if not p.requires_grad}
    buffers = dict(module.named_buffers())

    def loss_of(params: dict, *record: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def call(*args):
            return functional_call(module, ({**params, **frozen}, buffers), args)
        loss = record_loss(call, *record)
        return loss, loss.detach()

    grads, losses = vmap(grad(loss_of, has_aux=True), in_dims=(None,) + (0,) * len(batch))(train, *batch)
    return [grads[n].to(train[n].dtype) for n in names], losses


def pad_rows(batch: tuple[torch.Tensor, ...], size: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """``batch`` (records on dim 0 of every tensor) padded to ``size`` rows, and the rows' weights (fp32).

    The real rows come first with weight 1; the padding repeats the first record with weight 0 (a real record's
    values, so its gradient is finite and weight 0 zeroes it exactly; zeros could give a non-finite loss, e.g.
    log σ = log 0). ``size`` must be >= the number of rows: a record is never dropped to fit a shape.
    Without padding (``size`` = rows) the tensors are returned as they are.
    """
    m = batch[0].shape[0]
    if size < m:
        raise ValueError(f"cannot pad {m} records to {size} rows: a bucket is never smaller than its batch")
    dev = batch[0].device
    weight = torch.cat([torch.ones(m, device=dev), torch.zeros(size - m, device=dev)])
    if size == m:
        return tuple(batch), weight
    fill = torch.zeros(size - m, dtype=torch.long, device=dev)  # index of the first record, size - m times
    return tuple(torch.cat([t, t[fill]]) for t in batch), weight
