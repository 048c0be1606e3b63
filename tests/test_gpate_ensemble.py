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
        loss = F.binary_cross_entropy_with_logits(t(xi, y), torch.ones(len(x)))  # official: mean over the batch
        (g,) = torch.autograd.grad(loss, xi)
        out.append(-g)
    return torch.stack(out)


@pytest.mark.parametrize("norm", ["none", "layer", "batch"])
@pytest.mark.parametrize("chunk,shared", [(None, True), (2, True), (2, False)])
def test_batched_teachers_match_a_per_teacher_loop(norm, chunk, shared):
    torch.manual_seed(0)
    make = lambda: TeacherCNN(3, [1, 12, 12], df_dim=4, dfc_dim=8, norm=norm)  # noqa: E731
    ens = TeacherEnsemble(make, 5, torch.device("cpu"), chunk=chunk, seed=1)
    # every batch mixes classes: under a normalisation, the label-map weights of a class present in every
    # sample act as a bias (zero gradient, rounding noise that Adam turns into ±lr steps)
    x, y = torch.rand(4, 1, 12, 12), torch.tensor([0, 1, 2, 1])
    batched = torch.cat([g for _, _, g in ens.input_grads_chunks(x, y)])
    torch.testing.assert_close(batched, _loop_input_grads(ens, make, x, y), rtol=1e-4, atol=1e-7)
    # one training step: stacked (fused) Adam == per-teacher torch.optim.Adam
    xr, yr = torch.rand(5, 3, 1, 12, 12), (torch.arange(3) + torch.arange(5)[:, None]) % 3
    xf, yf = (x, y) if shared else (torch.rand(5, 4, 1, 12, 12), (torch.arange(4) + 2 * torch.arange(5)[:, None]) % 3)
    w = torch.ones(5, 3)
    refs = []
    for i in range(5):
        t = make()
        t.load_state_dict({k: v.detach().clone() for k, v in ens.teacher_params(i).items()})
        opt = torch.optim.Adam(t.parameters(), lr=1e-3, betas=(0.5, 0.999))
        loss = F.binary_cross_entropy_with_logits(t(xr[i], yr[i]), torch.ones(3)) + \
            F.binary_cross_entropy_with_logits(t(xf if shared else xf[i], yf if shared else yf[i]), torch.zeros(4))
        loss.backward()
        opt.step()
        refs.append(t.state_dict())
    ens.train_step(TeacherEnsemble.fixed_batch(xr, yr, w, xf, yf))
    for i in range(5):
        for k, v in refs[i].items():
            if norm != "none" and k in ("conv2.bias", "fc1.bias"):
                # followed by a normalisation: the true gradient is 0 and Adam turns float
                # rounding noise into ±lr steps, differently in any two implementations
                continue
            # atol 20% of one Adam step (lr 1e-3): where |g| is near Adam's eps the step amplifies rounding
            # (a wrong gradient shows as a whole step or two, see the fused-Adam note in ensemble._adam)
            torch.testing.assert_close(ens.teacher_params(i)[k], v, rtol=1e-4, atol=2e-4)


def test_teacher_norms_normalise_what_they_claim():
    """batch: each channel over the batch; layer: each sample over its features; none: no norm parameters."""
    h = torch.randn(6, 5, 3, 3) * 4 + 2
    from dpgen.gpate.nets import BatchStatNorm, SampleNorm, make_norm

    b = BatchStatNorm(5)(h)
    torch.testing.assert_close(b.mean(dim=(0, 2, 3)), torch.zeros(5), atol=1e-5, rtol=0)
    s = SampleNorm(5)(h)
    torch.testing.assert_close(s.mean(dim=(1, 2, 3)), torch.zeros(6), atol=1e-5, rtol=0)
    torch.testing.assert_close(s.var(dim=(1, 2, 3), unbiased=False), torch.ones(6), atol=1e-3, rtol=0)
    assert make_norm("none", 5) is None
    assert not any("bn" in k for k in TeacherCNN(3, [1, 8, 8], df_dim=2, dfc_dim=4, norm="none").state_dict())
    # a per-sample norm: a sample's logit does not depend on the rest of its batch; batch norm: it does
    x, y = torch.rand(4, 1, 8, 8), torch.randint(0, 3, (4,))
    for norm, independent in (("layer", True), ("none", True), ("batch", False)):
        t = TeacherCNN(3, [1, 8, 8], df_dim=2, dfc_dim=4, norm=norm)
        same = torch.allclose(t(x, y)[:2], t(x[:2], y[:2]), atol=1e-6)
        assert same == independent, norm
    from dpgen.errors import DpgenError

    with pytest.raises(DpgenError, match="teacher_norm"):
        make_norm("group", 3)


