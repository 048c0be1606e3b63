"""Device discipline on a CPU (issue 14 §2): what would crash or stall a CUDA run, found without a GPU.

Every method trains a few tiny steps, stops (debug.stop_after) and resumes under ``tests/discipline.py``'s
function/dispatch modes: a random factory given a run generator but no ``device=``, a tensor factory
without ``device=`` inside a step, more host syncs per step than the method's budget, a draw from the global
RNG inside a step, a restored checkpoint tensor used before it is placed on the run's device, and an optimizer
step on a gradient that carries an autograd graph all fail.
The first tests check the harness itself on toy loops (each rule fires at the right file:line, and stays
silent on the right code). ``pytest -s`` prints every method's report.
"""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from discipline import Report, checkpoint_tensors_marked, check_method, watch
from dpgen.privacy import PrivacyLedger

from conftest import in_memory_run

HERE = str(Path(__file__).resolve())

# ---- the budget ---------------------------------------------------------------------------------------------
#: Host syncs one training step may make (logging every log_every steps comes on top), and why. A sync
#: stalls the GPU's queue until it drains; the only ones a method cannot avoid are reading back the size of a
#: Poisson-sampled batch (every shape after it depends on it) and a data-dependent stop rule.
SYNC_BUDGET = {
    "dpgan": 1,  # one Poisson batch per discriminator step (n_critic = 1): nonzero() gives its size
    "gswgan": 1,  # the Poisson sample of partitions: nonzero() gives its size (the paper's one uniform draw: none)
    "dpac": 1,
    "efsgd": 1,
    "gpate": 1,  # vote counts read back once per iteration for the data-dependent (paper) RDP and its stop test
    "dpaf": 1,  # the sizes of log_every steps' Poisson samples, read back once per chunk (dpaf.mechanisms.PoissonSampler)
    "feta": 1,  # one Poisson batch per DP-SGD step; micro-batches then know their sizes (warm-up: none needed)
    "dpdm": 1,
}

#: case -> (method, stop_after, extra overrides, dataset). stop_after puts the resume where most state exists
#: (past dpac's classifier start, in feta's DP-SGD stage, in dpaf's phase 2).
CASES = {
    "dpgan": ("dpgan", 3, (), "digits"),
    "gswgan": ("gswgan", 3, (), "digits"),
    "dpac": ("dpac", 3, (), "digits"),
    "efsgd": ("efsgd", 3, (), "digits"),
    "gpate": ("gpate", 2, (), "digits"),
    "gpate-credit": ("gpate", 2, ("gpate.dp_class_prior=true", "gpate.proj_dim=5"), "credit"),
    "dpaf": ("dpaf", 4, ("dpaf.d_epochs=0.4",), "digits"),
    "feta": ("feta", 3, (), "digits"),
    "dpdm": ("dpdm", 2, ("feta.iters=3",), "digits"),
}

#: Methods whose fixes are pending (issue 14's method-side wave), with what they break today as (file, kind).
#: test_device_discipline fails when a pending method passes (move it out) or breaks a rule in a new place.
#: Violations recorded on this branch (file:line, kind, count per step; "setup" = before the first step,
#: "resume" = restored tensors used off the run's device), regenerate with
#: ``pytest -s tests/test_device_discipline.py -k "test_device_discipline"``:
#:
#: dpgan (1 sync/step, within budget 1: train.py:28 nonzero, the Poisson batch; main's e23f3b4 removed the two
#:     .item() per step): dpgan/train.py:119 factory-without-device torch.zeros(()) (loss placeholder after
#:     Run.start, before step 1).
#: gswgan (3/step, budget 0): dpac/train.py:328 int(k), :333 float(loss_d.mean()), :357 float(loss) 1/step each;
#:     setup: dpac/nets.py:85,101,103,111,118 generator-without-device torch.randn (crash on CUDA);
#:     resume: dpac/ensemble.py:66-67 keeps the checkpoint's CPU tensors, used at ensemble.py:46-55,79,94,100
#:     and dpac/nets.py:134-155.
#: dpac: as gswgan, plus in every classifier reset (each step): dpac/nets.py:85,111,118 generator-without-device
#:     and dpac/nets.py:86,112 factory-without-device torch.zeros.
#: efsgd (5/step, budget 0): efsgd/train.py:141,169,248,255,260 syncs 1/step each; setup and classifier reset as
#:     dpac, plus efsgd/nets.py:65 generator-without-device; resume: efsgd/sanitizer.py:85-86 keeps the error
#:     state on the CPU (used at sanitizer.py:71, privacy/mechanisms.py:38,41), the encoder NetStack
#:     (efsgd/nets.py:72, efsgd/train.py:134,139) and the ensemble as dpac.
#: gswgan, dpac, efsgd: fixed (issue 12): no per-step sync, generators and restored states on the run's device.
#: gpate, gpate-credit: fixed (issue 13): no per-step sync. Before: gpate (7/step, budget 1): gpate/aggregate.py:85 int, :91,:92 .cpu(), :93,:94 float; gpate/ensemble.py:92 float;
#:     gpate/train.py:229 loss_g.item() (1/step each).
#: gpate-credit: as gpate, plus setup: gpate/train.py:90 generator-without-device torch.rand (class prior).
#: dpaf: fixed (issue 16): one sync per log_every steps (the Poisson chunk's sizes), seeded compression draws.
#: feta, dpdm: fixed (issue 16): one sync per step, feta/central.py poisson_batch's nonzero (the Poisson batch).
PENDING: dict[str, set[tuple[str, str]]] = {
}


