"""``compile=true|false`` (configs/train.yaml): torch.compile of the methods' hot steps.

The switch is read where a hot step is built: :func:`compile_enabled` is True inside :func:`compiling`
(entered by the pipeline around training and sampling, by ``scripts/sample.py`` with ``compile=true``) and
False everywhere else, so a method's code is the same with or without it and the default path is eager,
exactly today's.

What is compiled (docs/performance.md, "Compiled hot steps"):

* DP-SGD (feta/dpdm's denoiser, dpgan's discriminator): one micro-batch's per-record gradients, their flat
  norms, clipping factors and clipped sum (:mod:`dpgen.privacy.compiled`);
* dpgan's generator step (the generator loss, its backward through the compiled forward);
* feta/dpdm's sampler: the denoiser call of every sampler step.

Poisson batches vary in size from step to step, and every new shape would make torch.compile build a new graph.
The compiled DP-SGD micro-batch therefore runs on a *bucket*: the rows are padded up to the next size of a
small fixed set (:func:`bucket_size`), and the padded rows get weight 0 in the clipped sum, so they add
exactly zero to it and nothing to the privacy ledger (they are not records). A bucket is never smaller than the
batch: no sampled record is dropped to fit a shape.

Noise, norms, clipping factors, clipped sums and optimizer state stay fp32 under compilation as in eager mode
(the compiled functions compute them in the accumulators' dtype with autocast off).
"""
from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

import torch

__all__ = ["compiling", "compile_enabled", "maybe_compile", "bucket_size", "BUCKETS"]

F = TypeVar("F", bound=Callable[..., Any])

_ENABLED: contextvars.ContextVar[bool] = contextvars.ContextVar("dpgen_compile", default=False)

#: row counts a compiled micro-batch is padded to: 8·2^i·(1 + j/4), j < 4 (quarter octaves: a bucket wastes under
#: a quarter of its rows; a Poisson batch of mean B and std √B meets ~3 of them). ``bucket_size(..., fine=False)``
#: uses the powers of two only (a micro-batch remainder: its waste is bounded by one micro-batch anyway).
BUCKETS = tuple(sorted({(8 << i) * (4 + j) // 4 for i in range(28) for j in range(4)}))

#: graphs dynamo keeps per compiled function before it falls back to eager without an error (torch's default, 8,
#: is raised to this): buckets make DP-SGD's shapes few, but a run may meet a handful more than 8 over its life,
#: and one ensemble function serves several losses and member counts (dpgen.ensemble.compute.compiled)
RECOMPILE_LIMIT = 64


@contextmanager
def compiling(enabled: bool = True) -> Iterator[None]:
    """``compile=<enabled>`` for the duration (the pipeline's training and sampling, ``scripts/sample.py``)."""
    token = _ENABLED.set(bool(enabled))
    try:
        yield
    finally:
        _ENABLED.reset(token)


def compile_enabled() -> bool:
    """Whether the hot steps built now should be compiled (inside ``compiling(True)``)."""
    return _ENABLED.get()


def maybe_compile(fn: F, enabled: bool | None = None, backend: Any = "inductor") -> F:
    """``torch.compile(fn, dynamic=False)`` when compilation is on (``enabled``, default
    :func:`compile_enabled`), else ``fn`` itself. ``dynamic=False``: every shape is a bucket
    (:func:`bucket_size`), so static graphs are both the fastest and few. ``backend``: inductor (tests may pass
    a counting backend)."""
    if not (compile_enabled() if enabled is None else enabled):
        return fn
    import torch._dynamo.config as dynamo_config

    for key in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
        if hasattr(dynamo_config, key) and getattr(dynamo_config, key) < RECOMPILE_LIMIT:
            setattr(dynamo_config, key, RECOMPILE_LIMIT)
    return torch.compile(fn, dynamic=False, backend=backend)  # type: ignore[return-value]


def bucket_size(rows: int, cap: int | None = None, fine: bool = True) -> int:
    """The smallest bucket holding ``rows`` rows: the next of :data:`BUCKETS` (``fine=False``: the next power of
    two >= 8), or ``cap`` (the micro-batch, a shape every full micro-batch has anyway) when that is smaller;
    never less than ``rows`` (a ``cap`` below ``rows`` is ignored: records are never dropped to fit a shape)."""
    rows = int(rows)
    if rows < 0:
        raise ValueError(f"rows must be >= 0, got {rows}")
    size = next(b for b in BUCKETS if b >= rows and (fine or b & (b - 1) == 0))
    if cap is not None and rows <= int(cap) < size:  # rows <= cap: the cap holds them (else the bucket does)
        size = int(cap)
    return size
