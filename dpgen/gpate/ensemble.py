"""The teacher ensemble as ONE batched model (stacked parameters, grouped convolutions).

All n teachers share one architecture; their parameters are stacked along a new leading axis
(``torch.func.stack_module_state``).  Teacher classes with a ``stacked_forward`` (both of
:mod:`dpgen.gpate.nets`) evaluate all teachers with grouped convolutions and batched matmuls;
any other module falls back to ``vmap(functional_call(...))``, which on CPU is much slower
(vmap's conv2d batching rule; bench/gpate_ensemble.py measured it at 0.7x a Python loop).
To bound memory (4000 teachers on one GPU, or a 2-core CPU) the teacher axis is processed in
chunks of ``chunk`` teachers: a loop over chunks, never over teachers.  Adam is elementwise, so
one Adam over the stacked tensors equals n independent Adams (official: lr 1e-3, β1 0.5).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from dpgen.data.partition import record_owners


class TeacherEnsemble:
    """n teachers of ``make_teacher()``'s architecture, trained non-privately on disjoint partitions."""

    def __init__(self, make_teacher: Callable[[], nn.Module], n: int, device: torch.device, chunk: int | None = None,
                 lr: float = 1e-3, betas: tuple[float, float] = (0.5, 0.999), seed: int = 0) -> None:
        self.n = int(n)
        self.chunk = self.n if not chunk else max(1, min(int(chunk), self.n))
        torch.manual_seed(seed)  # teacher initialisation only; independent of the data
        self.base = make_teacher().to("meta")
        build = [make_teacher() for _ in range(min(self.n, 64))]
        # Initialise in groups of 64 modules to avoid holding n python modules at once.
        params: dict[str, list[torch.Tensor]] = {}
        done = 0
        while done < self.n:
            group = build if done == 0 else [make_teacher() for _ in range(min(64, self.n - done))]
            group = group[: self.n - done]
            p, _ = stack_module_state(group)
            for k, v in p.items():
                params.setdefault(k, []).append(v.detach())
            done += len(group)
        self.params = {k: torch.cat(v).to(device) for k, v in params.items()}
        self.lr, self.betas, self.adam_t = float(lr), tuple(betas), 0
        self.use_stacked = True  # False forces the vmap path (benchmark / tests)
        self.m = {k: torch.zeros_like(v) for k, v in self.params.items()}
        self.v = {k: torch.zeros_like(v) for k, v in self.params.items()}

    # ---- functional forward -----------------------------------------------------------
    def _forward_one(self, p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return functional_call(self.base, p, (x, y))

    def forward(self, p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, shared_input: bool) -> torch.Tensor:
        """Logits (n_chunk, b) of a chunk of teachers; x (b, ...) shared by all, or (n_chunk, b, ...) per teacher."""
        stacked = getattr(self.base, "stacked_forward", None) if self.use_stacked else None
        if stacked is not None:  # the base lives on "meta": only its hyper-parameters (K, eps) are read
            return stacked(p, x, y, shared_input)
        dims = (0, None, None) if shared_input else (0, 0, 0)
        return vmap(self._forward_one, in_dims=dims)(p, x, y)

    def _chunks(self):
        for a in range(0, self.n, self.chunk):
            yield a, min(a + self.chunk, self.n)

    def _slice(self, a: int, b: int, grad: bool) -> dict[str, torch.Tensor]:
        return {k: (v[a:b].detach().requires_grad_(True) if grad else v[a:b]) for k, v in self.params.items()}

    # ---- training ---------------------------------------------------------------------
    def train_step(self, x_real: torch.Tensor, y_real: torch.Tensor, w_real: torch.Tensor, x_fake: torch.Tensor,
                   y_fake: torch.Tensor) -> float:
        """One Adam step of every teacher: BCE(D_i(real_i), 1) + BCE(D_i(fake), 0) (Alg. 1 line 10).

        ``x_real`` (n, b, ...) holds teacher i's own batch (from its partition S_i); ``w_real`` (n, b)
        masks rows (0 for a teacher with an empty partition). The fake batch is shared.
        """
        self.adam_t += 1
        total = 0.0
        for a, b in self._chunks():
            p = self._slice(a, b, grad=True)
            lr_ = self.forward(p, x_real[a:b], y_real[a:b], shared_input=False)
            lf = self.forward(p, x_fake, y_fake, shared_input=True)
            w = w_real[a:b]
            loss_r = (F.binary_cross_entropy_with_logits(lr_, torch.ones_like(lr_), reduction="none") * w).sum(1) \
                / w.sum(1).clamp_min(1.0)
            loss_f = F.binary_cross_entropy_with_logits(lf, torch.zeros_like(lf), reduction="none").mean(1)
            loss = loss_r + loss_f  # (n_chunk,): teacher i's loss depends on its own parameters only
            grads = torch.autograd.grad(loss.sum(), list(p.values()))
            self._adam(a, b, dict(zip(p.keys(), grads)))
            total += float(loss.detach().sum())
        return total / self.n

    @torch.no_grad()
    def _adam(self, a: int, b: int, grads: dict[str, torch.Tensor]) -> None:
        b1, b2 = self.betas
        c1, c2 = 1 - b1 ** self.adam_t, 1 - b2 ** self.adam_t
        for k, g in grads.items():
            m, v = self.m[k][a:b], self.v[k][a:b]
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            self.params[k][a:b].addcdiv_(m / c1, (v / c2).sqrt_().add_(1e-8), value=-self.lr)

    # ---- votes ------------------------------------------------------------------------
    def input_grads_chunks(self, x: torch.Tensor, y: torch.Tensor):
        """Yield (a, b, Δx) with Δx (b-a, m, ...) = -∂L_G/∂x of teachers a..b-1 for each fake x (Eq. 1).

        L_G = Σ_j BCE(D_i(x_j), 1) (summed, so each sample gets its own gradient scale): the direction
        in which teacher i thinks x_j becomes more realistic (official: -∂g_loss/∂fake).
        """
        for a, b in self._chunks():
            p = self._slice(a, b, grad=False)
            xr = x.detach().unsqueeze(0).expand(b - a, *x.shape).clone().requires_grad_(True)
            logits = self.forward(p, xr, y.unsqueeze(0).expand(b - a, -1), shared_input=False)
            loss = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits), reduction="sum")
            (g,) = torch.autograd.grad(loss, xr)
            yield a, b, -g

    # ---- reference loop (tests and benchmark only) -------------------------------------
    def teacher_params(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.params.items()}

    def state_dict(self) -> dict:
        return {"params": self.params, "m": self.m, "v": self.v, "t": self.adam_t}

    def load_state_dict(self, d: dict) -> None:
        for name in ("params", "m", "v"):
            for k, v in d[name].items():
                getattr(self, name)[k].copy_(v)
        self.adam_t = int(d["t"])

    @property
    def num_params(self) -> int:
        return sum(v.numel() for v in self.params.values())


