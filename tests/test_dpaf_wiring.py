"""What DPAF's train() actually passes to its mechanisms (issue 18): spies on the Poisson sampler, the group
split, C's loss, both DP-SGD optimizers (conv1 / conv2*) and DPAGG check that every σ, clip, sensitivity and batch
matches the ledger entry recorded for that step; a budget guard that binds; and a released generator that depends
on the data only through the mechanisms."""
from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dpgen.data.base import ImageDataset, Split
from dpgen.dpaf.accounting import CONV1, GROUP
from dpgen.privacy import LedgerEntry
from dpgen.privacy.ledger import compute_epsilon

from tiny import train_in_memory

tr = importlib.import_module("dpgen.dpaf.train")  # the package attribute `train` is the function

# digits (N = 1437): t1 = ceil(0.2 N / 128) = 3 phase-1 steps, then ceil(0.3 N / (4 * 32)) = 4 groups of 4 batches
WIDTH = 8  # conv2* has 2·WIDTH maps of 7×7 on 28 px digits
SMALL = ["dpaf.batch_size=32", "dpaf.mu=4", "dpaf.n_critic=2", "dpaf.d_epochs=0.3", f"dpaf.width={WIDTH}"]


class Spies:
    """Wraps the mechanisms train() calls and records, for each call, what it got and the ledger's last entry."""

    def __init__(self, monkeypatch, fixed: bool = False) -> None:
        self.samplers, self.splits, self.c_calls, self.conv2_calls = [], [], [], []
        self.opt_steps: list[dict] = []
        self.aggs: list[dict] = []
        self.ledger = None
        self.fixed = fixed  # data-independence mode: mechanisms return fixed tensors
        spies = self
        orig_sampler, orig_split, orig_c_loss, orig_conv2 = tr.PoissonSampler, tr.split_group, tr.c_loss, tr.conv2_step
        orig_dpagg, orig_opt = tr.dpagg, tr.CompressedDPOptimizer

        class Sampler(orig_sampler):
            def __init__(self, *a, **k):
                super().__init__(*a, **k)
                self.drawn: list[torch.Tensor] = []
                spies.samplers.append(self)

            def __call__(self, step):
                idx = super().__call__(step)
                self.drawn.append(idx.clone())
                return idx

        def split(idx, mu, generator):
            subs = orig_split(idx, mu, generator)
            spies.splits.append((idx.clone(), [s.clone() for s in subs]))
            return subs

        def c_loss(c_net, x, y, k, batch, paper, eps):
            out = orig_c_loss(c_net, x, y, k, batch, paper, eps)
            ref = sound_c_loss(c_net, x, y, k, eps)
            spies.c_calls.append({"x": x.clone(), "y": y.clone(), "paper": paper})
            if spies.ledger.accounting == "sound":  # here, before a backward pass through the wrong loss can fail
                torch.testing.assert_close(out.detach(), ref, rtol=1e-4, atol=1e-5,
                                           msg="sound C must train on a per-sample loss (sum of per-record MSEs)")
            return out

        def conv2_step(d_net, gsm, opt, x_all, y_all, subs, idx, fakes, paper, eps):
            ref = sound_d_loss(d_net, x_all[idx], y_all[idx], fakes, eps)
            out = orig_conv2(d_net, gsm, opt, x_all, y_all, subs, idx, fakes, paper, eps)
            spies.conv2_calls.append({"idx": idx.clone(), "subs": [s.clone() for s in subs],
                                      "fake_rows": sum(len(f[0]) for f in fakes), "paper": paper})
            if spies.ledger.accounting == "sound":
                torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5,
                                           msg="sound conv2* must train on per-sample losses through D̂")
            return out

        def dpagg(feats, sensitivity, noise_multiplier, scale, generator=None, canaries=None, part=0):
            out = orig_dpagg(feats, sensitivity, noise_multiplier, scale, generator, canaries, part)
            noise = out * scale - feats.sum(0, keepdim=True)
            spies.aggs.append({"rows": len(feats), "sens": sensitivity, "z": noise_multiplier, "scale": scale,
                               "noise_std": noise.std().item(), "feat_norm": feats.flatten(1).norm(dim=1).max().item()
                               if len(feats) else 0.0, "entry": spies.last_entry()})
            if spies.fixed:
                return torch.full_like(out, 0.1 * len(spies.aggs) % 1.0)
            return out

        class Opt(orig_opt):
            def clip_and_accumulate(self):
                self._rows = len(self.grad_samples[0])
                super().clip_and_accumulate()
                self._clipped = [p.summed_grad.clone() for p in self.params]

            def add_noise(self):
                super().add_noise()
                noise = torch.cat([(p.grad - s.view_as(p)).flatten() for p, s in zip(self.params, self._clipped)])
                spies.opt_steps.append({"opt": self, "z": self.noise_multiplier, "clip": self.max_grad_norm,
                                        "rows": self._rows, "noise": noise.clone(),
                                        "entry": spies.last_entry()})
                if spies.fixed:
                    for i, p in enumerate(self.params):
                        p.grad = torch.full_like(p, 1e-3 * (i + 1) * (-1) ** len(spies.opt_steps))

        for name, fn in (("PoissonSampler", Sampler), ("split_group", split), ("c_loss", c_loss),
                         ("conv2_step", conv2_step), ("dpagg", dpagg), ("CompressedDPOptimizer", Opt)):
            monkeypatch.setattr(tr, name, fn)

    def last_entry(self) -> tuple[str, list[float], float, int] | None:
        """(name, noise multipliers, sampling rate, total count of that name) of the ledger's latest entry."""
        if self.ledger is None or not self.ledger.entries:
            return None
        e = self.ledger.entries[-1]
        return e.name, list(e.noise_multipliers), e.sampling_rate, sum(x.count for x in self.ledger.entries
                                                                       if x.name == e.name)


