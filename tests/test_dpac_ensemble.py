"""Batched discriminator ensemble vs a per-member loop; classifier re-initialisation and fake-then-real order."""
from __future__ import annotations

import importlib
from functools import partial

import pytest
import torch

from dpgen.dpac.classifier import train_classifier
from dpgen.gswgan.ensemble import critic_step
from dpgen.gswgan.nets import clf_init, disc_forward, disc_init
from dpgen.ensemble import NetStack
from dpgen.nets.spectral import sn_init

SHAPE = [1, 28, 28]


def _stack(k: int) -> NetStack:
    return NetStack(partial(disc_init, 10, SHAPE, 4), sn_init, k, torch.Generator().manual_seed(0), torch.device("cpu"))


def test_vmapped_critic_steps_match_a_per_discriminator_loop():
    m, b = 3, 5
    g = torch.Generator().manual_seed(1)
    steps = [(torch.rand(m, b, *SHAPE, generator=g), torch.randint(0, 10, (m, b), generator=g),
              torch.rand(m, b, *SHAPE, generator=g), torch.randint(0, 10, (m, b), generator=g),
              torch.rand(m, b, generator=g)) for _ in range(3)]
    batched, looped = _stack(m), _stack(m)
    for xr, yr, xf, yf, al in steps:
        critic_step(batched, disc_forward, torch.arange(m), xr, yr, xf, yf, al, 10.0, 1e-3, 1e-2, (0.5, 0.9))
        for i in range(m):  # one discriminator at a time, as the authors' one-process-per-D setup
            s = slice(i, i + 1)
            critic_step(looped, disc_forward, torch.tensor([i]), xr[s], yr[s], xf[s], yf[s], al[s], 10.0, 1e-3,
                        1e-2, (0.5, 0.9))
    moved = False
    for n in batched.params:
        torch.testing.assert_close(batched.params[n], looped.params[n], rtol=1e-4, atol=1e-5)
        moved |= not torch.allclose(batched.params[n], _stack(m).params[n])
    assert moved, "the steps must change the parameters"
    assert batched.t.tolist() == looped.t.tolist() == [3, 3, 3]


def test_selecting_one_member_leaves_the_others_untouched():
    st, ref = _stack(4), _stack(4)
    x = torch.rand(1, 5, *SHAPE)
    y = torch.randint(0, 10, (1, 5))
    critic_step(st, disc_forward, torch.tensor([2]), x, y, x.flip(0) * 0.5, y, torch.rand(1, 5), 10.0, 1e-3, 1e-2,
                (0.5, 0.9))
    for n in st.params:
        torch.testing.assert_close(st.params[n][[0, 1, 3]], ref.params[n][[0, 1, 3]])
        assert not torch.equal(st.params[n][2], ref.params[n][2]) or n == "lin.b" or n.endswith(".b")


def _clf() -> NetStack:
    return NetStack(partial(clf_init, 10, SHAPE, 4), sn_init, 1, torch.Generator().manual_seed(0), torch.device("cpu"))


def test_classifier_trains_on_fake_then_real():
    calls: list[str] = []

    def batch(kind):
        def fn():
            calls.append(kind)
            return torch.rand(6, *SHAPE), torch.arange(6) % 10
        return fn

    phases = train_classifier(_clf(), batch("fake"), batch("real"), 3, 2, "sequential", 10.0, 1e-3, (0.5, 0.9))
    assert phases == calls == ["fake"] * 3 + ["real"] * 2
    calls.clear()
    phases = train_classifier(_clf(), batch("fake"), batch("real"), 3, 2, "parallel", 10.0, 1e-3, (0.5, 0.9))
    assert phases == ["both"] * 3 and calls == ["fake", "real"] * 3


