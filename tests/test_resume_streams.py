"""A resumed run continues its secret streams; it never replays them.

Every secret draw a mechanism makes (Gaussian noise, Poisson samples, partition draws) is recorded in three runs
with one ``privacy.noise_seed``: uninterrupted, stopped by ``debug.stop_after``, and resumed from its checkpoint
(the resumed run takes its streams from the checkpoint, not from the seed). The draws before the stop followed by
those after the restore must be the uninterrupted run's draws, one for one; no noise drawn after the restore may
equal one drawn before it (a replay: the same noise twice on different data cancels in a difference of releases);
the secret streams' states at every resumed step are the uninterrupted run's; the ledger, ε and the released
generator are the uninterrupted run's.

:func:`check_resume_continues_the_secret_streams` is device-agnostic: here on the CPU (bit for bit), and on CUDA by
``tests/test_gpu.py`` (``pytest -m gpu``), where a replay of the CUDA streams after a restore would otherwise pass.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pytest
import torch

from dpgen.core.run import Run, TrainingInterrupted
from dpgen.privacy.sampling import PoissonSampler

#: the entry points that draw from a secret stream (dpgen.privacy), patched wherever dpgen imported them; a
#: PoissonSampler's draws are recorded per step (its __call__): a resumed sampler draws its current chunk again from
#: the chunk's own fork, by design, and hands out that chunk's remaining rows
SECRET_DRAWS = ("gaussian_noise", "poisson_batch", "uniform_member")


def _draw_functions() -> dict[str, Callable]:
    import dpgen.privacy.randomness as randomness
    import dpgen.privacy.sampling as sampling

    return {name: getattr(randomness if name == "gaussian_noise" else sampling, name) for name in SECRET_DRAWS}


_ORIGINALS = _draw_functions()


def _recording(name: str, fn: Callable) -> Callable:
    """``fn``, recording its output in the active :class:`SecretDrawLog` (none active: it only calls ``fn``). One
    per entry point for the whole session, so a module first imported while a log was active keeps no stale one."""
    def recorded(*a, **k):
        out = fn(*a, **k)
        if SecretDrawLog.active is not None:
            SecretDrawLog.active.draws.append((name, [t.detach().clone() for t in (out if isinstance(out, list)
                                                                                    else [out])]))
        return out
    return recorded


_RECORDING = {name: _recording(name, fn) for name, fn in _ORIGINALS.items()}


class SecretDrawLog:
    """Records, in order, every secret draw and the secret streams' states after every step (``monkeypatch``
    undoes it)."""

    active: "SecretDrawLog | None" = None

    def __init__(self, monkeypatch) -> None:
        from dpgen.core.methods import METHODS, load_method

        for info in METHODS.values():  # every method's modules imported before any is patched
            load_method(info.module)
        self.draws: list[tuple[str, list[torch.Tensor]]] = []
        self.states: dict[int, dict[str, torch.Tensor]] = {}
        monkeypatch.setattr(SecretDrawLog, "active", self)
        for mod in [m for n, m in list(sys.modules.items()) if n.startswith("dpgen") and m is not None]:
            for name, fn in _ORIGINALS.items():
                if getattr(mod, name, None) is fn:
                    monkeypatch.setattr(mod, name, _RECORDING[name])
        monkeypatch.setattr(PoissonSampler, "__call__", _recording("PoissonSampler", PoissonSampler.__call__))
        orig_step_done = Run.step_done
        log = self

        def step_done(run, step, scalars, state_fn):
            log.states[int(step)] = {k: v.clone() for k, v in run.streams.state_dict()["secret"].items()}
            return orig_step_done(run, step, scalars, state_fn)

        monkeypatch.setattr(Run, "step_done", step_done)


def train_on(device: torch.device, method: str, run_dir: Path, *overrides: str, data=None, **run_kwargs):
    """``method``'s tiny run (``tiny.TINY``) on ``device`` with one torch thread; ``(generator, ledger, run)``."""
    from dpgen.core.methods import load_method
    from dpgen.core.pipeline import seed_everything
    from dpgen.data import load_dataset
    from dpgen.privacy import PrivacyLedger, parse_epsilon
    from tiny import compose_cfg

    cfg = compose_cfg(method, *overrides)
    data = load_dataset("digits", str(run_dir / "data")) if data is None else data
    ledger = PrivacyLedger(delta=float(cfg.delta), target_epsilon=parse_epsilon(cfg.eps),
                           accountant=cfg.privacy.accountant, accounting=cfg.privacy.accounting)
    run = Run(run_dir, ledger, device, 0, {}, progress=False, tensorboard=False, log_every=10**9,
              checkpoint_every=10**9, secure_noise=bool(cfg.privacy.secure_noise), **run_kwargs)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # bit-exact comparisons on the CPU need one thread count in every run
    seed_everything(0)
    try:
        gen = load_method(cfg.method.module).train(cfg[cfg.method.hparams], data, ledger, run)
    finally:
        run.close()
        torch.set_num_threads(threads)
    return gen, ledger, run