@torch.no_grad()  # no grad: opacus' hooks must not capture these extra forward passes
def sound_c_loss(c_net, x, y, k, eps):
    """The per-sample MSE of the sound C, written out here so that the spy does not trust train.c_loss."""
    rows = [((torch.softmax(c_net.score(c_net.features(x[i:i + 1], sin_eps=eps)), 1)[0] - F.one_hot(y[i], k).to(x))
             ** 2).sum() for i in range(len(x))]
    return torch.stack(rows).sum() if rows else torch.zeros(())


@torch.no_grad()
def sound_d_loss(d_net, x, y, fakes, eps):
    """Mean per-sample BCE of D̂ (no aggregation) on the sampled reals (label 1) and the fakes (label 0)."""
    real = F.binary_cross_entropy_with_logits(d_net.score(d_net.features(x, y, eps)), torch.ones(len(x)), reduction="sum")
    fake = sum(F.binary_cross_entropy_with_logits(d_net.score(d_net.features(xf, yf, eps)), torch.zeros(len(xf)),
                                                  reduction="sum") for xf, yf in fakes)
    return (real + fake) / (len(x) + sum(len(f[0]) for f in fakes))


def _run(tmp_path, monkeypatch, *overrides, eps=10.0, accounting="sound", data=None, fixed=False):
    spies = Spies(monkeypatch, fixed)
    from dpgen.privacy import ledger as ledger_mod

    orig_init = ledger_mod.PrivacyLedger.__init__

    def init(self, *a, **k):  # let the spies read the run's ledger (the first one made) while it trains
        orig_init(self, *a, **k)
        if spies.ledger is None:
            spies.ledger = self

    monkeypatch.setattr(ledger_mod.PrivacyLedger, "__init__", init)
    gen, ledger, _ = train_in_memory("dpaf", tmp_path, *SMALL, *overrides, eps=eps, accounting=accounting, data=data)
    return gen, ledger, spies


@pytest.mark.parametrize("accounting", ["sound", "paper"])
def test_spy_sigma_clip_and_batches_match_the_ledger(tmp_path, monkeypatch, accounting):
    gen, ledger, spies = _run(tmp_path, monkeypatch, accounting=accounting)
    n = 1437
    c1, grp = ledger.entries
    assert (c1.name, grp.name) == (CONV1, GROUP) and (c1.count, grp.count) == (3, 4)
    assert len(grp.noise_multipliers) == 2, "DPAGG and conv2* share each group's sample: one event, two sigmas"
    z1, (z3, z2) = c1.noise_multipliers[0], grp.noise_multipliers
    assert min(z1, z2, z3) > 0.3, "eps=10 on 1437 records needs real noise"

    # Poisson sampling: the rates the ledger accounts, one draw per recorded step
    s_c, s_d = spies.samplers
    assert (s_c.q, s_d.q) == (pytest.approx(c1.sampling_rate), pytest.approx(grp.sampling_rate))
    assert c1.sampling_rate == pytest.approx(128 / n) and grp.sampling_rate == pytest.approx(4 * 32 / n)
    assert (len(s_c.drawn), len(s_d.drawn)) == (c1.count, grp.count)

    # phase 1: C's loss got exactly the sampled records, and the sound loss is the per-sample one
    assert len(spies.c_calls) == 3
    x_all = torch.as_tensor(np.asarray(_digits(tmp_path).train.x), dtype=torch.float32) / 255
    for call, idx in zip(spies.c_calls, s_c.drawn):
        torch.testing.assert_close(call["x"], x_all[idx], rtol=0, atol=0)
        assert call["paper"] is (accounting == "paper")

    # the two DP-SGD optimizers: sigma and clip as recorded and configured, one noisy step per ledger step
    c_steps = [s for s in spies.opt_steps if s["entry"][0] == CONV1]
    d_steps = [s for s in spies.opt_steps if s["entry"][0] == GROUP]
    assert len(c_steps) == 3 and len(d_steps) == 4 and len(spies.opt_steps) == 7
    for i, s in enumerate(c_steps):
        assert s["entry"] == (CONV1, [z1], pytest.approx(c1.sampling_rate), i + 1)
        assert (s["z"], s["clip"]) == (pytest.approx(z1), 1.0)
        assert s["rows"] == len(s_c.drawn[i]), "one per-sample gradient per sampled record"
    noise_c = torch.cat([s["noise"] for s in c_steps])  # ≥ 240 draws: the std is known to ~5%
    assert noise_c.std().item() == pytest.approx(z1 * 1.0, rel=0.2), "noise actually added = z1·C"
    for g, s in enumerate(d_steps):
        assert s["entry"] == (GROUP, [z3, z2], pytest.approx(grp.sampling_rate), g + 1)
        assert (s["z"], s["clip"]) == (pytest.approx(z2), 1.0)
        assert s["noise"].std().item() == pytest.approx(z2 * 1.0, rel=0.1), "noise actually added = z2·C"
        if accounting == "sound":
            assert s["rows"] == len(s_d.drawn[g]) + 4 * 32, "per-sample gradients: sampled reals + the μ fake batches"

    # groups: the split is a partition of the group's Poisson sample; conv2* sees that sample and μ·B fakes
    assert len(spies.splits) == len(spies.conv2_calls) == 4
    for (idx, subs), call, drawn in zip(spies.splits, spies.conv2_calls, s_d.drawn):
        assert torch.equal(idx, drawn) and torch.equal(call["idx"], drawn)
        assert sorted(torch.cat(subs).tolist()) == sorted(drawn.tolist()) and len(subs) == 4
        assert all(torch.equal(a, b) for a, b in zip(subs, call["subs"]))
        assert call["fake_rows"] == 4 * 32 and call["paper"] is (accounting == "paper")

    # DPAGG: sensitivity √m·p stated independently, z3 of this step's entry, the noise actually added z3·√m·p
    sens = math.sqrt(2 * WIDTH) * 7
    assert len(spies.aggs) == 4 * 4 * 2, "μ real and μ fake releases per group"
    for j, a in enumerate(spies.aggs):
        g = j // 8
        assert a["entry"] == (GROUP, [z3, z2], pytest.approx(grp.sampling_rate), g + 1)
        assert (a["z"], a["sens"], a["scale"]) == (pytest.approx(z3), pytest.approx(sens), 32)
        assert a["noise_std"] == pytest.approx(z3 * sens, rel=0.15)
        assert a["feat_norm"] <= sens * (1 + 1e-5), "each row within the stated sensitivity"
    real_rows = [a["rows"] for j, a in enumerate(spies.aggs) if j % 8 < 4]
    for g, (_, subs) in enumerate(spies.splits):
        assert real_rows[4 * g:4 * g + 4] == [len(s) for s in subs], "one real release per sub-batch"