@pytest.fixture(scope="module")
def credit(tmp_path_factory):
    from fixtures_data import make_credit

    from dpgen.data import load_dataset

    root = tmp_path_factory.mktemp("credit")
    make_credit(root, n=200, n_fraud=40)
    return load_dataset("credit", str(root))


@pytest.mark.parametrize("case", list(CASES))
def test_device_discipline(case, tmp_path, request, one_torch_thread):
    method, stop_after, overrides, dataset = CASES[case]
    data = request.getfixturevalue("credit") if dataset == "credit" else None
    report = check_method(method, tmp_path, stop_after, *overrides, data=data)
    report.method = case
    print("\n" + report.table())
    assert report.steps and report.restored is not None, f"{case}: no training step observed"
    budget = SYNC_BUDGET[method]
    if case in PENDING:
        assert report.problems(budget), f"{case} passes the device discipline now: remove it from PENDING"
        new = report.problem_kinds(budget) - PENDING[case]
        assert not new, f"{case} breaks the device discipline in new places {sorted(new)}:\n{report.table()}"
    else:
        assert not report.problems(budget), report.table()


def test_every_method_is_checked():
    from tiny import METHODS

    assert {m for m, *_ in CASES.values()} == set(METHODS) == set(SYNC_BUDGET)
    assert set(PENDING) <= set(CASES)


# ---- the harness itself, on toy loops -----------------------------------------------------------------------
def _line(marker: str) -> str:
    """``tests/test_device_discipline.py:<n>`` of the line carrying ``# <marker>``."""
    lines, start = inspect.getsourcelines(inspect.getmodule(_line))
    n = next(i for i, text in enumerate(lines, start=start or 1) if text.rstrip().endswith(f"# {marker}"))
    return f"tests/test_device_discipline.py:{n}"


def _toy(run, variant: str) -> None:
    """Three steps of a toy loop; ``variant`` picks what each step does wrong (or right)."""
    dev, g = run.device, run.rng("toy")
    host_g = torch.Generator().manual_seed(0)  # a CPU generator on purpose
    w = torch.zeros(3, device=dev)
    net = torch.nn.Linear(3, 1).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    if variant == "bad":
        torch.randn(2, generator=g)  # SETUP-GEN
    torch.zeros(2)  # SETUP-ZEROS (harmless in setup: not counted)
    run.start(3, "toy")
    for step in range(1, 4):
        x = torch.randn(3, generator=g, device=dev)
        if variant == "bad":
            torch.randn(3, generator=g)  # GEN
            torch.ones(3)  # FACTORY
            float(x.sum())  # FLOAT
            (x > 0).nonzero()  # NONZERO
            x[x > 0]  # MASK
            torch.rand(2)  # GLOBAL
        elif variant == "hook":
            y = x.clone().requires_grad_(True)
            y.register_hook(lambda grad: grad * float(grad.sum()))  # HOOK
            (y * 2).sum().backward()
        elif variant == "graph":
            scale = x.sum().requires_grad_(True)
            for p in net.parameters():
                p.grad = p.detach() * scale  # a gradient that carries a graph (scale's)
            opt.step()  # GRAPH
        elif variant == "fine":
            net(x[None]).sum().backward()
            opt.step()  # a gradient from backward() has no graph
            opt.zero_grad()
            u = torch.randperm(5, generator=host_g)  # host tensor on purpose: no device needed
            u.tolist(), int(torch.randint(3, (1,), generator=host_g)), x.cpu().numpy()  # CPU
            torch.nn.functional.one_hot(torch.tensor([1, 2], device=dev), 4)
            w += x
        run.step_done(step, {"loss": x.sum()}, lambda: {"w": w})
    run.finish(3, {"w": w})