def test_ensemble_is_initialised_as_the_official_code_on_the_target_device():
    """N(0, 0.02) weights (conv truncated at 2σ), zero biases, unit norm scales; built where it will run."""
    make = lambda: TeacherCNN(10, [1, 28, 28], df_dim=8, dfc_dim=32, norm="batch")  # noqa: E731
    ens = TeacherEnsemble(make, 40, torch.device("cpu"), chunk=7, seed=0)
    p = ens.params
    for k in ("conv1.weight", "conv2.weight", "fc1.weight", "fc2.weight"):
        assert p[k].std().item() == pytest.approx(0.02 if k.startswith("fc") else 0.0176, rel=0.05), k
    assert p["conv1.weight"].abs().max() <= 0.04 + 1e-7, "conv weights are truncated at 2σ"
    assert all((p[k] == 0).all() for k in p if k.endswith("bias"))
    assert (p["bn2.weight"] == 1).all() and (p["bn3.weight"] == 1).all()
    assert not torch.equal(p["fc1.weight"][0], p["fc1.weight"][1]), "teachers differ"
    meta = TeacherEnsemble(make, 4000, torch.device("meta"), chunk=500)  # no host copy of a paper-sized ensemble
    assert all(v.device.type == "meta" and v.shape[0] == 4000 for v in meta.params.values())
    same = TeacherEnsemble(make, 40, torch.device("cpu"), chunk=40, seed=0)
    assert all(torch.equal(same.params[k], p[k]) for k in p), "the chunking does not change the initialisation"


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
    idx, w = s.sample(5)
    assert idx.shape == (7, 5) and (owner[idx] == torch.arange(7)[:, None]).all(), "a teacher sees only its part"
    assert (w == 1).all()
    empty = PartitionSampler(torch.tensor([0, 0, 2]), 3, torch.device("cpu"))
    idx, w = empty.sample(4)
    assert empty.n_empty == 1 and (w[1] == 0).all() and (w[[0, 2]] == 1).all()
    assert (idx[1] == -1).all(), "an empty partition reads no record"
    values = torch.arange(3.0)[:, None] + 1
    got = PartitionSampler.gather(values, idx)
    assert (got[1] == 0).all() and torch.equal(got[0, :, 0], torch.tensor([1.0, 2.0, 1.0, 2.0]))


def test_partition_sampler_passes_over_each_partition_in_order():
    """As the official code: teacher i's t-th batch is records t·b..t·b+b-1 of its partition (cyclic)."""
    owner = torch.tensor([0, 1, 0, 0, 1, 0, 0, 1, 0])  # teacher 0: records 0,2,3,5,6,8; teacher 1: 1,4,7
    s = PartitionSampler(owner, 2, torch.device("cpu"))
    batches = [s.sample(4)[0] for _ in range(3)]
    assert [b[0].tolist() for b in batches] == [[0, 2, 3, 5], [6, 8, 0, 2], [3, 5, 6, 8]]
    assert [b[1].tolist() for b in batches] == [[1, 4, 7, 1], [4, 7, 1, 4], [7, 1, 4, 7]]
    restored = PartitionSampler(owner, 2, torch.device("cpu"))
    restored.load_state_dict(s.state_dict())
    assert torch.equal(restored.sample(4)[0], s.sample(4)[0])


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


def test_paper_accounting_and_credit_prior_match_the_oracle(tmp_path, monkeypatch):
    """Paper ε against accounting.md §3: every query a unanimous 250-vote histogram over 10 bins with σ2=40,
    T=200, σ1=150 costs 4.444e-5 (threshold) + 1.527e-5 (answered argmax) at λ=2; plus the prior's ε=0.01."""
    import math

    from dpgen.gpate import aggregate, rdp, train
    from dpgen.privacy import PrivacyLedger

    answered = []
    real_gnmax = aggregate.confident_gnmax

    def unanimous(grad_chunks, proj, c, bins, reduce=None):
        hist = torch.zeros(proj.shape[0], proj.shape[2], bins, dtype=torch.long)
        hist[..., 0] = 250
        return hist

    def gnmax(*a, **kw):
        res = real_gnmax(*a, **kw)
        answered.append(int(res.answered.sum()))
        return res

    monkeypatch.setattr(aggregate, "vote_histogram", unanimous)
    monkeypatch.setattr(aggregate, "confident_gnmax", gnmax)
    ledger = PrivacyLedger(delta=1e-5, target_epsilon=3.0, accounting="paper")
    run = in_memory_run(tmp_path, ledger)
    gen = train(_hp(iters=3, dp_class_prior=True, sigma1=150.0, sigma2=40.0, thresh=25.0, proj_dim=10),
                _toy(tabular=True), ledger, run)
    lap, q = ledger.entries
    assert (lap.name, lap.mechanism, lap.noise_multipliers, lap.count) == ("gpate.class_prior", "laplace", [100.0], 1)
    queries = 3 * 4 * 10
    assert q.count == queries and 0 < sum(answered) < queries
    assert ledger.paper_epsilon is not None and not ledger.valid_dp_guarantee
    rdp_cum = np.array(torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=False)["state"]["rdp_cum"])
    lam2 = list(rdp.PAPER_ORDERS).index(2.0)
    assert rdp_cum[lam2] == pytest.approx(queries * 4.444e-5 + sum(answered) * 1.527e-5, rel=1e-3)
    oracle = min(rdp_cum + math.log(1e5) / (rdp.PAPER_ORDERS - 1)) + 1 / 100.0
    assert ledger.report_epsilon() == pytest.approx(oracle, rel=1e-12)
    assert ledger.epsilon() > ledger.report_epsilon(), "the sound bound charges what the data-dependent one discounts"
    assert any("NOT a differential-privacy guarantee" in n for n in ledger.notes)
    assert gen.init_kwargs["class_prior"] is not None and abs(sum(gen.init_kwargs["class_prior"]) - 1) < 1e-9
    x, _ = gen.sample(5)
    assert x.shape == (5, 6) and torch.isfinite(x).all()


@pytest.mark.parametrize("norm", ["none", "layer", "batch"])
@pytest.mark.parametrize("shared", [True, False])
def test_stacked_forward_matches_the_vmap_path_and_the_module(shared, norm):
    """Grouped-conv ``stacked_forward`` (with the per-class label-map responses) == vmap(functional_call)."""
    torch.manual_seed(2)
    make = lambda: TeacherCNN(4, [2, 9, 9], df_dim=3, dfc_dim=5, norm=norm)  # noqa: E731  odd size: borders matter
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