def _digits(tmp_path):
    from dpgen.data import load_dataset

    return load_dataset("digits", str(tmp_path / "data"))


def _other_data(tmp_path) -> ImageDataset:
    """Same size as digits, different images and labels."""
    d = _digits(tmp_path)
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, np.asarray(d.train.x).shape, dtype=np.uint8)
    y = rng.permutation(np.asarray(d.train.y))
    return ImageDataset("other", Split(x, y), d.test, d.classes)


@pytest.mark.parametrize("accounting", ["sound", "paper"])
def test_generator_depends_on_data_only_through_the_mechanisms(tmp_path, monkeypatch, accounting):
    """With every DP-SGD step's noisy gradient and every DPAGG output replaced by fixed tensors, the released G
    is bit-identical whatever the training data; with the real mechanisms it is not (the test can fail)."""
    gens = []
    for i, data in enumerate([_digits(tmp_path), _other_data(tmp_path)]):
        gen, _, _ = _run(tmp_path / f"fixed{i}", monkeypatch, accounting=accounting, data=data, fixed=True)
        gens.append(gen.state_dict())
        monkeypatch.undo()
    for k, v in gens[0].items():
        torch.testing.assert_close(gens[1][k], v, rtol=0, atol=0, msg=f"G's {k} depends on the data")
    real = [train_in_memory("dpaf", tmp_path / f"real{i}", *SMALL, accounting=accounting, data=d)[0].state_dict()
            for i, d in enumerate([_digits(tmp_path), _other_data(tmp_path)])]
    assert any(not torch.equal(real[0][k], real[1][k]) for k in real[0])


def test_budget_guard_binds_with_a_fixed_sigma(tmp_path, monkeypatch):
    """Fixed σ's too small for the planned groups: the run stops at the largest group count the budget allows."""
    zs = [3.0, 1.0, 2.0]
    _, ledger, spies = _run(tmp_path, monkeypatch, f"dpaf.noise_multipliers={zs}", "dpaf.d_epochs=20", eps=4.0)
    c1, grp = ledger.entries
    assert c1.noise_multipliers == [3.0] and grp.noise_multipliers == [2.0, 1.0]
    planned = math.ceil(20 * 1437 / (4 * 32))
    # the guard's limit, found here by a plain search over the composed epsilon
    def eps_at(c):
        return compute_epsilon([c1, LedgerEntry(GROUP, [2.0, 1.0], "poisson", grp.sampling_rate, c)], ledger.delta)

    limit = next(c for c in range(1, planned + 1) if eps_at(c + 1) > 4.0)
    assert grp.count == limit < planned
    assert ledger.epsilon() <= 4.0 < eps_at(limit + 1)
    assert len(spies.conv2_calls) == limit and len(spies.aggs) == 8 * limit
