"""The batched teacher ensemble equals a per-teacher loop; partitions are per-record; training's ledger."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from dpgen.gpate.ensemble import PartitionSampler, TeacherEnsemble, assign_teachers
from dpgen.gpate.nets import TeacherCNN, TeacherMLP

from conftest import in_memory_run


def _loop_input_grads(ens: TeacherEnsemble, make, x, y):
    out = []
    for i in range(ens.n):
        t = make()
        t.load_state_dict({k: v.detach().clone() for k, v in ens.teacher_params(i).items()})
        xi = x.clone().requires_grad_(True)
        loss = F.binary_cross_entropy_with_logits(t(xi, y), torch.ones(len(x)), reduction="sum")
        (g,) = torch.autograd.grad(loss, xi)
        out.append(-g)
    return torch.stack(out)


@pytest.mark.parametrize("chunk", [None, 2])
def test_batched_teachers_match_a_per_teacher_loop(chunk):
    torch.manual_seed(0)
    make = lambda: TeacherCNN(3, [1, 12, 12], df_dim=4, dfc_dim=8)  # noqa: E731
    ens = TeacherEnsemble(make, 5, torch.device("cpu"), chunk=chunk, seed=1)
    x, y = torch.rand(4, 1, 12, 12), torch.randint(0, 3, (4,))
    batched = torch.cat([g for _, _, g in ens.input_grads_chunks(x, y)])
    torch.testing.assert_close(batched, _loop_input_grads(ens, make, x, y), rtol=1e-4, atol=1e-6)
    # one training step: stacked Adam == per-teacher Adam
    xr, yr = torch.rand(5, 3, 1, 12, 12), torch.randint(0, 3, (5, 3))
    w = torch.ones(5, 3)
    refs = []
    for i in range(5):
        t = make()
        t.load_state_dict({k: v.detach().clone() for k, v in ens.teacher_params(i).items()})
        opt = torch.optim.Adam(t.parameters(), lr=1e-3, betas=(0.5, 0.999))
        loss = F.binary_cross_entropy_with_logits(t(xr[i], yr[i]), torch.ones(3)) + \
            F.binary_cross_entropy_with_logits(t(x, y), torch.zeros(4))
        loss.backward()
        opt.step()
        refs.append(t.state_dict())
    ens.train_step(xr, yr, w, x, y)
    for i in range(5):
        for k, v in refs[i].items():
            if k in ("conv2.bias", "fc1.bias"):
                # followed by batch-stat normalisation: the true gradient is 0 and Adam turns float
                # rounding noise into ±lr steps, differently in any two implementations
                continue
            torch.testing.assert_close(ens.teacher_params(i)[k], v, rtol=1e-4, atol=1e-6)


def test_mlp_teachers_batched_forward():
    make = lambda: TeacherMLP(2, [6], hidden=8)  # noqa: E731
    ens = TeacherEnsemble(make, 3, torch.device("cpu"), seed=0)
    x, y = torch.randn(5, 6), torch.randint(0, 2, (5,))
    out = ens.forward(ens.params, x, y, shared_input=True)
    t = make()
    ref = torch.stack([functional_call(t, ens.teacher_params(i), (x, y)) for i in range(3)])
    torch.testing.assert_close(out, ref)


def test_teacher_assignment_depends_only_on_the_record():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (300, 1, 4, 4), dtype=np.uint8)
    owner = assign_teachers(x, 7, seed=3)
    owner_minus = assign_teachers(x[1:], 7, seed=3)
    assert torch.equal(owner[1:], owner_minus), "removing a record must not move any other record"
    assert set(owner.tolist()) == set(range(7))
    assert not torch.equal(owner, assign_teachers(x, 7, seed=4))
    s = PartitionSampler(owner, 7, torch.device("cpu"))
    idx, w = s.sample(5, torch.Generator().manual_seed(0))
    assert idx.shape == (7, 5) and (owner[idx] == torch.arange(7)[:, None]).all(), "a teacher sees only its part"
    assert (w == 1).all()
    empty = PartitionSampler(torch.tensor([0, 0, 2]), 3, torch.device("cpu"))
    _, w = empty.sample(4, torch.Generator().manual_seed(0))
    assert empty.n_empty == 1 and (w[1] == 0).all() and (w[[0, 2]] == 1).all()


def _toy(n=400, tabular=False):
    from dpgen.data.base import ImageDataset, Split

    rng = np.random.default_rng(0)
    if tabular:
        x = rng.normal(size=(n, 6)).astype(np.float32)
    else:
        x = rng.integers(0, 256, (n, 1, 28, 28), dtype=np.uint8)
    split = Split(x, rng.integers(0, 2 if tabular else 10, n).astype(np.int64))
    return ImageDataset("toy", split, split, [str(i) for i in range(2 if tabular else 10)], tabular=tabular)


def _hp(**kw):
    from omegaconf import OmegaConf

    base = {"teachers": 8, "noise": "readme", "sigma1": 400.0, "sigma2": 100.0, "thresh": 0.5, "step_size": 1e-4,
            "bins": 10, "proj_dim": 3, "batch_size": 4, "iters": 1000, "teacher_warmup": 1, "d_steps": 1, "lr": 1e-3,
            "betas": [0.5, 0.999], "z_dim": 8, "gf_dim": 4, "gfc_dim": 16, "df_dim": 4, "dfc_dim": 8, "g_hidden": 16,
            "t_hidden": 8, "chunk": None, "dp_class_prior": False, "prior_eps": 0.01}
    base.update(kw)
    return OmegaConf.create(base)


def test_training_ledger_counts_match_queries_and_meet_the_target(tmp_path):
    from dpgen.gpate import train
    from dpgen.privacy import PrivacyLedger

    ledger = PrivacyLedger(delta=1e-5, target_epsilon=0.5)
    run = in_memory_run(tmp_path, ledger)
    gen = train(_hp(), _toy(), ledger, run)
    (e,) = ledger.entries
    steps = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=False)["step"]
    assert e.name == "gpate.confident_gnmax" and e.sampling == "none"
    assert e.noise_multipliers == pytest.approx([400.0, 100.0 / 2 ** 0.5])
    assert e.count == steps * 4 * 3 > 0, "one threshold check + one argmax per sample × dimension × iteration"
    assert ledger.epsilon() <= 0.5
    assert ledger.epsilon(extra=[type(e)(e.name, e.noise_multipliers, count=12)]) > 0.5, "stopped by the budget"
    x, _ = gen.sample(6)
    assert x.shape == (6, 1, 28, 28) and 0 <= x.min() and x.max() <= 1
    assert set(gen.state_dict()) == set(type(gen)(**gen.init_kwargs).state_dict()), "only the generator"


def test_paper_accounting_and_credit_prior(tmp_path):
    from dpgen.gpate import train
    from dpgen.privacy import PrivacyLedger

    ledger = PrivacyLedger(delta=1e-5, target_epsilon=3.0, accounting="paper")
    run = in_memory_run(tmp_path, ledger)
    gen = train(_hp(iters=3, dp_class_prior=True, noise="calibrate", sigma1=None, sigma2=None), _toy(tabular=True),
                ledger, run)
    lap, q = ledger.entries
    assert (lap.name, lap.mechanism, lap.noise_multipliers, lap.count) == ("gpate.class_prior", "laplace", [100.0], 1)
    assert q.count == 3 * 4 * 3
    assert ledger.paper_epsilon is not None and not ledger.valid_dp_guarantee
    paper_eps, sound_eps = ledger.report_epsilon(), ledger.epsilon()
    assert 0.01 < paper_eps and sound_eps <= 3.0
    assert any("NOT a differential-privacy guarantee" in n for n in ledger.notes)
    assert gen.init_kwargs["class_prior"] is not None and abs(sum(gen.init_kwargs["class_prior"]) - 1) < 1e-9
    x, _ = gen.sample(5)
    assert x.shape == (5, 6) and torch.isfinite(x).all()


@pytest.mark.parametrize("shared", [True, False])
def test_stacked_forward_matches_the_vmap_path_and_the_module(shared):
    """Grouped-conv ``stacked_forward`` (with the per-class label-map responses) == vmap(functional_call)."""
    torch.manual_seed(2)
    make = lambda: TeacherCNN(4, [2, 9, 9], df_dim=3, dfc_dim=5)  # noqa: E731  odd size: border effects matter
    ens = TeacherEnsemble(make, 3, torch.device("cpu"), seed=0)
    if shared:
        x, y = torch.rand(6, 2, 9, 9), torch.randint(0, 4, (6,))
    else:  # per-teacher inputs AND labels: each teacher must read its own class responses
        x, y = torch.rand(3, 6, 2, 9, 9), torch.randint(0, 4, (3, 6))
    fast = ens.forward(ens.params, x, y, shared_input=shared)
    ens.use_stacked = False
    slow = ens.forward(ens.params, x, y, shared_input=shared)
    t = make()
    ref = torch.stack([functional_call(t, ens.teacher_params(i), (x if shared else x[i], y if shared else y[i]))
                       for i in range(3)])
    torch.testing.assert_close(fast, ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(slow, ref, rtol=1e-4, atol=1e-5)
