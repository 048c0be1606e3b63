"""K networks of one architecture as stacked parameters, each member with its own Adam state.

The ensembles of the partition-based methods (GS-WGAN/DPAC/EFSGD discriminators and classifier, G-PATE teachers)
all hold K networks trained on K disjoint partitions. Their parameters live in one tensor per parameter name with
a leading member axis ``[K_local, ...]``, so a step of many members is one batched computation (``vmap`` or
grouped convolutions) rather than a loop over networks. Their privacy arguments (one sampled partition per
GS-WGAN iteration; PATE's per-teacher vote) need member i's state to depend on partition i alone, so everything
here is per member and row-wise: Adam's moments and step count are rows of the same stacked layout, and an
update touches only the rows it is given (tests/test_ensemble.py trains on two datasets that differ in one record
and checks every other member bit for bit).

Two update paths, for the two ways members are stepped:

* :meth:`MemberStack.adam_rows_` -- any set of members given as a device index tensor (the sampled discriminator
  of a GS-WGAN iteration), each with its own step count, gathered and scattered without a host sync;
* :meth:`MemberStack.adam_block_` -- a contiguous block of members that always step together (G-PATE teachers,
  a pre-training chunk): torch's fused Adam on views of the block, one kernel per parameter group.

Both are Adam (Kingma & Ba 2015, Alg. 1) element-wise, so a stack of K members equals K separate optimisers.

Sharding (issue 25): a stack may hold only the rows ``members`` of the K (a :meth:`Dist.shard` of them); member
indices in this API are GLOBAL. :meth:`state_dict` then gathers every rank's rows to rank 0, so a checkpoint does
not depend on the number of ranks.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch.optim.adam import adam as torch_adam

from dpgen.core.dist import SINGLE, Dist

Params = dict[str, torch.Tensor]


class MemberStack:
    """Stacked parameters ``params`` (trained), per-member ``buffers`` (not trained, e.g. spectral-norm vectors)
    and one Adam state per member (moments ``m``/``v``, step count ``t``), for members ``members`` of ``n``.

    ``params``/``buffers``: tensors with leading dim ``len(members)``, already on their device.
    """

    def __init__(self, params: Params, buffers: Params | None = None, n: int | None = None,
                 members: range | None = None, dist: Dist = SINGLE) -> None:
        local = next(iter(params.values())).shape[0]
        self.n = local if n is None else int(n)
        self.members = range(self.n) if members is None else members
        if len(self.members) != local:
            raise ValueError(f"{local} stacked rows for members {self.members}")
        self.dist = dist
        self.params: Params = params
        self.buffers: Params = {} if buffers is None else buffers
        self.m: Params = {k: torch.zeros_like(v) for k, v in params.items()}
        self.v: Params = {k: torch.zeros_like(v) for k, v in params.items()}
        self.t = torch.zeros(local, dtype=torch.long, device=self.device)
        self._block_t: dict[int, int] = {}  # host step count of each lockstep block, read from t once
        self._block_steps: dict[int, list[torch.Tensor]] = {}

    # ---- layout -----------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(iter(self.params.values())).device

    @property
    def offset(self) -> int:
        """Global index of this process's first row."""
        return self.members.start

    def __len__(self) -> int:
        """Members held by this process."""
        return len(self.members)

    @property
    def num_params(self) -> int:
        return sum(v.numel() for v in self.params.values())

    def gather(self, idx: torch.Tensor) -> tuple[Params, Params]:
        """Rows ``idx`` (local indices, a device tensor) of the parameters and buffers (copies)."""
        return ({n: t[idx] for n, t in self.params.items()}, {n: t[idx] for n, t in self.buffers.items()})

    def member(self, k: int | torch.Tensor) -> tuple[Params, Params]:
        """Detached copies of one member's parameters and buffers. ``k`` (local) may be a one-element device
        tensor: indexing by it keeps a training loop free of host syncs."""
        idx = torch.as_tensor(k, device=self.device).reshape(1)
        return ({n: t.index_select(0, idx)[0].detach() for n, t in self.params.items()},
                {n: t.index_select(0, idx)[0] for n, t in self.buffers.items()})

    def block(self, a: int, b: int, grad: bool = False) -> Params:
        """Views of global members a..b-1's parameters (``grad``: detached leaves that require grad)."""
        a, b = a - self.offset, b - self.offset
        return {k: (v[a:b].detach().requires_grad_(True) if grad else v[a:b]) for k, v in self.params.items()}

    def blocks(self, size: int) -> Iterable[tuple[int, int]]:
        """Global (a, b) of this process's members in blocks of at most ``size``."""
        lo, hi = self.members.start, self.members.stop
        for a in range(lo, hi, max(1, int(size))):
            yield a, min(a + max(1, int(size)), hi)

    # ---- Adam -------------------------------------------------------------------------
    @torch.no_grad()
    def adam_rows_(self, idx: torch.Tensor, grads: Params, lr: float, betas: tuple[float, float],
                   eps: float = 1e-8) -> None:
        """Adam on rows ``idx`` (local, a device tensor) only, each with its own step count (no host sync)."""
        b1, b2 = betas
        t = self.t[idx] + 1
        self.t[idx] = t
        for n, g in grads.items():
            shape = (-1,) + (1,) * (g.dim() - 1)
            m = self.m[n][idx].mul(b1).add_(g, alpha=1 - b1)
            v = self.v[n][idx].mul(b2).addcmul_(g, g, value=1 - b2)
            c1 = (1 - b1 ** t.to(g.dtype)).reshape(shape)
            c2 = (1 - b2 ** t.to(g.dtype)).reshape(shape)
            self.m[n][idx], self.v[n][idx] = m, v
            self.params[n][idx] = self.params[n][idx] - lr * (m / c1) / ((v / c2).sqrt() + eps)

    @torch.no_grad()
    def adam_block_(self, a: int, b: int, grads: list[torch.Tensor], lr: float, betas: tuple[float, float],
                    eps: float = 1e-8) -> None:
        """torch's fused Adam on global members a..b-1, in place, for blocks whose members always step together
        (``grads`` in the order of ``params``). The block's step count is kept on the host (no sync); ``t``
        records it per member too, so checkpoints have one layout."""
        keys = list(self.params)
        la, lb = a - self.offset, b - self.offset
        step = self._block_t.get(la)
        if step is None:  # first step of this block (or after a load): read its count once
            step = int(self.t[la]) if lb > la else 0
        self._block_t[la] = step + 1
        steps = self._block_steps.get(la)
        if steps is None:
            steps = self._block_steps[la] = [torch.zeros((), device=self.device) for _ in keys]
        for s in steps:
            s.fill_(step)  # adam() increments them
        self.t[la:lb] += 1
        # contiguous: torch 2.15's fused CPU Adam silently misreads non-contiguous gradients (e.g. the
        # transposed weight gradients of a bmm), stepping the wrong elements
        grads = [g.contiguous() for g in grads]
        torch_adam([self.params[k][la:lb] for k in keys], grads, [self.m[k][la:lb] for k in keys],
                   [self.v[k][la:lb] for k in keys], [], steps, fused=True, amsgrad=False, beta1=betas[0],
                   beta2=betas[1], lr=lr, weight_decay=0.0, eps=eps, maximize=False)

    # ---- checkpoints ------------------------------------------------------------------
    _STATE = ("params", "buffers", "m", "v")

    def state_dict(self) -> dict:
        """All n members' state as one process would hold it. A sharded stack gathers to rank 0 (a collective:
        every rank calls it; the others get an empty dict)."""
        sharded = self.dist.active and len(self.members) < self.n
        if not sharded:
            return {**{name: getattr(self, name) for name in self._STATE}, "t": self.t}
        out = {name: {k: self.dist.gather_rows(v, self.n) for k, v in getattr(self, name).items()}
               for name in self._STATE}
        out["t"] = self.dist.gather_rows(self.t, self.n)
        return out if self.dist.main else {}

    def load_state_dict(self, d: dict) -> None:
        """Restore :meth:`state_dict` (all n members, any device) onto this stack's device, keeping its rows."""
        lo, hi = self.members.start, self.members.stop
        dev = self.device
        # checkpoints written before the shared layout: NetStack's buffers were "u", G-PATE's step count one int
        d = {**d, "buffers": d.get("buffers", d.get("u", {}))}
        if not isinstance(d["t"], torch.Tensor):
            d["t"] = torch.full((self.n,), int(d["t"]), dtype=torch.long)
        for name in self._STATE:
            setattr(self, name, {k: v[lo:hi].to(dev).clone() for k, v in d[name].items()})
        self.t = d["t"][lo:hi].to(dev).clone()
        self._block_t, self._block_steps = {}, {}
