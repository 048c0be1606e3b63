"""The teacher ensemble as ONE batched model (stacked parameters, grouped convolutions).

All n teachers share one architecture; their parameters are stacked along a new leading axis.
Teacher classes with a ``stacked_forward`` (both of :mod:`dpgen.gpate.nets`) evaluate all teachers
with grouped convolutions and batched matmuls; any other module falls back to
``vmap(functional_call(...))``, which on CPU is much slower (vmap's conv2d batching rule;
bench/gpate_ensemble.py measured it at 0.7x a Python loop).  To bound memory (thousands of teachers on
one GPU, or a 2-core CPU) the teacher axis is processed in chunks of ``chunk`` teachers: a loop over
chunks, never over teachers.  The stacked parameters are allocated and initialised in place directly on
the target device (no CPU copy of the ensemble, no temporaries).  Adam is elementwise, so one Adam over the
stacked tensors equals n independent Adams (official: lr 1e-3, β1 0.5); it runs as torch's
fused Adam over each chunk's slices.  ``compile=true`` compiles a chunk's loss (:meth:`TeacherEnsemble.chunk_loss`,
forward and backward) and ``ensemble.conv=batched`` runs the grouped convolutions as unfold + matmul
(:mod:`dpgen.ensemble.compute`); under ``precision=bf16`` autocast reaches the grouped convolutions (no vmap here),
and the losses and the image gradients handed to the aggregation are fp32.
"""
from __future__ import annotations

import math
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from dpgen.core.dist import SINGLE, Dist
from dpgen.data.partition import record_owners
from dpgen.ensemble import MemberStack
from dpgen.ensemble.compute import compiled, teacher_forward
from dpgen.privacy.randomness import derive_seed

#: (x_real, y_real, w_real, x_fake, y_fake) of a chunk of teachers, see :meth:`TeacherEnsemble.train_step`
TeacherBatch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _init_rule(base: nn.Module, name: str) -> str:
    """How the official code initialises parameter ``name`` (see :func:`dpgen.gpate.nets.dcgan_init_`)."""
    path, leaf = name.rsplit(".", 1)
    mod = base.get_submodule(path)
    if leaf == "bias":
        return "zeros"
    if isinstance(mod, nn.Conv2d):
        return "trunc_normal"
    if isinstance(mod, (nn.Linear, nn.ConvTranspose2d)):
        return "normal"
    return "ones"  # normalisation scales


def ensemble_bytes(params_per_teacher: int, n: int, chunk: int = 0, dtype_bytes: int = 4) -> int:
    """Device memory of n teachers' persistent state (parameters and Adam's two moments) plus the gradients
    of one chunk of ``chunk`` teachers (they live only during that chunk's step); activations come on top."""
    return (3 * n + chunk) * params_per_teacher * dtype_bytes


