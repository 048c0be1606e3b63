"""The captured micro-batch step (dpgen/core/graph.py, ``feta.cuda_graph``) on a CPU: the static-input plumbing with
a replaying fake graph, which (like a CUDA graph) computes only on replay, reads only the tensors it was captured
on and writes the same output tensors every time. The real capture runs in tests/test_gpu.py (``-m gpu``)."""
from __future__ import annotations

import logging

import pytest
import torch

from dpgen.core.graph import CapturedStep
from dpgen.feta.dpsgd import MicroStep, clipped_grad_sum_func
from dpgen.nets.edm import EDMDenoiser
from dpgen.nets.unet import UNet
from dpgen.privacy.randomness import secret_generator

RTOL = 1e-5


def _outs(t):
    return [x for o in t for x in (o if isinstance(o, (list, tuple)) else [o])]


class ReplayGraph:
    """A CPU stand-in for torch.cuda.CUDAGraph: capture keeps ``fn`` and its static inputs and returns output tensors
    left empty (a capture computes nothing); replay recomputes from the static inputs into those same tensors."""

    captures = 0

    def capture(self, fn, inputs):
        ReplayGraph.captures += 1
        self.fn, self.inputs = fn, inputs
        self.outputs = fn(*inputs)
        for o in _outs(self.outputs):
            o.detach().fill_(float("nan"))  # nothing is computed by a capture
        return self.outputs

    def replay(self):
        for o, n in zip(_outs(self.outputs), _outs(self.fn(*self.inputs))):
            o.detach().copy_(n)


class FailingGraph:
    def capture(self, fn, inputs):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    def replay(self):  # pragma: no cover - never captured
        raise AssertionError


def _fn(a, b):
    return [a * 2 + b, (a * b).sum()]


def test_replays_compute_every_call_from_its_own_inputs():
    step = CapturedStep(_fn, graph_factory=ReplayGraph)
    seen = []
    for i in range(5):
        a, b = torch.full((3,), float(i)), torch.arange(3.0) + i
        out = step(a, b)
        want = _fn(a, b)
        assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])
        seen.append(out[0])
    assert step.captured and step.calls == 5
    assert seen[2] is seen[4] and seen[1] is not seen[2]  # the warm-ups' own tensors, then the graph's static ones


def test_a_captured_step_refuses_another_shape():
    step = CapturedStep(_fn, graph_factory=ReplayGraph)
    for _ in range(3):
        step(torch.ones(3), torch.ones(3))
    with pytest.raises(ValueError, match="pad the batch"):
        step(torch.ones(4), torch.ones(4))


def test_a_failed_capture_runs_eagerly_with_one_log_line(caplog):
    step = CapturedStep(_fn, graph_factory=FailingGraph, name="unit")
    with caplog.at_level(logging.WARNING, logger="dpgen"):
        outs = [step(torch.full((2,), float(i)), torch.ones(2)) for i in range(4)]
    assert not step.captured and step.failed.startswith("RuntimeError: operation not permitted")
    assert [float(o[1]) for o in outs] == [0.0, 2.0, 4.0, 6.0]  # two warm-ups, the failed capture, then eager
    assert sum("capture failed" in r.message for r in caplog.records) == 1


def test_off_or_on_a_cpu_without_a_fake_the_function_runs_directly():
    calls = []

    def fn(a):
        calls.append(a)
        return [a + 1]
    for step in (CapturedStep(fn, enabled=False, graph_factory=ReplayGraph), CapturedStep(fn)):
        for _ in range(3):
            step(torch.zeros(2))
        assert not step.captured and step.calls == 0
    assert len(calls) == 6


def _unet() -> EDMDenoiser:
    torch.manual_seed(0)
    return EDMDenoiser(UNet(1, 8, 3, nf=4, ch_mult=[1, 2], num_res_blocks=1, attn_res=[4]))