def _count_classifier_steps(tmp_path, monkeypatch, reinit: bool) -> tuple[list[int], list[int]]:
    """Adam steps taken so far by C when a training call starts: (the one-member template's calls, the calls on
    the sampled partitions' copies)."""
    from test_dpac_sanitizer import run_tiny

    tr = importlib.import_module("dpgen.dpac.method")  # DPAC's classifier phase
    template, copies = [], []
    orig = tr.train_classifier

    def spy(clf, *a, **k):
        if len(clf):
            (copies if k.get("stacked") else template).append(int(clf.t[0]))
        return orig(clf, *a, **k)

    monkeypatch.setattr(tr, "train_classifier", spy)
    # a kept C is allowed under the paper analysis and its one uniform partition only (see the test below)
    run_tiny(tmp_path, accounting="sound" if reinit else "paper", iters=5, partitions_per_iter=2 if reinit else 1,
             sampling="poisson" if reinit else "uniform",
             classifier={"reinit": reinit, "n_fake": 2, "n_real": 1, "start": 2})
    return template, copies


def test_classifier_is_reinitialised_every_iteration_from_t_c(tmp_path, monkeypatch):
    template, copies = _count_classifier_steps(tmp_path / "a", monkeypatch, True)
    assert template == [0, 0, 0], "fresh C at iterations 2, 3, 4"
    assert copies and set(copies) == {2}, "each sampled partition's C starts from the template's 2 fake steps"
    template, copies = _count_classifier_steps(tmp_path / "b", monkeypatch, False)
    assert template == [0, 3, 6] and copies == [], "reinit=false keeps training the one C"


@pytest.mark.parametrize("method", ["dpac", "efsgd"])
def test_a_kept_classifier_is_refused_under_sound_accounting(tmp_path, method):
    from dpgen.errors import DpgenError

    if method == "dpac":
        from test_dpac_sanitizer import run_tiny
    else:
        from test_efsgd_sanitizer import run_tiny
    with pytest.raises(DpgenError, match=rf"^{method}\.classifier\.reinit=false carries earlier partitions into C") as err:
        run_tiny(tmp_path, classifier={"reinit": False})
    assert "\n" not in str(err.value)
    assert not (tmp_path / "checkpoints").exists(), "nothing written"


@pytest.mark.parametrize("vmapped", [False, True])
def test_warm_up_generator_stack_equals_separate_generators(vmapped):
    """Each stacked warm-up generator computes, and learns, exactly what its own nn.Module would: same forward,
    same spectral-norm power iteration, same Adam step (on the loop and the vmap path)."""
    from dpgen.gswgan.ensemble import GeneratorStack
    from dpgen.gswgan.nets import ResNetGenerator

    m, b = 3, 4
    torch.manual_seed(0)
    stack = GeneratorStack(partial(ResNetGenerator, 10, SHAPE, 10, 8), m, torch.device("cpu"), 1e-2, (0.5, 0.9),
                           vmapped=vmapped)
    torch.manual_seed(0)
    nets = [ResNetGenerator(10, SHAPE, 10, 8) for _ in range(m)]
    opts = [torch.optim.Adam(n.parameters(), lr=1e-2, betas=(0.5, 0.9)) for n in nets]
    g = torch.Generator().manual_seed(1)
    z, y = stack.sample_z(b, g), torch.randint(0, 10, (m, b), generator=g)
    target = torch.rand(m, b, *SHAPE, generator=g)
    for _ in range(2):
        stack.step(lambda x: ((x - target) ** 2).sum(), z, y)
        for i, (net, opt) in enumerate(zip(nets, opts)):
            net.train()  # a training forward runs one power iteration, as GeneratorStack.step
            opt.zero_grad()
            ((net(z[i], y[i]) - target[i]) ** 2).sum().backward()
            opt.step()
    with torch.no_grad():
        out = stack(z, y)
        for i, net in enumerate(nets):
            torch.testing.assert_close(out[i], net.eval()(z[i], y[i]), rtol=1e-4, atol=1e-5)
            for name, t in net.state_dict().items():
                ref = stack.params.get(name, stack.buffers.get(name))
                torch.testing.assert_close(ref[i], t, rtol=1e-4, atol=1e-5, msg=name)