def _watch_toy(tmp_path, variant: str, **run_kwargs) -> Report:
    report = Report(variant)
    with watch(report, roots=(HERE,)):
        run = in_memory_run(tmp_path, PrivacyLedger(1e-5, target_epsilon=1.0), log_every=1, **run_kwargs)
        try:
            _toy(run, variant)
        finally:
            run.close()
    return report


def test_harness_attributes_each_rule_to_its_line(tmp_path):
    r = _watch_toy(tmp_path, "bad")
    found = {(v.kind, v.site): n for v, n in r.all().items()}
    assert found[("generator-without-device", _line("SETUP-GEN"))] == 1
    assert found[("generator-without-device", _line("GEN"))] == 3
    assert found[("factory-without-device", _line("FACTORY"))] == 3
    assert found[("global-rng", _line("GLOBAL"))] == 3
    for marker in ("FLOAT", "NONZERO", "MASK"):
        assert found[("sync", _line(marker))] == 3, marker
    assert r.syncs_per_step() == [3, 3, 3]  # logging every step (log_every=1) inside step_done is not counted
    assert not any(v.site == _line("SETUP-ZEROS (harmless in setup: not counted)") for v in r.all())
    assert r.problems(3) and r.problems(2)[-1].startswith("3 host syncs")


def test_harness_sees_syncs_inside_backward_hooks(tmp_path):
    r = _watch_toy(tmp_path, "hook")
    assert r.syncs_per_step() == [1, 1, 1]
    assert {v.site for v in r.all()} == {_line("HOOK")}


def test_harness_sees_an_optimizer_step_on_a_gradient_that_carries_a_graph(tmp_path):
    r = _watch_toy(tmp_path, "graph")
    assert {(v.kind, v.site, v.op): n for v, n in r.all().items()} == {("graph-in-grad", _line("GRAPH"), "SGD.step"): 3}
    assert r.problems(0)


def test_harness_is_silent_on_disciplined_code(tmp_path):
    r = _watch_toy(tmp_path, "fine")
    # x.cpu() is one sync per step; the CPU generator's draws, their .tolist()/int() and one_hot(y, k) are not
    assert r.syncs_per_step() == [1, 1, 1] and {v.site for v in r.all()} == {_line("CPU")}
    assert r.problems(1) == []


def _resume_toy(tmp_path, use: str) -> Report:
    """A run that saved ``state`` (a linear layer, its Adam state, a plain tensor) and resumes using it via ``use``."""
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(net.parameters())
    net(torch.ones(1, 3)).sum().backward()
    opt.step()
    first = in_memory_run(tmp_path, PrivacyLedger(1e-5, target_epsilon=1.0))
    first.save_checkpoint(1, {"net": net.state_dict(), "opt": opt.state_dict(), "w": torch.ones(3)})
    report = Report(use)
    with watch(report, roots=(HERE,)), checkpoint_tensors_marked():
        run = in_memory_run(tmp_path, PrivacyLedger(1e-5, target_epsilon=1.0), resume=True)
        state = run.resume_state["state"]
        net2, dev = torch.nn.Linear(3, 2).to(run.device), run.device
        opt2 = torch.optim.Adam(net2.parameters())
        net2.load_state_dict(state["net"])
        opt2.load_state_dict(state["opt"])
        w = state["w"] if use == "kept" else state["w"].to(dev)
        run.start(2, "toy")
        net2(w[None]).sum().backward()  # USE
        opt2.step()
        run.step_done(2, {}, lambda: {})
        run.close()
    return report


def test_restored_tensors_must_reach_the_run_device(tmp_path):
    moved = _resume_toy(tmp_path / "a", "moved")
    assert not moved.restored, moved.table()  # load_state_dict (module and Adam) and .to(device) place them
    kept = _resume_toy(tmp_path / "b", "kept")
    assert {(v.kind, v.site) for v in kept.restored} == {("restored-off-device", _line("USE"))}


def test_run_converts_logged_tensors_only_every_log_every_steps(tmp_path):
    """The pattern methods should follow: hand step_done tensors, Run reads them back on log steps only."""
    from torch.overrides import TorchFunctionMode

    syncs: list[int] = []

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in ("__float__", "item"):
                syncs[-1] += 1
            return func(*args, **(kwargs or {}))

    run = in_memory_run(tmp_path, PrivacyLedger(1e-5, target_epsilon=1.0), log_every=3, checkpoint_every=100)
    run.start(6, "toy")
    loss = torch.tensor(0.5)
    with Count():
        for step in range(1, 7):
            syncs.append(0)
            run.step_done(step, {"loss": loss, "other": loss * 2}, lambda: {})
    run.close()
    assert syncs == [0, 0, 2, 0, 0, 2]
