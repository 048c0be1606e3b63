"""Stage II of DP-FETA / DPDM: DP-SGD with noise multiplicity and gradient accumulation (DP-FETA Eq. 9).

One logical step: a Poisson batch (rate q, expected size B*) is processed in micro-batches; each
record is replicated K times with independent diffusion noise, its per-record gradient is the MEAN
of the K per-draw gradients (DPDM's noise multiplicity: averaging happens BEFORE clipping, so one
record still contributes one vector of norm ≤ C and the privacy cost is unchanged), it is clipped
to C, the clipped vectors are summed over all micro-batches, Gaussian noise N(0, σ²C²I) is added
ONCE, and the result is divided by the expected batch size B* (Eq. 9).
Per-record gradient norms and the clipped sum come from ghost norms and book-keeping (``feta.grad_backend=ghost``,
the default: :mod:`dpgen.privacy.ghost`, no per-record gradient of a layer where its norm is cheaper without,
no second backward; the fastest in bench/dpsgd_overhead.py), from torch.func's per-record gradients
(``torch_func``, the one ``compile=true`` compiles) or from opacus' GradSampleModule hooks (``opacus``).

Several processes (:mod:`dpgen.core.dist`, torch.func backend): every rank holds the same Poisson batch (drawn
from a secret stream all ranks share); rank r computes the clipped per-record gradients of the micro-batches
j with j mod W = r, the sums are all-reduced, and every rank adds the SAME noise draw (the shared secret
stream) once to the same total: the noise is added once, as opacus' DistributedDPOptimizer and DPDM do.
"""
from __future__ import annotations

import contextlib
import logging
import warnings
from typing import TYPE_CHECKING, Any, Callable

import torch
from opacus import GradSampleModule

from dpgen.core.compile import bucket_size, maybe_compile
from dpgen.core.dist import SINGLE, Dist
from dpgen.core.graph import CapturedStep
from dpgen.core.precision import autocast_enabled
from dpgen.nets.edm import edm_draws, edm_loss_at
from dpgen.privacy.ghost import GhostClipper, strategy_for
from dpgen.privacy.per_sample import pad_rows, per_record_grads
from dpgen.privacy.randomness import SecretGenerator, gaussian_noise, require_secret

log = logging.getLogger("dpgen")

if TYPE_CHECKING:
    from dpgen.audit.hooks import DpsgdCanaries