@pytest.mark.parametrize("backend", ["ghost", "torch_func"])
def test_captured_feta_step_equals_the_eager_one_over_poisson_batches(backend):
    """Three logical batches of 7 records in micro-batches of 3 (a remainder of 1, padded to 3 with weight 0): the
    replayed step's clipped sums and loss equal the eager step's, batch by batch; different draws give different
    sums (a replay does not reuse the captured draws)."""
    net, k, clip = _unet(), 2, 0.02
    eager = MicroStep(net, clip, grad_backend=backend)
    graphed = MicroStep(net, clip, grad_backend=backend, graph=True, graph_factory=ReplayGraph)
    seen = []
    for b in range(3):
        x = torch.rand(7, 1, 8, 8, generator=torch.Generator().manual_seed(b)) * 2 - 1
        y = torch.tensor([0, 1, 2, 3, 1, 0, 2])
        got = {}
        for name, step in (("eager", eager), ("graph", graphed)):
            got[name] = clipped_grad_sum_func(net, x, y, k, clip, 3, secret_generator("cpu", seed=10 + b), step=step)
        (se, le), (sg, lg) = got["eager"], got["graph"]
        for a, e in zip(sg, se):
            assert float((a - e).norm() / e.norm()) < RTOL
        assert abs(float(lg - le)) <= RTOL * abs(float(le))
        seen.append(torch.cat([s.flatten() for s in sg]))
    assert graphed.fn.captured and graphed.fn.calls == 9
    assert not torch.allclose(seen[0], seen[1]) and not torch.allclose(seen[1], seen[2])


def test_captured_feta_step_pads_every_micro_batch_to_the_cap():
    shapes = []
    step = MicroStep(_unet(), 0.02, grad_backend="ghost", graph=True, graph_factory=ReplayGraph)
    inner = step.fn.fn
    step.fn.fn = lambda w, *b: (shapes.append((tuple(w.shape), float(w.sum()))), inner(w, *b))[1]
    x = torch.rand(7, 1, 8, 8) * 2 - 1
    clipped_grad_sum_func(step.denoiser, x, torch.zeros(7, dtype=torch.long), 2, 0.02, 3,
                          secret_generator("cpu", seed=1), step=step)
    # the warm-up calls, the capture (its fn call and the first replay's), then the remainder's replay
    assert shapes[0] == ((3,), 3.0) and shapes[-1] == ((3,), 1.0)
    assert {s for s, _ in shapes} == {(3,)}


@pytest.mark.parametrize("method", ["feta", "dpdm"])
def test_a_checkpoint_from_before_the_switches_resumes_with_their_defaults(method):
    """A checkpoint whose fingerprint predates ``feta.ghost_conv`` and ``feta.cuda_graph`` reads as one with their
    defaults (LATER_KEYS): it resumes with them, and is refused with another value, as any changed setting is."""
    from tiny import compose_cfg

    from dpgen.core.checkpoint import fingerprint_diff
    from dpgen.core.pipeline import fingerprint

    now = fingerprint(compose_cfg(method))
    old = {**now, "hparams": {k: v for k, v in now["hparams"].items() if k not in ("ghost_conv", "cuda_graph")}}
    assert now["hparams"]["ghost_conv"] == "auto" and now["hparams"]["cuda_graph"] is False
    assert fingerprint_diff(old, now) is None
    assert "hparams" in fingerprint_diff(old, fingerprint(compose_cfg(method, "feta.cuda_graph=true")))


def test_a_dpgan_checkpoint_from_before_grad_backend_resumes_with_opacus():
    """The same reading for dpgan: a fingerprint without ``grad_backend`` ran opacus' hooks (LATER_KEYS), so it
    resumes with ``dpgan.grad_backend=opacus`` and is refused with today's default, ghost."""
    from tiny import compose_cfg

    from dpgen.core.checkpoint import fingerprint_diff
    from dpgen.core.pipeline import fingerprint

    hooks = fingerprint(compose_cfg("dpgan", "dpgan.grad_backend=opacus"))
    old = {**hooks, "hparams": {k: v for k, v in hooks["hparams"].items() if k != "grad_backend"}}
    assert fingerprint_diff(old, hooks) is None
    assert "hparams" in fingerprint_diff(old, fingerprint(compose_cfg("dpgan")))