def _noise(log: SecretDrawLog) -> list[torch.Tensor]:
    """The Gaussian noise tensors drawn, all-zero ones (σ = 0) left out."""
    return [ts[0] for name, ts in log.draws if name == "gaussian_noise" and ts[0].numel() and ts[0].any()]


def check_resume_continues_the_secret_streams(device: torch.device, method: str, tmp_path: Path, monkeypatch,
                                              stop: int, *overrides: str, data=None, weights_tol=None) -> None:
    """The checks of the module docstring for ``method`` stopped after step ``stop`` on ``device``.

    ``weights_tol``: (rtol, atol) for the released generator's weights (None: bit for bit). The draws, streams,
    ledger and ε are compared exactly on every device: they depend on the secret streams alone."""
    seed = 17
    runs = {}
    for name, kwargs in (("full", {"noise_seed": seed}), ("cut", {"noise_seed": seed, "stop_after": stop}),
                         ("resumed", {"resume": True})):
        with monkeypatch.context() as m:
            log = SecretDrawLog(m)
            run_dir = tmp_path / ("full" if name == "full" else "cut")
            if name == "cut":
                with pytest.raises(TrainingInterrupted):
                    train_on(device, method, run_dir, *overrides, data=data, **kwargs)
                runs[name] = (None, None, log)
            else:
                gen, ledger, run = train_on(device, method, run_dir, *overrides, data=data, **kwargs)
                runs[name] = (gen, ledger, log)
                if name == "resumed":
                    assert run.start_step == stop, "the resumed run starts where the cut one stopped"
    (full_gen, full_ledger, full), (_, _, cut), (gen, ledger, resumed) = runs["full"], runs["cut"], runs["resumed"]

    # no noise drawn after the restore replays noise drawn before it
    assert cut.draws and resumed.draws, "both parts of the interrupted run drew secret randomness"
    before, after = _noise(cut), _noise(resumed)
    assert before and after, "noise drawn on both sides of the restore"
    for j, x in enumerate(after):
        for k, y in enumerate(before):
            assert not (x.shape == y.shape and torch.equal(x, y)), \
                f"noise draw {j} after the restore replays noise draw {k} before it"
    # the draws before the stop, then those after the restore, are the uninterrupted run's, one for one
    both = cut.draws + resumed.draws
    assert [n for n, _ in both] == [n for n, _ in full.draws], "the same secret draws, in the same order"
    for i, ((name, got), (_, want)) in enumerate(zip(both, full.draws)):
        part = "before the stop" if i < len(cut.draws) else "after the restore"
        assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want)), \
            f"secret draw {i} ({name}, {part}) differs from the uninterrupted run's"
    # the secret streams' states after every resumed step are the uninterrupted run's (a stream of a finished phase,
    # say dpaf's phase-1 sampling, is not handed out again)
    assert resumed.states and min(resumed.states) == stop + 1
    for step, states in resumed.states.items():
        assert states and states.keys() <= full.states[step].keys()
        for name, state in states.items():
            assert torch.equal(state, full.states[step][name]), f"secret stream {name!r} after step {step}"
    # the same ledger, ε and released generator
    assert [e.to_dict() for e in ledger.entries] == [e.to_dict() for e in full_ledger.entries]
    assert ledger.epsilon() == pytest.approx(full_ledger.epsilon(), rel=1e-12)
    ref = full_gen.state_dict()
    for k, v in gen.state_dict().items():
        rtol, atol = weights_tol or (0, 0)
        torch.testing.assert_close(v, ref[k], rtol=rtol, atol=atol, msg=f"{method}: generator weight {k} differs")


@pytest.mark.parametrize("method, stop, overrides", [("dpgan", 3, ()), ("dpaf", 4, ("dpaf.d_epochs=0.4",))])
def test_resume_continues_the_secret_streams_on_the_cpu(method, stop, overrides, tmp_path, monkeypatch):
    check_resume_continues_the_secret_streams(torch.device("cpu"), method, tmp_path, monkeypatch, stop, *overrides)