def assign_teachers(x: torch.Tensor | "object", n_teachers: int, seed: int) -> torch.Tensor:
    """Teacher index of every record (see :func:`dpgen.data.partition.record_owners`)."""
    return torch.from_numpy(record_owners(np.asarray(x), n_teachers, seed))


class PartitionSampler:
    """Draws, for every teacher at once, a batch of b records from its own partition (with replacement)."""

    def __init__(self, owner: torch.Tensor, n_teachers: int, device: torch.device) -> None:
        order = torch.argsort(owner, stable=True)
        self.order = order.to(device)
        sizes = torch.bincount(owner, minlength=n_teachers)
        self.sizes = sizes.to(device)
        self.offsets = (torch.cumsum(sizes, 0) - sizes).to(device)
        self.n_empty = int((sizes == 0).sum())

    def sample(self, b: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(indices (n, b) into the training set, weights (n, b): 0 where the partition is empty)."""
        n = len(self.sizes)
        u = torch.rand(n, b, generator=generator, device=self.sizes.device)
        local = (u * self.sizes[:, None].clamp_min(1)).long().clamp_max((self.sizes[:, None] - 1).clamp_min(0))
        idx = self.order[(self.offsets[:, None] + local).clamp_max(len(self.order) - 1)]
        w = (self.sizes[:, None] > 0).float().expand(n, b)
        return idx, w


def balanced_chunk(n: int, requested: int | None) -> int:
    """Chunk size that splits n teachers into equal-ish chunks no larger than ``requested``."""
    if not requested or requested >= n:
        return n
    k = math.ceil(n / int(requested))
    return math.ceil(n / k)
