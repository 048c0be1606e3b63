"""How a stacked ensemble computes its members' steps: dtype casts, convolution layout, torch.compile.

The run's settings come from :func:`dpgen.core.precision.ensemble_compute` (``precision``, ``compile``,
``ensemble.conv``; the pipeline sets them around training). Three independent switches, each the same function
as the default path within its precision's tolerance (tests/test_ensemble_compute.py, tests/test_bf16_ensemble.py):

* **dtype** (:func:`to_compute`): under ``precision=bf16`` the members' weights, spectral-norm vectors and float
  inputs are cast to bf16 *inside* the vmapped functional forward, because autocast does not reach inside
  ``torch.func.vmap``. The casts are differentiable, so the gradients w.r.t. the fp32 master weights (and w.r.t.
  fp32 images) come back in fp32; Adam's moments and step counts never see bf16. The forward runs with autocast
  off (:func:`~dpgen.core.precision.full_precision`): its dtypes are the explicit ones.
* **conv** (:class:`BatchedConv`): ``batched`` runs every ``conv2d`` of the members' forward as unfold + one
  batched matrix product (under vmap the members become the bmm's batch; G-PATE's grouped convolution becomes a
  matmul broadcast over groups) instead of torch's grouped convolutions.
* **compile** (:func:`compiled`): ``torch.compile`` of the members' loss-and-gradient function and of their Adam
  update, cached per function so that a training loop compiles each once (tests bound the recompilations).
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from dpgen.core.compile import maybe_compile
from dpgen.core.precision import ensemble_compute, full_precision

__all__ = ["to_compute", "conv2d_unfold", "BatchedConv", "member_forward", "teacher_forward", "compiled"]


def to_compute(tree: Any, dtype: torch.dtype) -> Any:
    """``tree`` (a tensor, or a dict/tuple/list of them) with every floating-point tensor in ``dtype``; integer
    tensors (labels, indices) and non-tensors unchanged. No copy where the dtype already matches."""
    if isinstance(tree, torch.Tensor):
        return tree.to(dtype) if tree.is_floating_point() and tree.dtype != dtype else tree
    if isinstance(tree, dict):
        return {k: to_compute(v, dtype) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(to_compute(v, dtype) for v in tree)
    return tree


def _pair(v: int | tuple[int, ...] | list[int]) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def conv2d_unfold(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0,
                  dilation: int | tuple[int, int] = 1, groups: int = 1) -> torch.Tensor:
    """``F.conv2d`` as im2col (``F.unfold``) and one matrix product per group, broadcast over the groups:
    out[n, g] = W_g · cols[n, g]. The same function (fp32 rounding aside); under vmap the product is a bmm."""
    unbatched = x.dim() == 3
    if unbatched:
        x = x.unsqueeze(0)
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    n, _, h, w = x.shape
    cout, cin_g, kh, kw = weight.shape
    oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    cols = F.unfold(x, (kh, kw), dilation=dilation, padding=padding, stride=stride)  # [n, C·kh·kw, L]
    cols = cols.reshape(n, groups, cin_g * kh * kw, oh * ow)
    out = torch.matmul(weight.reshape(groups, cout // groups, cin_g * kh * kw), cols)  # [n, groups, cout_g, L]
    out = out.reshape(n, cout, oh, ow)
    if bias is not None:
        out = out + bias.reshape(1, cout, 1, 1)
    return out[0] if unbatched else out


class BatchedConv(TorchFunctionMode):
    """Inside it, ``F.conv2d``/``torch.conv2d`` with numeric padding run as :func:`conv2d_unfold` (the
    ``ensemble.conv=batched`` layout); everything else, and string padding, as usual. A torch function mode
    acts before vmap and autograd, so it reaches the members' convolutions inside the vmapped forward without
    any change to the networks' code."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.conv2d or func is torch.conv2d:
            names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
            bound = dict(zip(names, args), **kwargs)
            if not isinstance(bound.get("padding", 0), str):
                return conv2d_unfold(bound["input"], bound["weight"], bound.get("bias"), bound.get("stride", 1),
                                     bound.get("padding", 0), bound.get("dilation", 1), bound.get("groups", 1))
        return func(*args, **kwargs)


@contextmanager
def member_forward() -> Iterator[torch.dtype]:
    """The context of a members' forward/backward: autocast off (explicit dtypes instead, see the module
    docstring) and, under ``ensemble.conv=batched``, :class:`BatchedConv`. Yields the compute dtype."""
    settings = ensemble_compute()
    with ExitStack() as stack:
        stack.enter_context(full_precision())
        if settings.conv == "batched":
            stack.enter_context(BatchedConv())
        yield settings.dtype


@contextmanager
def teacher_forward() -> Iterator[None]:
    """The context of G-PATE's stacked teachers' forward/backward: :class:`BatchedConv` under
    ``ensemble.conv=batched``. Their grouped convolutions run outside vmap, so precision=bf16 reaches them through
    autocast (which also keeps their normalisation statistics in fp32); no explicit cast here."""
    if ensemble_compute().conv == "batched":
        with BatchedConv():
            yield
    else:
        yield


_COMPILED: dict[Callable, Callable] = {}


def compiled(fn: Callable) -> Callable:
    """``fn`` itself in eager mode; under ``compile=true`` its ``torch.compile`` (one per function, kept for the
    process, so each hot step compiles once; dynamic shapes off). One function serves several losses and member
    counts (the sampled members, refresh, pre-training chunks, the classifier), each one more graph: a
    Poisson-sampled member count is padded to a bucket first (:func:`dpgen.ensemble.functional.functional_step`),
    and :data:`dpgen.core.compile.RECOMPILE_LIMIT` keeps the rest compiled."""
    if not ensemble_compute().compile:
        return fn
    out = _COMPILED.get(fn)
    if out is None:
        out = _COMPILED[fn] = maybe_compile(fn, enabled=True)
    return out
