"""A hot step replayed from a CUDA graph: one launch of a captured step instead of its thousands of kernels.

:class:`CapturedStep` wraps ``fn(*tensors) -> tensors`` (a list or tuple of tensors, possibly nested one level).
On CUDA its first :data:`WARMUP_CALLS` calls run eagerly on a side stream (torch's warm-up before a capture:
cuBLAS handles, cuDNN plans and autograd's streams exist before the capture starts; their results are the calls'
results), the next captures ``fn`` on static copies of the inputs, and every call after that copies the new
inputs into those static tensors and replays the graph.

What a replay reads is only what the capture saw: the static inputs (refreshed on every call), the module's
parameters (read in place, so optimizer updates are seen) and the default CUDA generator (graph-safe: a replay
advances its offset). Everything random that a privacy or loss analysis draws is therefore drawn OUTSIDE the
step, by the caller, and passed in as an input: the replayed step cannot reuse a draw (``pytest -m gpu``:
two replays with different draws give different sums). The inputs' shapes are static: the caller pads (feta's
micro-batch step pads the Poisson remainder with weight-0 rows, :func:`dpgen.privacy.per_sample.pad_rows`).

The outputs are the graph's static tensors, overwritten by the next call: consume them (add them into an
accumulator, copy them) before calling again. A capture that fails (an op that syncs with the host, a shape
that changes) is logged once and the step runs eagerly from then on: the arithmetic is the same either way.
On a CPU the wrapper calls ``fn`` directly; tests exercise the static-buffer plumbing with a replaying fake
(``graph_factory``).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Protocol

import torch

__all__ = ["CapturedStep", "CudaGraph"]

log = logging.getLogger("dpgen")

#: eager calls before the capture (torch's examples warm up for a few iterations on a side stream)
WARMUP_CALLS = 2


class Graph(Protocol):
    """What :class:`CapturedStep` needs from a graph: capture ``fn`` on ``inputs`` (returning its outputs, the
    tensors every replay writes) and replay it."""

    def capture(self, fn: Callable[..., Any], inputs: list[torch.Tensor]) -> Any: ...

    def replay(self) -> None: ...


class CudaGraph:
    """``torch.cuda.CUDAGraph`` behind :class:`Graph`: the capture runs on torch's capture stream."""

    def __init__(self) -> None:
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, fn: Callable[..., Any], inputs: list[torch.Tensor]) -> Any:
        with torch.cuda.graph(self.graph):
            return fn(*inputs)

    def replay(self) -> None:
        self.graph.replay()


def _warm(fn: Callable[..., Any], args: tuple[torch.Tensor, ...]) -> Any:
    """``fn(*args)`` on a side stream, as torch requires of the calls before a capture."""
    side, current = torch.cuda.Stream(), torch.cuda.current_stream()
    side.wait_stream(current)
    with torch.cuda.stream(side):
        out = fn(*args)
    current.wait_stream(side)
    return out


def _signature(args: tuple[torch.Tensor, ...]) -> list[tuple]:
    return [(tuple(a.shape), a.dtype, a.device) for a in args]


class CapturedStep:
    """``fn`` replayed from a graph after ``warmup`` eager calls (module docstring). ``enabled``: False runs ``fn``
    eagerly always (the switch's off position); ``graph_factory``: makes the :class:`Graph` (default
    :class:`CudaGraph`, and then only for CUDA inputs; a CPU input runs eagerly). ``name`` is for the log."""

    def __init__(self, fn: Callable[..., Any], enabled: bool = True, name: str = "step",
                 graph_factory: Callable[[], Graph] | None = None, warmup: int = WARMUP_CALLS) -> None:
        self.fn, self.enabled, self.name, self.factory = fn, bool(enabled), name, graph_factory
        self.warmup = max(1, int(warmup))
        self.graph: Graph | None = None
        self.inputs: list[torch.Tensor] = []
        self.outputs: Any = None
        self.calls = 0
        self.failed: str | None = None

    @property
    def captured(self) -> bool:
        """Whether the calls now replay a graph."""
        return self.graph is not None

    def _eager(self, args: tuple[torch.Tensor, ...]) -> bool:
        if not self.enabled or self.failed is not None:
            return True
        return self.factory is None and not all(a.device.type == "cuda" for a in args)

    def __call__(self, *args: torch.Tensor) -> Any:
        if self._eager(args):
            return self.fn(*args)
        self.calls += 1
        if self.graph is None:
            if self.calls <= self.warmup:  # a warm-up call: its result is this call's result
                return _warm(self.fn, args) if self.factory is None else self.fn(*args)
            self._capture(args)
            if self.graph is None:
                return self.fn(*args)
        elif _signature(args) != _signature(tuple(self.inputs)):
            raise ValueError(f"{self.name}: a captured step takes the shapes it was captured with, "
                             f"{_signature(tuple(self.inputs))}, not {_signature(args)} (pad the batch)")
        for static, a in zip(self.inputs, args):
            static.copy_(a)
        self.graph.replay()
        return self.outputs

    def _capture(self, args: tuple[torch.Tensor, ...]) -> None:
        inputs = [a.detach().clone() for a in args]
        if self.factory is None:
            # the warm-up calls' blocks stay cached in the default pool, which the graph's private pool cannot use:
            # released first, a step sized to most of the free memory (feta.micro_batch=null) fits once, not twice
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        graph = (self.factory or CudaGraph)()
        try:
            outputs = graph.capture(self.fn, inputs)
        except Exception as exc:  # noqa: BLE001 - the eager step computes the same sums
            self.failed = f"{type(exc).__name__}: {exc}".splitlines()[0]
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            log.warning("%s: CUDA graph capture failed (%s); the step runs eagerly", self.name, self.failed)
            return
        self.graph, self.inputs, self.outputs = graph, inputs, outputs
        log.info("%s: captured as a CUDA graph; every later call replays it", self.name)