def clipped_grad_sum(gsm: GradSampleModule, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                     x: torch.Tensor, y: torch.Tensor, multiplicity: int, clip: float,
                     micro_batch: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Σ_i clip(mean_k ∇ℓ(x_i, draw k), C) over the batch, in micro-batches of ``micro_batch`` records.

    ``loss_fn(x_rep, y_rep)`` returns one loss per row of the K-fold replicated batch
    (``repeat_interleave``: rows i*K..i*K+K−1 belong to record i). Returns the per-parameter sums and
    the mean loss (a 0-d tensor for logging: reading it is left to the caller, so no host sync per micro-batch).
    """
    params = [p for p in gsm.parameters() if p.requires_grad]
    acc = [torch.zeros_like(p) for p in params]
    k = int(multiplicity)
    loss_total, rows = torch.zeros((), device=x.device), 0
    for s in range(0, x.shape[0], max(1, int(micro_batch))):
        xb, yb = x[s:s + micro_batch], y[s:s + micro_batch]
        m = xb.shape[0]
        losses = loss_fn(xb.repeat_interleave(k, 0), yb.repeat_interleave(k, 0))
        # 1/K: the per-row gradient sampled by opacus is then (1/K)∇ℓ_ik, and summing over k averages
        with warnings.catch_warnings():  # opacus' full backward hooks warn when the input needs no grad
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            (losses.sum() / k).backward()
        add_clipped(acc, [p.grad_sample.reshape(m, k, *p.shape).sum(1) for p in params], clip)
        for p in params:
            p.grad_sample = None
            p.grad = None
        loss_total = loss_total + losses.detach().sum()
        rows += losses.shape[0]
    return acc, loss_total / max(rows, 1)


def _record_loss(call, xr, yr, sr, nr):
    """One record's loss: the mean over its K diffusion draws (so the gradient is K-averaged before clipping)."""
    return edm_loss_at(call, xr, yr, sr, nr).mean()


#: the values of ``feta.grad_backend`` (and ``dpgan.grad_backend``, which has no torch_func): how per-record
#: norms and the clipped sum are computed; each computes the same clipped sum within fp32's tolerance
GRAD_BACKENDS = ("ghost", "torch_func", "opacus")


class MicroStep:
    """One micro-batch of :func:`clipped_grad_sum_func`: Σ_i w_i·clip(mean_k ∇ℓ_ik, C) and Σ_i w_i·ℓ_i, the hot
    step ``compile=true`` compiles (:mod:`dpgen.core.compile`).

    Compiled, the micro-batch is padded to a bucket (:func:`bucket_size`, never fewer rows than the micro-batch
    has) with copies of its first record of weight w = 0: a padded row's clipping factor is multiplied by 0, so it adds
    exactly zero to the clipped sum (its gradient is a real record's, hence finite), and the ledger never sees it
    (it counts steps, not rows). Eager, the rows are used as they are (w = 1), as before.

    ``grad_backend``: ``torch_func`` (vmap(grad) per record, compiled under ``compile``) or ``ghost`` (ghost norms
    and book-keeping, :mod:`dpgen.privacy.ghost`; always eager: it takes the layers' output gradients with
    ``torch.autograd.grad``, at which torch.compile breaks the graph).

    ``graph`` (``feta.cuda_graph``): on CUDA the step is captured once as a CUDA graph and replayed for every later
    micro-batch (:class:`dpgen.core.graph.CapturedStep`): every micro-batch is then padded to ``cap`` records (one
    static shape; the remainder's padded rows have weight 0, as a compiled bucket's). The diffusion draws are the
    step's inputs (:func:`clipped_grad_sum_func` draws them), so every replay computes with fresh ones.
    ``graph_factory``: the graph to capture with (tests: a replaying fake on a CPU). ``ghost_conv``
    (``feta.ghost_conv``): how the ghost backend materialises a convolution's per-record gradients where dpgen's
    CPU kernel cannot run (:func:`dpgen.privacy.ghost.strategy_for`).
    """

    def __init__(self, denoiser: torch.nn.Module, clip: float, compile: bool = False, pad: bool | None = None,
                 backend: Any = "inductor", grad_backend: str = "torch_func", graph: bool = False,
                 graph_factory: Any = None, ghost_conv: str = "auto") -> None:
        if grad_backend not in ("torch_func", "ghost"):
            raise ValueError(f"MicroStep: grad_backend must be torch_func or ghost, got {grad_backend!r}")
        self.denoiser, self.clip = denoiser, float(clip)
        self.compiled = bool(compile) and grad_backend == "torch_func"
        self.graph = bool(graph)
        self.pad = self.compiled if pad is None else bool(pad)  # pad=True eagerly: tests of the padding
        if grad_backend == "ghost":
            self.clipper = GhostClipper(denoiser, strategy_for(ghost_conv))
            fn = self._ghost_sum
        else:
            fn = maybe_compile(self._sum, self.compiled, backend)
        self.fn = CapturedStep(fn, self.graph, "feta DP-SGD micro-batch", graph_factory) if self.graph else fn

    def _sum(self, weight: torch.Tensor, *batch: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        grads, losses = per_record_grads(self.denoiser, _record_loss, batch)
        acc = [torch.zeros_like(p) for p in self.denoiser.parameters() if p.requires_grad]
        add_clipped(acc, grads, self.clip, weight)
        return acc, (losses.detach() * weight).sum()

    def _ghost_sum(self, weight: torch.Tensor, *batch: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """:meth:`_sum` by ghost norms and book-keeping: one forward of the micro-batch's m·K rows, each record's
        loss the mean of its K rows (so its gradient is K-averaged before clipping, as :func:`_record_loss`), and
        the same clipping factors (:func:`clip_factors`)."""
        m, k = batch[0].shape[:2]
        rows = [t.flatten(0, 1) for t in batch]
        rec = self.clipper.record(lambda: edm_loss_at(self.denoiser, *rows).reshape(m, k).mean(1))
        return rec.clipped_sum(clip_factors(rec.norms, self.clip, weight)), (rec.losses * weight).sum()

    def __call__(self, batch: tuple[torch.Tensor, ...], cap: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The sums of the micro-batch ``batch`` (records on dim 0, at most ``cap`` of them). Under ``graph`` they are
        the graph's output tensors, overwritten by the next call: the caller adds them up first."""
        m = batch[0].shape[0]
        size = max(m, int(cap)) if self.graph else bucket_size(m, cap, fine=False) if self.pad else m
        padded, weight = pad_rows(batch, size)
        return self.fn(weight, *padded)


def clipped_grad_sum_func(denoiser: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, multiplicity: int,
                          clip: float, micro_batch: int, generator: torch.Generator,
                          dist: Dist = SINGLE,
                          step: MicroStep | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """:func:`clipped_grad_sum` for the EDM loss by the micro-batch ``step`` (ghost norms or torch.func): the same
    Σ_i clip(mean_k ∇ℓ_ik, C).

    The K diffusion draws of every record are made first (:func:`edm_draws`), then each record's loss is
    the mean over its K rows, so vmap(grad) returns the K-averaged gradient before clipping directly.
    With ``dist`` (several ranks, the same ``x``, ``y`` and ``generator`` state on each) this rank computes the
    micro-batches it owns; the draws of every micro-batch are made on every rank, so the ranks' streams stay
    equal; the sums and the loss are all-reduced, so every rank returns the whole batch's.
    ``step``: the :class:`MicroStep` to use (the training loop builds one per run: its ``grad_backend``, compiled
    under ``compile=true``), whose clip must be ``clip``; None: an eager torch.func one.
    """
    params = [p for p in denoiser.parameters() if p.requires_grad]
    acc = [torch.zeros_like(p) for p in params]
    k = int(multiplicity)
    loss_total, rows = torch.zeros((), device=x.device), 0
    step = MicroStep(denoiser, clip) if step is None else step
    if step.clip != float(clip):  # one clip: the step's is the one applied, ``clip`` the one the caller states
        raise ValueError(f"the micro-batch step clips at {step.clip}, not at clip={clip}")

    for j, s in enumerate(range(0, x.shape[0], max(1, int(micro_batch)))):
        xb, yb = x[s:s + micro_batch], y[s:s + micro_batch]
        m = xb.shape[0]
        xr, yr = xb.repeat_interleave(k, 0), yb.repeat_interleave(k, 0)
        sigma, noise = edm_draws(xr, generator)
        if not dist.owns(j):
            continue
        sums, loss_sum = step((xr.reshape(m, k, *xb.shape[1:]), yr.reshape(m, k), sigma.reshape(m, k),
                               noise.reshape(m, k, *xb.shape[1:])), max(1, int(micro_batch)))
        for a, t in zip(acc, sums):
            a.add_(t)
        loss_total = loss_total + loss_sum * k
        rows += m * k
    if dist.active:
        counts = torch.stack([loss_total, torch.tensor(float(rows), device=x.device)])
        dist.all_reduce_(acc + [counts])
        return acc, counts[0] / counts[1].clamp_min(1.0)
    return acc, loss_total / max(rows, 1)


def add_clipped(acc: list[torch.Tensor], per_record: list[torch.Tensor], clip: float,
                weight: torch.Tensor | None = None) -> None:
    """acc += Σ_i g_i·min(1, C/‖g_i‖) with ‖g_i‖ the norm over ALL parameters of record i (flat clipping).

    ``weight`` (0/1 per row, fp32): a compiled bucket's padded rows have weight 0, so they add exactly zero
    (:class:`MicroStep`); None: every row is a record.

    In the accumulators' dtype (fp32) with autocast off: under ``precision=bf16`` autocast would run the
    einsum in bf16, and per-record gradients may arrive in bf16 (opacus' hooks); a bf16 norm or clipped sum
    can exceed C by 2^-8 relative (:mod:`dpgen.core.precision`). Autocast is turned off by plain ``with`` blocks
    (what :func:`~dpgen.core.precision.full_precision` does with an ExitStack, which torch.compile cannot trace)."""
    with _autocast_off("cpu"), _autocast_off("cuda"):
        per_record = [g.to(a.dtype) for a, g in zip(acc, per_record)]
        norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in per_record))
        factor = clip_factors(norms, clip, weight)
        for a, g in zip(acc, per_record):
            a.add_(torch.einsum("i,i...->...", factor, g))


def clip_factors(norms: torch.Tensor, clip: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """min(1, C/‖g_i‖) for every record (flat clipping: ``norms`` over ALL parameters, fp32), times the record's
    ``weight`` (0/1: a compiled bucket's padded rows have weight 0, :class:`MicroStep`; None: every row is a
    record). Every feta/dpdm backend clips with these factors."""
    factor = (clip / norms.clamp_min(1e-12)).clamp(max=1.0)
    if weight is not None:
        factor = factor * weight.to(factor.dtype)  # padded rows: factor 0, their (finite) rows add exactly 0
    return factor


def _autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """Autocast off for ``device_type`` if it is on (:func:`full_precision` for one device type), else nothing."""
    return torch.autocast(device_type, enabled=False) if autocast_enabled(device_type) else contextlib.nullcontext()


def canary_sum(canaries: "DpsgdCanaries", clip: float) -> torch.Tensor:
    """An audit run's step (:mod:`dpgen.audit`): the sampled canaries' per-record gradients on their reserved
    coordinates, clipped by :func:`clip_factors` exactly as the records' are (a canary's gradient is zero on the
    model, so its norm over all parameters is its norm there) and summed; the caller adds the coordinates to
    the parameters :func:`set_noisy_grads` noises."""
    with _autocast_off("cpu"), _autocast_off("cuda"):
        return canaries.clipped_sum(lambda norms: clip_factors(norms, clip))


def set_noisy_grads(params: list[torch.nn.Parameter], sums: list[torch.Tensor], sigma: float, clip: float,
                    expected_batch: float, generator: SecretGenerator) -> None:
    """p.grad = (Σ clipped + N(0, σ²C²I)) / B* (Eq. 9; the noise, from the secret ``generator``, is the only
    randomness added)."""
    require_secret(generator, "DP-SGD noise")
    for p, s in zip(params, sums):
        noise = gaussian_noise(s.shape, sigma * clip, generator, device=s.device, dtype=s.dtype,
                               mechanism="DP-SGD noise")
        p.grad = (s + noise) / expected_batch


def signal_to_noise(sums: list[torch.Tensor], sigma: float, clip: float) -> torch.Tensor:
    """‖Σ clipped per-record gradients‖ / (σ·C·√d): one step's summed signal against the expected norm of its
    noise N(0, σ²C²I_d) (d: the coordinates noised). A tensor on the device, read only when logged (no sync);
    inf without noise (eps=inf)."""
    signal = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(s.detach().float()) for s in sums]))
    d = sum(s.numel() for s in sums)
    if sigma <= 0:
        return torch.full_like(signal, float("inf"))
    return signal / (float(sigma) * float(clip) * d ** 0.5)


def micro_batch_for(denoiser: torch.nn.Module, micro_batch: int | None, multiplicity: int, shape: list[int],
                    expected_batch: int, device: torch.device, step: MicroStep | None = None,
                    memory: Any = None) -> int:
    """Records per micro-batch: ``micro_batch`` as given, or (None) the largest power of two that fits the free
    memory of ``device`` (:mod:`dpgen.privacy.micro_batch`), capped by the expected Poisson batch.

    On CUDA with the run's ``step`` (an eager :class:`MicroStep` of the run's backend and settings), the footprint
    per record is measured (:func:`~dpgen.privacy.micro_batch.measured_footprint`: the step on 2 and 6 records of
    zeros with a throw-away generator, so no record and no secret stream is read); otherwise it is estimated from
    one forward on the meta device, for K-fold vmap(grad) (the per-record gradient is K-averaged inside the
    record's loss, :func:`_record_loss`, so the footprint holds one gradient per record, not K). ``memory``: the
    allocator statistics to read (tests: a fake; default CUDA's)."""
    if micro_batch is not None:
        return max(1, int(micro_batch))
    from dpgen.privacy import micro_batch as mb

    if step is not None and (memory is not None or torch.device(device).type == "cuda"):
        gen = torch.Generator(device=device).manual_seed(0)  # public and thrown away: the inputs are zeros

        def probe(m: int) -> None:
            x = torch.zeros(m, *shape, device=device)
            clipped_grad_sum_func(denoiser, x, torch.zeros(m, dtype=torch.long, device=device), int(multiplicity),
                                  step.clip, m, gen, step=step)

        footprint = mb.measured_footprint(probe, memory or mb.CudaMemory(device))
        m = mb.auto_micro_batch(footprint, device, int(expected_batch), margin=mb.MEASURED_MARGIN,
                                fraction=mb.MEASURED_FRACTION)
        log.info("feta: %.3f GB per record measured (K=%d), %d records per micro-batch", footprint / 1e9,
                 int(multiplicity), m)
        return m

    def example(dev: torch.device) -> tuple[torch.Tensor, ...]:
        return (torch.zeros(1, *shape, device=dev), torch.ones(1, device=dev),
                torch.zeros(1, dtype=torch.long, device=dev))

    footprint = mb.record_footprint(denoiser, example, int(multiplicity))
    return mb.auto_micro_batch(footprint, device, int(expected_batch))
