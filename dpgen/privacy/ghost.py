"""Per-record gradient norms and the clipped sum without per-record gradients where that is cheaper: mixed ghost
clipping with book-keeping (Bu et al., NeurIPS 2022, "Scalable and efficient training of large convolutional
neural networks with differential privacy": the ghost norm of a convolution and the per-layer choice; Bu et al.,
ICML 2023, "Differentially private optimization on large model at small cost": book-keeping).

One forward pass keeps every trainable layer's input (its activation ``a``) and one backward pass of the summed
loss computes every layer's output gradient ``g``, and nothing else: the backward is taken with respect to the
layers' outputs, so autograd skips the weight-gradient products a plain ``backward()`` would compute. A layer
with weight W ∈ R^{p×d} and positions t (a convolution's output pixels, its input unfolded into patches of d
values) gives record i the gradient Σ_t g_it a_itᵀ, whose squared norm comes from one of (:func:`strategy`)

* the ghost norm Σ_{t,t'} (a_it·a_it')(g_it·g_it') (:data:`GHOST`: two T×T Gram matrices per record, ~T²(d+p)
  multiply-adds, no p×d tensor), the clipped sum then by book-keeping (Bu et al. 2023): Σ_i c_i Gᵢᵀ Aᵢ = (c⊙G)ᵀA,
  the layer's ordinary weight gradient of the scaled output gradients, one product;
* the materialised gradient Gᵢᵀ Aᵢ (~T·d·p multiply-adds, d·p floats per record), from the patches and a batched
  product (:data:`PATCHES`) or, for a convolution, from a convolution with one group per record
  (:data:`GROUPED`, which needs no unfolded copy of the input) or, for a convolution on a CPU, from dpgen's
  kernel, which reads the patches in place from the padded input (:data:`FUSED`,
  :mod:`dpgen.privacy.ghost_kernel`); the clipped sum is then Σ_i c_i Pᵢ.

The ghost norm is taken where it costs fewer operations than the materialised gradient (:func:`prefer_ghost`,
Bu et al. 2022's mixed ghost clipping). A convolution on a CPU takes the kernel wherever it is built: its
T·d·p multiply-adds are the book-keeping product's alone, so it undercuts the ghost norm as well. A record may
hold several rows (feta's K diffusion draws, whose gradient is averaged before clipping): its positions are then
the K·T positions of its rows, its Gram matrices span them all, and the rule counts them. Norm layers
(GroupNorm) and biases have C-sized per-record gradients, which are materialised. No second backward pass is run.

The per-record gradient this defines is exactly the one torch.func's vmap(grad) returns
(:func:`dpgen.privacy.per_sample.per_record_grads`) when records do not interact in the forward pass (no batch
statistics: the DP-trained networks have no BatchNorm); norms, factors and sums are computed in fp32 with
autocast off, whatever dtype the forward ran in.

Supported trainable layers: ``nn.Linear``, ``nn.Conv2d`` (zeros padding, one group), ``nn.Embedding`` and
``nn.GroupNorm`` (opacus' ghost clipping has norm samplers for Linear and Embedding only); any other module
owning a trainable parameter is refused when the :class:`GhostClipper` is built.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from dpgen.core.precision import full_precision
from dpgen.privacy import ghost_kernel

__all__ = ["GhostClipper", "Recorded", "prefer_ghost", "strategy", "strategy_for", "SUPPORTED", "GHOST", "PATCHES",
           "GROUPED", "FUSED", "CONV_PATHS"]

#: the layer types that may own trainable parameters (every parameterised layer of dpgan's D and feta's UNet)
SUPPORTED = (nn.Linear, nn.Conv2d, nn.Embedding, nn.GroupNorm)

#: (input, output gradient) of one call of a layer (zeros where the loss does not reach the output)
Call = tuple[torch.Tensor, torch.Tensor]
#: ``buffer(role, shape)``: a fp32 tensor of ``shape`` on the call's device, zero when first made, kept for the same
#: layer, call and role in the next batch (:class:`GhostClipper`'s scratch); None: a fresh tensor every time
Buffer = Callable[[str, tuple[int, ...]], torch.Tensor]


#: how a weight's per-record squared norms are computed (:func:`strategy`): the ghost norm (then its clipped sum by
#: book-keeping), or the materialised per-record gradient from the layer's patches and a batched product, or
#: (convolutions) from a convolution with one group per record, or (convolutions on a CPU) from dpgen's kernel
GHOST, PATCHES, GROUPED, FUSED = "ghost", "patches", "grouped", "fused"

#: the most floats a layer's per-record gradients may take on the kernel's path (1 GiB); beyond, the plain choice
FUSED_MAX_FLOATS = 1 << 28


def prefer_ghost(positions: int, d: int, p: int) -> bool:
    """Whether a weight with ``d`` inputs and ``p`` outputs per position and ``positions`` positions per record (a
    record's K rows count K times) takes the ghost norm: its two Gram matrices cost T²(d + p) multiply-adds and its
    book-keeping product T·d·p more, against T·d·p for the materialised gradient (Bu et al. 2022, Sec. 3.2, count
    the first two only); on a CPU the Gram matrices' small products and the unfolded patches they need cost about
    twice their multiply-adds (bench/dpsgd_overhead.py), hence the factor 2."""
    return 2 * positions * (d + p) < d * p


def strategy(m: nn.Module, rows: int, positions: int, d: int, p: int) -> str:
    """The default choice for a weight with ``d`` inputs and ``p`` outputs per position, ``positions`` positions per
    row and ``rows`` rows per record: :data:`FUSED` for a convolution (:func:`plain_strategy` where the kernel
    cannot run: off a CPU, not built, or past :data:`FUSED_MAX_FLOATS`), else :func:`plain_strategy`."""
    return FUSED if isinstance(m, nn.Conv2d) else plain_strategy(m, rows, positions, d, p)


def plain_strategy(m: nn.Module, rows: int, positions: int, d: int, p: int) -> str:
    """The choice without dpgen's kernel: :data:`GHOST` where :func:`prefer_ghost` says so; otherwise the materialised
    gradient, from a grouped convolution (:data:`GROUPED`) for a convolution of more than 64 output positions
    and fewer than 128 outputs, else from the patches (:data:`PATCHES`; a 1×1 convolution's patches are its
    input, no copy). On a CPU the grouped convolution's weight gradient is 1.1–2× the plain convolution's where
    unfolding the input costs 2–8× (bench/dpsgd_overhead.py's layers, docs/performance.md); it is slow for
    small outputs, where the unfolded input is small: for dpgan's 32 → 64 convolution (49 positions) the
    patches and a batched product take about 0.8× its CPU time."""
    if prefer_ghost(rows * positions, d, p):
        return GHOST
    if isinstance(m, nn.Conv2d) and m.kernel_size != (1, 1) and positions > 64 and p < 128:
        return GROUPED
    return PATCHES


#: how a convolution's materialised per-record gradients are computed where dpgen's kernel cannot run (a GPU):
#: ``auto`` (:func:`plain_strategy`'s rule, measured on a CPU), or always from the patches or a grouped convolution
CONV_PATHS = ("auto", PATCHES, GROUPED)


def strategy_for(conv: str = "auto") -> Callable[[nn.Module, int, int, int, int], str]:
    """The rule :func:`strategy` with ``conv`` (one of :data:`CONV_PATHS`) deciding every k×k convolution (k > 1) whose
    per-record gradient is materialised without the kernel; the ghost-norm choice and the kernel on a CPU are
    unchanged. ``auto``: :func:`strategy` itself. The returned rule's ``plain`` is its choice without the kernel."""
    if conv not in CONV_PATHS:
        raise ValueError(f"ghost: the convolution path must be one of {', '.join(CONV_PATHS)}, got {conv!r}")
    if conv == "auto":
        return strategy

    def plain(m: nn.Module, rows: int, positions: int, d: int, p: int) -> str:
        how = plain_strategy(m, rows, positions, d, p)
        if isinstance(m, nn.Conv2d) and m.kernel_size != (1, 1) and how in (PATCHES, GROUPED):
            return conv
        return how

    def rule(m: nn.Module, rows: int, positions: int, d: int, p: int) -> str:
        return FUSED if isinstance(m, nn.Conv2d) else plain(m, rows, positions, d, p)
    rule.plain = plain  # type: ignore[attr-defined]
    return rule


class _Part:
    """One parameter's share of a batch: each record's squared gradient norm, and ``weighted(c)`` = Σ_i c_i g_i."""

    def __init__(self, sq: torch.Tensor, weighted: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.sq, self.weighted = sq, weighted


def _materialised(per_record: torch.Tensor) -> _Part:
    """A parameter whose per-record gradients (records, *shape) are at hand: squared norms and Σ_i c_i P_i."""
    flat = per_record.flatten(1)
    return _Part(torch.linalg.vector_norm(flat, dim=1).square(), lambda c: (c @ flat).reshape(per_record.shape[1:]))


def _ghost_sq(a_gram: torch.Tensor, g_gram: torch.Tensor) -> torch.Tensor:
    """‖Σ_t g_t a_tᵀ‖² = Σ_{t,t'} (a_t·a_t')(g_t·g_t') per record, from the Gram matrices (records, T, T) of the
    inputs and of the output gradients over the record's positions."""
    return (a_gram * g_gram).sum((1, 2))


def _per_row(c: torch.Tensor, t: torch.Tensor, records: int) -> torch.Tensor:
    """``t`` (rows, ...) with every row multiplied by its record's ``c`` (a record's rows are consecutive)."""
    return (t.reshape(records, -1, *t.shape[1:]) * c.reshape(-1, *([1] * t.dim()))).reshape(t.shape)


def _record_sum(t: torch.Tensor, records: int) -> torch.Tensor:
    """(rows, ...) → (records, ...): the sum of each record's consecutive rows; ``t`` itself when every record
    has one row (a sum over one row would copy it)."""
    return t if t.shape[0] == records else t.reshape(records, -1, *t.shape[1:]).sum(1)


def _total(parts: Iterable[torch.Tensor]) -> torch.Tensor:
    """The sum of the calls' tensors; one call's tensor as it is (Python's sum would copy it, adding it to 0)."""
    return functools.reduce(torch.add, parts)


def _cat(parts: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """The calls' positions side by side (along ``dim``); one call's tensor as it is (no copy)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def _linear(m: nn.Linear, calls: list[Call], records: int, rule) -> list[tuple[nn.Parameter, _Part]]:
    """y = W a + b at every position (all dimensions between the batch and the features)."""
    a = _cat([x.float().reshape(records, -1, m.in_features) for x, _ in calls])
    g = _cat([gz.float().reshape(records, -1, m.out_features) for _, gz in calls])
    out = []
    if m.weight.requires_grad:
        rows = calls[0][0].shape[0] // records
        if rule(m, rows, a.shape[1] // rows, m.in_features, m.out_features) == GHOST:
            def weighted(c: torch.Tensor) -> torch.Tensor:  # book-keeping: (c⊙G)ᵀA, one product
                return torch.mm((g * c[:, None, None]).flatten(0, 1).t(), a.flatten(0, 1))
            gram = _ghost_sq(torch.bmm(a, a.transpose(1, 2)), torch.bmm(g, g.transpose(1, 2)))
            out.append((m.weight, _Part(gram, weighted)))
        else:
            out.append((m.weight, _materialised(torch.bmm(g.transpose(1, 2), a))))
    if m.bias is not None and m.bias.requires_grad:
        out.append((m.bias, _materialised(g.sum(1))))
    return out


def _conv_record_grads(m: nn.Conv2d, x: torch.Tensor, g: torch.Tensor, records: int) -> torch.Tensor:
    """Each record's weight gradient (records, *weight.shape), summed over its rows: the weight gradient of a
    convolution with one group per record (the records side by side as channels, their rows as the batch),
    which the backend computes without unfolding the input."""
    rows, cin, h, w = x.shape
    k, p = rows // records, m.out_channels
    xg = x.reshape(records, k, cin, h, w).transpose(0, 1).reshape(k, records * cin, h, w)
    gg = g.reshape(records, k, p, *g.shape[2:]).transpose(0, 1).reshape(k, records * p, *g.shape[2:])
    weight = x.new_empty(1).expand(records * p, *m.weight.shape[1:])  # its shape only (as torch.nn.grad does)
    grad = torch.ops.aten.convolution_backward(gg, xg, weight, None, m.stride, m.padding, m.dilation, False,
                                               [0, 0], records, [False, True, False])[1]
    return grad.reshape(records, *m.weight.shape)


def _padded(x: torch.Tensor, ph: int, pw: int, buffer: Buffer | None, last: bool = False) -> torch.Tensor:
    """``x`` (rows, cin, H, W) zero-padded by ``ph`` rows and ``pw`` columns on each side, channels-last
    (rows, H, W, cin) when ``last``: into ``buffer``'s tensor, whose borders stay zero from when it was made."""
    xl = x.permute(0, 2, 3, 1) if last else x
    if buffer is None:
        padded = F.pad(xl, (0, 0, pw, pw, ph, ph) if last else (pw, pw, ph, ph))
        return padded.contiguous() if last else padded
    rows, cin, h, w = x.shape
    out = buffer("padded", (rows, h + 2 * ph, w + 2 * pw, cin) if last else (rows, cin, h + 2 * ph, w + 2 * pw))
    (out[:, ph:ph + h, pw:pw + w] if last else out[:, :, ph:ph + h, pw:pw + w]).copy_(xl)
    return out


def _copy(view: torch.Tensor, shape: tuple[int, ...], buffer: Buffer | None) -> torch.Tensor:
    """``view`` copied into a contiguous tensor of ``shape`` (``buffer``'s ``patches`` when given)."""
    if buffer is None:
        return view.reshape(shape)
    out = buffer("patches", shape)
    out.view(view.shape).copy_(view)
    return out


def _conv_patches(m: nn.Conv2d, x: torch.Tensor, records: int, buffer: Buffer | None = None) -> torch.Tensor:
    """The input's patches (records, d, K·T): column t of record i is the patch that output position t of one of
    its K rows sees (F.unfold's layout with a record's rows side by side), one strided copy of the padded input
    (faster than F.unfold on a CPU, which loops over the rows); ``records`` = rows: each row's patches."""
    rows, cin, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = m.kernel_size, m.stride, m.padding, m.dilation
    if rows == records and (kh, kw, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0):
        return x.flatten(2)  # a 1×1 convolution's patches are its input
    xp = _padded(x, ph, pw, buffer) if ph or pw else x
    ho, wo = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    k = rows // records
    sn, sc, sy, sx = xp.stride()
    view = xp.as_strided((records, cin, kh, kw, k, ho, wo), (k * sn, sc, dh * sy, dw * sx, sn, sh * sy, sw * sx),
                         xp.storage_offset())
    return _copy(view, (records, cin * kh * kw, k * ho * wo), buffer)


def _conv_patches_last(m: nn.Conv2d, x: torch.Tensor, records: int, buffer: Buffer | None = None) -> torch.Tensor:
    """The input's patches (records, K·T, d) with each patch's values in (kh, kw, cin) order: row t of record i is
    the patch that output position t of one of its K rows sees. One copy of the padded input in channels-last
    layout, then one copy whose innermost runs are a pixel's cin contiguous channels (the channels-first patches'
    innermost runs are single strided values)."""
    rows, cin, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = m.kernel_size, m.stride, m.padding, m.dilation
    xp = _padded(x, ph, pw, buffer, last=True)  # (rows, H, W, cin)
    ho, wo = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    k = rows // records
    sn, sy, sx, sc = xp.stride()
    view = xp.as_strided((records, k, ho, wo, kh, kw, cin), (k * sn, sn, sh * sy, sw * sx, dh * sy, dw * sx, sc),
                         xp.storage_offset())
    return _copy(view, (records, k * ho * wo, kh * kw * cin), buffer)


def _bmm(a: torch.Tensor, b: torch.Tensor, buffer: Buffer | None) -> torch.Tensor:
    """a @ b, batched (into ``buffer``'s ``product`` when given)."""
    if buffer is None:
        return torch.bmm(a, b)
    return torch.bmm(a, b, out=buffer("product", (a.shape[0], a.shape[1], b.shape[2])))


def _record_rows(g: torch.Tensor, records: int) -> torch.Tensor:
    """A convolution's output gradient (rows, p, H, W) as (records, K·T, p), a record's rows one after another."""
    rows, p = g.shape[:2]
    return g.reshape(records, rows // records, p, -1).transpose(2, 3).reshape(records, -1, p)


def _conv(m: nn.Conv2d, calls: list[Call], records: int, rule, buffers: list[Buffer | None] | None = None
          ) -> list[tuple[nn.Parameter, _Part]]:
    """A 2-d convolution: at output position t, y_t = W a_t + b with a_t the input patch (Bu et al. 2022, Eq. 2).
    ``buffers``: one per call (:data:`Buffer`), for the copies and products the size of a batch's patches."""
    calls = [(x.float(), gz.float()) for x, gz in calls]
    buffers = buffers or [None] * len(calls)
    p, d = m.out_channels, m.weight[0].numel()
    rows = calls[0][1].shape[0] // records
    out = []
    positions = sum(gz[0, 0].numel() for _, gz in calls)
    how = rule(m, rows, positions, d, p)
    if how == FUSED and not _fused_runs(m, calls, records):
        how = getattr(rule, "plain", plain_strategy)(m, rows, positions, d, p)
    if m.weight.requires_grad and how == FUSED:
        return _fused(m, calls, records, buffers)
    if m.weight.requires_grad and how == GHOST:
        a = _cat([_conv_patches_last(m, x, records, b) for (x, _), b in zip(calls, buffers)])  # (records, K·T, d)
        g = _cat([_record_rows(gz, records) for _, gz in calls])  # (records, K·T, p)
        kh, kw = m.kernel_size

        def weighted(c: torch.Tensor) -> torch.Tensor:  # book-keeping: (c⊙G)ᵀA over all positions, one product
            return torch.mm(_per_row(c, g, records).flatten(0, 1).t(), a.flatten(0, 1)) \
                .reshape(p, kh, kw, -1).permute(0, 3, 1, 2)
        a_gram, g_gram = torch.bmm(a, a.transpose(1, 2)), torch.bmm(g, g.transpose(1, 2))
        out.append((m.weight, _Part(_ghost_sq(a_gram, g_gram), weighted)))
    elif m.weight.requires_grad and how == PATCHES:  # each row's gradient from its patches, summed per record
        out.append((m.weight, _materialised(_total(
            _record_sum(_bmm(gz.flatten(2), _conv_patches(m, x, rows * records, b).transpose(1, 2), b), records)
            for (x, gz), b in zip(calls, buffers)).reshape(records, *m.weight.shape))))
    elif m.weight.requires_grad:
        out.append((m.weight, _materialised(_total(_conv_record_grads(m, x, gz, records) for x, gz in calls))))
    if m.bias is not None and m.bias.requires_grad:
        out.append((m.bias, _materialised(_total(_record_sum(gz.sum((2, 3)), records) for _, gz in calls))))
    return out


def _fused_runs(m: nn.Conv2d, calls: list[Call], records: int) -> bool:
    """Whether dpgen's kernel can take this layer's calls: CPU, fp32, a tuple padding, its per-record gradients
    within :data:`FUSED_MAX_FLOATS`, and the kernel built."""
    op = -(-m.out_channels // 16) * 16
    return all(x.device.type == "cpu" and x.dtype == torch.float32 for x, _ in calls) and \
        isinstance(m.padding, tuple) and records * m.weight[0].numel() * op <= FUSED_MAX_FLOATS and \
        ghost_kernel.available()


def _fused(m: nn.Conv2d, calls: list[Call], records: int, buffers: list[Buffer | None]
           ) -> list[tuple[nn.Parameter, _Part]]:
    """Each record's weight gradient and squared norm by dpgen's kernel, which reads the patches in place (no
    unfolded copy), and its bias gradient (the output gradients summed over its positions) from the same pass;
    several calls of the layer: their gradients summed per record, then the norm of the sum."""
    p, d = m.out_channels, m.weight[0].numel()
    op = -(-p // 16) * 16  # the kernel's outputs come in vectors of 16 (the extra columns zero)
    with_bias = m.bias is not None and m.bias.requires_grad
    per_call = []
    for (x, gz), b in zip(calls, buffers):
        b = b or (lambda role, shape: torch.zeros(shape, device=x.device))
        got = [b("grads", (records, d, op)), b("sq", (records,))]
        if with_bias:
            got += [b("bias", (records, op)), b("bias_sq", (records,))]
        ghost_kernel.conv_record_grads(x.contiguous(), gz.contiguous(), got[0], got[1], x.shape[0] // records,
                                       m.kernel_size, m.stride, m.padding, m.dilation, *got[2:])
        per_call.append(got)
    if len(per_call) == 1:
        got = per_call[0]
    else:  # (gradients, squared norms) of the weight, then of the bias: the gradients summed, then normed
        got = []
        for i in range(0, len(per_call[0]), 2):
            total = _total(c[i] for c in per_call)
            got += [total, torch.linalg.vector_norm(total.flatten(1), dim=1).square()]

    def weighted(c: torch.Tensor) -> torch.Tensor:  # Σ_i c_i P_i, then (d, o) → the weight's (o, d)
        return (c @ got[0].flatten(1)).reshape(d, op)[:, :p].t().reshape(m.weight.shape)
    out = [(m.weight, _Part(got[1], weighted))]
    if with_bias:
        out.append((m.bias, _Part(got[3], lambda c: (c @ got[2])[:p])))
    return out


def _embedding(m: nn.Embedding, calls: list[Call], records: int, rule) -> list[tuple[nn.Parameter, _Part]]:
    """A lookup is a linear layer on a one-hot input: a_t·a_t' = [idx_t = idx_t']."""
    idx = _cat([x.reshape(records, -1) for x, _ in calls])
    g = _cat([gz.float().reshape(records, -1, m.embedding_dim) for _, gz in calls])
    if m.padding_idx is not None:  # the padding row gets no gradient
        g = g * (idx != m.padding_idx).unsqueeze(-1).to(g.dtype)
    v = m.num_embeddings
    rows = calls[0][0].shape[0] // records
    if rule(m, rows, idx.shape[1] // rows, v, m.embedding_dim) == GHOST:
        def weighted(c: torch.Tensor) -> torch.Tensor:
            return torch.zeros(m.weight.shape, device=g.device).index_add_(0, idx.flatten(),
                                                                             (g * c[:, None, None]).flatten(0, 1))
        part = _Part(_ghost_sq((idx[:, :, None] == idx[:, None, :]).to(g.dtype), torch.bmm(g, g.transpose(1, 2))),
                     weighted)
    else:
        onehot = (idx[:, :, None] == torch.arange(v, device=idx.device)).to(g.dtype)
        part = _materialised(torch.bmm(onehot.transpose(1, 2), g))
    return [(m.weight, part)]


def _group_norm(m: nn.GroupNorm, calls: list[Call], records: int, rule) -> list[tuple[nn.Parameter, _Part]]:
    """y = γ x̂ + β per channel: per-record gradients Σ g x̂ and Σ g over the record's rows and positions."""
    gw, gb = [], []
    for x, gz in calls:
        x, gz = x.float(), gz.float()
        xhat = F.group_norm(x, m.num_groups, eps=m.eps)
        gw.append(_record_sum((gz * xhat).flatten(2).sum(2), records))
        gb.append(_record_sum(gz.flatten(2).sum(2), records))
    out = []
    if m.weight.requires_grad:
        out.append((m.weight, _materialised(_total(gw))))
    if m.bias is not None and m.bias.requires_grad:
        out.append((m.bias, _materialised(_total(gb))))
    return out


_REDUCE = {nn.Linear: _linear, nn.Conv2d: _conv, nn.Embedding: _embedding, nn.GroupNorm: _group_norm}


@dataclass
class Recorded:
    """One batch's forward and backward (:meth:`GhostClipper.record`): each record's squared gradient norm over all
    trainable parameters (fp32), the records' losses (detached), and :meth:`clipped_sum`."""

    sq_norms: torch.Tensor
    losses: torch.Tensor
    parts: list[tuple[nn.Parameter, _Part]]
    params: list[nn.Parameter]
    current: Callable[[], bool] = lambda: True  # False once a later record() has reused the clipper's buffers

    @property
    def norms(self) -> torch.Tensor:
        """Each record's gradient norm over all trainable parameters (fp32)."""
        return self.sq_norms.sqrt()

    def clipped_sum(self, factor: torch.Tensor) -> list[torch.Tensor]:
        """Σ_i factor_i · ∇_θ loss_i for every trainable parameter (in ``module.parameters()`` order), fp32 with
        autocast off (book-keeping: no second backward). Before the clipper's next :meth:`GhostClipper.record`,
        which reuses the buffers the per-record gradients live in."""
        if not self.current():
            raise RuntimeError("grad_backend=ghost: clipped_sum of a batch after the next batch was recorded (its "
                               "per-record gradients share the clipper's buffers): call clipped_sum first")
        with full_precision(), torch.no_grad():
            c = factor.to(torch.float32)
            sums = {id(p): part.weighted(c) for p, part in self.parts}
            return [sums[id(p)].reshape(p.shape).to(p.dtype) for p in self.params]


class GhostClipper:
    """Per-record gradient norms and clipped sums of ``module``'s trainable parameters by ghost norms and
    book-keeping (module docstring). ``rule(layer, rows, positions, d, p)``: how a weight's norms are computed
    (``rows`` per record, ``positions`` per row), one of
    :data:`GHOST`, :data:`PATCHES`, :data:`GROUPED` (:func:`strategy`). Build once per module; :meth:`record` once
    per batch, then :meth:`Recorded.clipped_sum` before the next :meth:`record`.

    On a CPU, a convolution's padded input, patches and per-record gradients are written into buffers kept from one
    batch to the next (per layer, call and role; remade when a shape changes): a batch's largest temporaries, which
    glibc's allocator would otherwise return to the system and fault in again page by page every step. On CUDA the
    caching allocator already reuses freed blocks, and a layer's temporaries are freed for the next layer's."""

    def __init__(self, module: nn.Module, rule: Callable[[nn.Module, int, int, int, int], str] = strategy) -> None:
        self.module, self.rule = module, rule
        self._scratch: dict[tuple[int, int, str], torch.Tensor] = {}
        self._batches = 0
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.layers: list[nn.Module] = []
        covered: set[int] = set()
        for name, m in module.named_modules():
            own = [p for p in m.parameters(recurse=False) if p.requires_grad]
            if not own:
                continue
            if not isinstance(m, SUPPORTED) or \
                    (isinstance(m, nn.Conv2d) and (m.padding_mode != "zeros" or m.groups != 1)) or \
                    (isinstance(m, nn.Embedding) and (m.max_norm is not None or m.scale_grad_by_freq or m.sparse)):
                raise ValueError(f"grad_backend=ghost: layer {name or '<root>'} ({type(m).__name__}) has trainable "
                                 f"parameters but no ghost-norm rule (supported: Linear, Conv2d with zeros padding "
                                 f"and one group, Embedding without max_norm, GroupNorm)")
            self.layers.append(m)
            covered.update(id(p) for p in own)
        missing = [n for n, p in module.named_parameters() if p.requires_grad and id(p) not in covered]
        if missing:
            raise ValueError(f"grad_backend=ghost: trainable parameters outside a supported layer: {missing}")

    def _buffer(self, m: nn.Module, call: int, device: torch.device) -> Buffer:
        """The :data:`Buffer` of ``m``'s ``call``-th call this batch."""
        def buffer(role: str, shape: tuple[int, ...]) -> torch.Tensor:
            key = (id(m), call, role)
            buf = self._scratch.get(key)
            if buf is None or buf.shape != torch.Size(shape) or buf.device != device:
                buf = self._scratch[key] = torch.zeros(shape, device=device)
            return buf
        return buffer

    def record(self, forward: Callable[[], torch.Tensor]) -> Recorded:
        """Run ``forward()``, which returns the per-record losses (records,) and feeds each layer a batch whose
        rows are the records' rows in order (a record's rows consecutive); backpropagate the losses' sum to the
        layers' outputs only (no weight gradient is computed); reduce every layer to per-record squared norms."""
        calls: dict[nn.Module, list[tuple[torch.Tensor, torch.Tensor, int, int]]] = {m: [] for m in self.layers}

        def capture(m: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
            calls[m].append((inputs[0], output, inputs[0]._version, output._version))

        hooks = [m.register_forward_hook(capture) for m in self.layers]
        try:
            losses = forward()
        finally:
            for h in hooks:
                h.remove()
        flat = [(m, c) for m in self.layers for c in calls[m]]
        for m, (x, z, vx, vz) in flat:
            if x._version != vx or z._version != vz:  # autograd would give the gradient of the modified tensor
                raise RuntimeError(f"grad_backend=ghost: the input or output of a {type(m).__name__} was modified in "
                                   "place after the layer ran (an inplace activation?)")
        outputs = [z for _, (_, z, _, _) in flat]
        grads = iter(torch.autograd.grad(losses.sum(), outputs, allow_unused=True) if outputs else ())
        records = losses.shape[0]
        parts: list[tuple[nn.Parameter, _Part]] = []
        # no autograd graph through the reductions: nothing differentiates a norm or a clipped sum, and a graph would
        # keep every layer's patches and Gram inputs alive with the Recorded (and with the gradients it sums into)
        with full_precision(), torch.no_grad():
            for m in self.layers:
                pairs = [(x, torch.zeros_like(z) if g is None else g) for (x, z, _, _), g in zip(calls[m], grads)]
                if pairs and isinstance(m, nn.Conv2d):
                    buffers = [self._buffer(m, i, x.device) if x.device.type == "cpu" else None
                               for i, (x, _) in enumerate(pairs)]
                    parts += _conv(m, pairs, records, self.rule, buffers)
                elif pairs:
                    parts += _REDUCE[type(m) if type(m) in _REDUCE else next(t for t in _REDUCE if isinstance(m, t))](
                        m, pairs, records, self.rule)
            trained = {id(p) for p, _ in parts}
            for p in self.params:  # a layer the forward never called: its gradient is zero
                if id(p) not in trained:
                    zero = torch.zeros(records, *p.shape, device=p.device)
                    parts.append((p, _materialised(zero)))
            sq = torch.stack([part.sq for _, part in parts]).sum(0) if parts else \
                torch.zeros(records, device=losses.device)
        self._batches += 1
        batch = self._batches
        return Recorded(sq, losses.detach(), parts, self.params, lambda: self._batches == batch)