class TeacherEnsemble(MemberStack):
    """n teachers of ``make_teacher()``'s architecture, trained non-privately on disjoint partitions: a
    :class:`~dpgen.ensemble.MemberStack` whose members always step together (fused Adam per chunk).

    ``dist``: the run's process group; each rank holds and trains only its :meth:`Dist.shard` of the teachers
    (issue 25), so thousands of large teachers spread over several GPUs. Teacher i's initialisation depends only
    on (``seed``, i), so an ensemble split over W ranks holds exactly the teachers of the unsplit one.
    """

    def __init__(self, make_teacher: Callable[[], nn.Module], n: int, device: torch.device, chunk: int | None = None,
                 lr: float = 1e-3, betas: tuple[float, float] = (0.5, 0.999), seed: int = 0,
                 dist: Dist = SINGLE) -> None:
        members = dist.shard(int(n))  # the global indices of the teachers this process holds
        local = len(members)
        self.chunk = max(local, 1) if not chunk else max(1, min(int(chunk), max(local, 1)))
        self.base = make_teacher().to("meta")  # architecture and hyper-parameters only
        # initialisation only, independent of the data: one public stream per teacher, on the target device
        gen = None if torch.device(device).type == "meta" else torch.Generator(device=device)  # meta: shapes only
        params: dict[str, torch.Tensor] = {}
        for j, (name, p) in enumerate(self.base.named_parameters()):
            # allocated on the device and filled in place (torch's init functions need no temporaries)
            full = torch.empty((local, *p.shape), device=device)
            rule = _init_rule(self.base, name)
            for row, i in enumerate(members):
                if gen is not None and rule in ("trunc_normal", "normal"):
                    gen.manual_seed(derive_seed(int(seed), f"gpate.teacher.{i}.{j}"))
                if rule == "trunc_normal":
                    nn.init.trunc_normal_(full[row], 0.0, 0.02, -0.04, 0.04, generator=gen)
                elif rule == "normal":
                    full[row].normal_(0.0, 0.02, generator=gen)
            if rule in ("zeros", "ones"):
                full.fill_(0.0 if rule == "zeros" else 1.0)
            params[name] = full
        super().__init__(params, n=int(n), members=members, dist=dist)
        self.lr, self.betas = float(lr), tuple(betas)
        self.use_stacked = True  # False forces the vmap path (benchmark / tests)

    # ---- functional forward -----------------------------------------------------------
    def _forward_one(self, p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return functional_call(self.base, p, (x, y))

    def forward(self, p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, shared_input: bool) -> torch.Tensor:
        """Logits (n_chunk, b) of a chunk of teachers; x (b, ...) shared by all, or (n_chunk, b, ...) per teacher."""
        stacked = getattr(self.base, "stacked_forward", None) if self.use_stacked else None
        if stacked is not None:  # the base lives on "meta": only its hyper-parameters (K, norm, eps) are read
            return stacked(p, x, y, shared_input)
        dims = (0, None, None) if shared_input else (0, 0, 0)
        return vmap(self._forward_one, in_dims=dims)(p, x, y)

    # ---- training ---------------------------------------------------------------------
    def train_step(self, batch: "Callable[[int, int], TeacherBatch]") -> torch.Tensor:
        """One Adam step of every teacher: BCE(D_i(real_i), 1) + BCE(D_i(fake_i), 0) (Alg. 1 line 10).

        ``batch(a, b)`` gives teachers a..b-1's batch (built per chunk, so the n teachers' real and fake
        images never exist at once): x_real (b-a, m, ...) from each teacher's own partition S_i, its
        labels, w_real (b-a, m) masking rows (0 for a teacher with an empty partition), and the fakes,
        per teacher x_fake (b-a, m', ...) with labels (b-a, m') (official: teacher i's fakes carry its
        real batch's labels), or one batch (m', ...) shared by all.  See :meth:`fixed_batch`.
        Returns this process's share of the mean teacher loss (sum over its teachers / n) as a device tensor (no
        host sync); the ranks' shares add up to the mean.
        """
        total = torch.zeros((), device=self.device)
        for a, b in self.blocks(self.chunk):
            x_real, y_real, w, x_fake, y_fake = batch(a, b)
            p = self.block(a, b, grad=True)
            with teacher_forward():  # ensemble.conv; compile=true: the loss and its backward compiled
                loss = compiled(self.chunk_loss)(p, x_real, y_real, w, x_fake, y_fake)
                grads = torch.autograd.grad(loss.sum(), list(p.values()))
            self.adam_block_(a, b, list(grads), self.lr, self.betas)  # torch's fused Adam: one kernel per group
            total = total + loss.detach().sum()
        return total / self.n

    def chunk_loss(self, p: dict[str, torch.Tensor], x_real: torch.Tensor, y_real: torch.Tensor, w: torch.Tensor,
                   x_fake: torch.Tensor, y_fake: torch.Tensor) -> torch.Tensor:
        """(n_chunk,) losses BCE(D_i(real_i), 1) + BCE(D_i(fake_i), 0) of a chunk (see :meth:`train_step`);
        teacher i's loss depends on its own parameters only. Fp32 whatever the forward's dtype."""
        shared = x_fake.dim() == x_real.dim() - 1
        lr_ = self.forward(p, x_real, y_real, shared_input=False).float()
        lf = self.forward(p, x_fake, y_fake, shared_input=shared).float()
        loss_r = (F.binary_cross_entropy_with_logits(lr_, torch.ones_like(lr_), reduction="none") * w).sum(1) \
            / w.sum(1).clamp_min(1.0)
        loss_f = F.binary_cross_entropy_with_logits(lf, torch.zeros_like(lf), reduction="none").mean(1)
        return loss_r + loss_f

    @staticmethod
    def fixed_batch(x_real: torch.Tensor, y_real: torch.Tensor, w_real: torch.Tensor, x_fake: torch.Tensor,
                    y_fake: torch.Tensor) -> "Callable[[int, int], TeacherBatch]":
        """A :meth:`train_step` batch from full tensors (x_real (n, m, ...); fakes per teacher or shared)."""
        shared = x_fake.dim() == x_real.dim() - 1

        def batch(a: int, b: int) -> TeacherBatch:
            return (x_real[a:b], y_real[a:b], w_real[a:b], x_fake if shared else x_fake[a:b],
                    y_fake if shared else y_fake[a:b])
        return batch

    # ---- votes ------------------------------------------------------------------------
    def input_grads_chunks(self, x: torch.Tensor, y: torch.Tensor) -> Iterator[tuple[int, int, torch.Tensor]]:
        """Yield (a, b, Δx) with Δx (b-a, m, ...) = -∂L_G/∂x of teachers a..b-1 for each fake x (Eq. 1).

        L_G = mean_j BCE(D_i(x_j), 1), as the official ``img_grads = -∂g_loss/∂G`` with ``g_loss`` a
        reduce_mean over the batch: the direction in which teacher i thinks x_j becomes more realistic,
        at the official scale (which the clipping constant c is tuned to).
        """
        m = x.shape[0]
        for a, b in self.blocks(self.chunk):
            p = self.block(a, b)
            xr = x.detach().unsqueeze(0).expand(b - a, *x.shape).clone().requires_grad_(True)
            with teacher_forward():
                logits = self.forward(p, xr, y.unsqueeze(0).expand(b - a, -1), shared_input=False).float()
                loss = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits), reduction="sum") / m
                (g,) = torch.autograd.grad(loss, xr)
            yield a, b, -g.float()  # the votes' inputs: fp32 whatever the forward's dtype

    # ---- reference loop (tests and benchmark only) -------------------------------------
    def teacher_params(self, i: int) -> dict[str, torch.Tensor]:
        """Teacher i's parameters (i global; this process must hold it)."""
        return {k: v[i - self.offset] for k, v in self.params.items()}


