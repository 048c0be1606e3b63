"""K functional networks with spectral-norm vectors as one :class:`MemberStack` (the GS-WGAN discriminators).

A network here is a pure function ``forward(params, u, *inputs)`` of a parameter dict and its spectral-norm
vectors (:mod:`dpgen.nets.spectral`). A training step gathers the selected members' rows, computes every member's
gradient of its OWN loss with ``torch.func.vmap(torch.func.grad(...))`` and applies a per-member Adam update
(:meth:`MemberStack.adam_rows_`), which equals K separate optimisers (tests/test_dpac_ensemble.py checks it against
a per-member loop). The GS-WGAN authors ran one process per discriminator instead (official-code.md §1).

The run's ``precision``, ``compile`` and ``ensemble.conv`` reach the members' step through
:mod:`dpgen.ensemble.compute`: bf16 by explicit casts inside the vmapped loss (fp32 master weights, gradients and
Adam), the gradient function and the Adam update compiled, the convolutions grouped or unfold + bmm.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.func import grad, vmap

from dpgen.core.compile import bucket_size
from dpgen.core.precision import ensemble_compute
from dpgen.ensemble.compute import compiled, member_forward, to_compute
from dpgen.ensemble.stack import MemberStack, Params
from dpgen.nets.spectral import power_iteration

Init = Callable[[torch.Generator], Params]
SNInit = Callable[[Params, torch.Generator], Params]
Forward = Callable[..., torch.Tensor]


class NetStack(MemberStack):
    """K networks ``init(g)`` with spectral-norm vectors ``sn(params, g)`` (kept as the stack's buffers ``u``).

    Every process holds all K members (the GS-WGAN main phase may sample any of them); pre-training splits the work
    over ranks and shares the rows instead (``dpgen.gswgan.train.pretrain``).
    """

    def __init__(self, init: Init, sn: SNInit, k: int, g: torch.Generator, device: torch.device,
                 shared_init: bool = False) -> None:
        """``shared_init``: every member starts from the same random draw (data-independent, so no privacy cost)."""
        members = [init(g)] * k if shared_init else [init(g) for _ in range(k)]
        us = [sn(members[0], g)] * k if shared_init else [sn(m, g) for m in members]
        super().__init__({n: torch.stack([m[n] for m in members]).to(device) for n in members[0]},
                         {n: torch.stack([m[n] for m in us]).to(device) for n in us[0]})

    @property
    def u(self) -> Params:
        """The members' spectral-norm vectors (rows of the stack's buffers)."""
        return self.buffers

    def adam_step(self, members: torch.Tensor, grads: Params, lr: float, betas: tuple[float, float],
                  eps: float = 1e-8) -> None:
        """Adam on rows ``members`` only, each with its own step count (:meth:`MemberStack.adam_rows_`)."""
        self.adam_rows_(members, grads, lr, betas, eps)

    def reset(self, init: Init, sn: SNInit, g: torch.Generator) -> None:
        """Re-initialise every member and its optimiser state (DPAC's per-iteration classifier reset)."""
        fresh = NetStack(init, sn, len(self), g, self.device)
        self.__dict__.update(fresh.__dict__)

    def replicate(self, m: int) -> "NetStack":
        """A new stack of ``m`` copies of member 0: parameters, spectral-norm vectors and Adam state (DPAC's
        per-partition classifiers, which start from one trained template)."""
        rows = {name: {n: t[:1].expand(m, *t.shape[1:]).clone() for n, t in getattr(self, name).items()}
                for name in ("params", "buffers", "m", "v")}
        out = NetStack.__new__(NetStack)
        MemberStack.__init__(out, rows["params"], rows["buffers"])
        out.m, out.v, out.t = rows["m"], rows["v"], self.t[:1].expand(m).clone()
        return out


def _member_grads(loss: Forward, dtype: torch.dtype, p: Params, u: Params,
                  *inputs: torch.Tensor) -> tuple[Params, torch.Tensor]:
    """Every member's gradient of its own loss (``vmap(grad(...))``) and the M losses, computed in ``dtype``:
    weights, vectors and float inputs cast inside the vmapped function, so the gradients w.r.t. the fp32
    master weights come back in fp32 (:mod:`dpgen.ensemble.compute`)."""
    def loss_and_aux(pp, uu, *xs):
        value = loss(to_compute(pp, dtype), to_compute(uu, dtype), *to_compute(xs, dtype)).float()
        return value, value.detach()

    return vmap(grad(loss_and_aux, has_aux=True))(p, u, *inputs)


def functional_step(stack: NetStack, loss: Forward, members: torch.Tensor, *inputs: torch.Tensor,
                    lr: float, betas: tuple[float, float], sampled: bool = False) -> torch.Tensor:
    """One optimiser step of every selected member on its own inputs (leading member dim [M, ...]).

    One power iteration refreshes the members' spectral-norm vectors (as a training forward of torch's
    spectral_norm; fp32, on the master weights); each member's gradient is ``torch.func.grad`` of its own loss,
    batched over members with ``vmap``, in the run's ensemble dtype and convolution layout
    (:func:`dpgen.core.precision.ensemble_compute`); then per-member Adam in fp32. Under ``compile=true`` the
    gradient function and the Adam update run compiled. ``sampled``: the member count is a Poisson sample's, which
    varies from one iteration to the next, and a static graph per count recompiled at nearly every step (118×
    slower at gswgan's quick profile): the gradient function then runs on the members' rows padded to a bucket
    (:func:`dpgen.core.compile.bucket_size`) with copies of the first row, whose outputs are dropped, and Adam runs
    eagerly on the real rows only. Returns the M losses (fp32).
    """
    m = members.shape[0]
    bucketed = sampled and ensemble_compute().compile and m > 0
    pad = bucket_size(m) - m if bucketed else 0
    p, u = stack.gather(members)
    u = vmap(power_iteration)(p, u)
    for n in u:
        stack.u[n][members] = u[n]
    with member_forward() as dtype:
        if bucketed:
            rows = _pad_rows((p, u, inputs), pad)
            grads, losses = compiled(_member_grads)(loss, dtype, rows[0], rows[1], *rows[2])
            grads, losses = {n: g[:m] for n, g in grads.items()}, losses[:m]
        else:
            grads, losses = compiled(_member_grads)(loss, dtype, p, u, *inputs)
    (_adam_rows if bucketed else compiled(_adam_rows))(stack, members, grads, lr, betas)
    return losses


def _pad_rows(tree, pad: int):
    """``tree`` (tensors with a leading member dim, in dicts and tuples) with ``pad`` copies of row 0 appended."""
    if isinstance(tree, torch.Tensor):
        return torch.cat([tree, tree[:1].expand(pad, *tree.shape[1:])])
    if isinstance(tree, dict):
        return {k: _pad_rows(v, pad) for k, v in tree.items()}
    return tuple(_pad_rows(v, pad) for v in tree)


def _adam_rows(stack: NetStack, members: torch.Tensor, grads: Params, lr: float, betas: tuple[float, float]) -> None:
    stack.adam_step(members, grads, lr, betas)


def batched_forward(stack: NetStack, fwd: Forward, members: torch.Tensor, x: torch.Tensor,
                    y: torch.Tensor) -> torch.Tensor:
    """Outputs [M, B] (fp32) of the selected members on their own inputs [M, B, ...]; differentiable w.r.t. x
    only, whose gradient comes back in x's dtype (fp32 for fp32 images) whatever the ensemble dtype."""
    p, u = stack.gather(members)
    p = {n: t.detach() for n, t in p.items()}
    with member_forward() as dtype:
        return vmap(lambda pp, uu, xx, yy: fwd(to_compute(pp, dtype), to_compute(uu, dtype),
                                               to_compute(xx, dtype), yy).float())(p, u, x, y)