def assign_teachers(x: torch.Tensor | "object", n_teachers: int, seed: int) -> torch.Tensor:
    """Teacher index of every record (see :func:`dpgen.data.partition.record_owners`)."""
    return torch.from_numpy(record_owners(np.asarray(x), n_teachers, seed))


class PartitionSampler:
    """Every teacher's batch of b records from its own partition, passing over the partition in order.

    As the official code (``batch_idx = range(idx·b, (idx+1)·b)`` over each teacher's slice), batch t of
    teacher i is records t·b .. t·b+b-1 of its partition, wrapping around (partition sizes differ by a
    few records here, so each partition cycles on its own).  Teacher i's indices depend only on its
    own partition (its records keep their dataset order), never on another teacher's.
    """

    def __init__(self, owner: torch.Tensor, n_teachers: int, device: torch.device) -> None:
        order = torch.argsort(owner, stable=True)
        self.order = order.to(device)
        sizes = torch.bincount(owner, minlength=n_teachers)
        self.sizes = sizes.to(device)
        self.offsets = (torch.cumsum(sizes, 0) - sizes).to(device)
        self.n_empty = int((sizes == 0).sum())
        self.position = 0  # batches drawn so far (host int: no device sync)

    def sample(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(indices (n, b) into the training set, -1 where the partition is empty; weights (n, b))."""
        n = len(self.sizes)
        pos = self.position * b + torch.arange(b, device=self.sizes.device)
        self.position += 1
        size = self.sizes[:, None]
        local = pos[None, :] % size.clamp_min(1)
        idx = torch.where(size > 0, self.order[(self.offsets[:, None] + local).clamp_max(len(self.order) - 1)], -1)
        w = (size > 0).to(torch.float32).expand(n, b)
        return idx, w

    @staticmethod
    def gather(values: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """values[idx] with zeros where idx is -1 (an empty partition reads no record at all)."""
        out = values[idx.clamp_min(0)]
        mask = (idx >= 0).view(*idx.shape, *([1] * (out.dim() - idx.dim())))
        return torch.where(mask, out, torch.zeros((), dtype=out.dtype, device=out.device))

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, d: dict) -> None:
        self.position = int(d["position"])


def balanced_chunk(n: int, requested: int | None) -> int:
    """Chunk size that splits n teachers into equal-ish chunks no larger than ``requested``."""
    if not requested or requested >= n:
        return n
    k = math.ceil(n / int(requested))
    return math.ceil(n / k)
