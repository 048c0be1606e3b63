"""Which parameters dpaf's DP-SGD clips and noises, and what it releases for an empty Poisson batch.

* ``dpaf.conv1=transfer|random|joint`` (Table IV): phase 2's DP-SGD covers conv2* alone, except under ``joint``,
  where it covers conv1 and conv2* together, clipped with one norm over both and noised on both. conv1 stays
  bit-identical through phase 2 under transfer (C's conv1) and random (its N(0, 0.02) draw); the head (conv3*,
  FC*) is never in DP-SGD: it learns from DPAGG's releases only.
* an empty phase-1 batch: ``empty_step`` releases pure noise N(0, (z1·C)²) on every parameter DP-SGD covers, the
  ledger records the step, and C then depends on the noise only (two data sets, one noise seed: the same C).
"""
from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from dpgen.core.run import TrainingInterrupted
from dpgen.data.base import ImageDataset, Split
from dpgen.dpaf.accounting import CONV1, GROUP
from dpgen.privacy import PrivacyLedger

from conftest import in_memory_run

tr = importlib.import_module("dpgen.dpaf.train")  # the package attribute `train` is the function

N = 200
# transfer: t1 = ceil(0.5·200/40) = 3 phase-1 steps; every setting: ceil(0.3·200/(2·20)) = 2 groups
HP = {"layers": None, "width": 4, "fc_hidden": 8, "activation": "lrelu", "conv1": "transfer",
      "split": [0.5, None, 0.5], "split_unit": "eps", "batch_size": 20, "c_batch_size": 40, "mu": 2, "n_critic": 2,
      "c_epochs": 0.5, "d_epochs": 0.3, "clip_c": 1.0, "clip_d": 1.0, "gc_keep": 0.9, "sin_eps": 1e-5,
      "lr_c": 2e-4, "lr_d": 2e-4, "lr_g": 2e-4, "betas": [0.5, 0.999], "z_dim": 8, "g_width": 8}


def _data(seed: int = 0) -> ImageDataset:
    rng = np.random.default_rng(seed)
    split = Split(rng.integers(0, 256, (N, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, N).astype(np.int64))
    return ImageDataset("toy", split, split, [str(i) for i in range(10)])


class Spies:
    """Records every DP-SGD optimizer dpaf builds (the parameters it covers; per step the per-sample rows it clipped,
    the clipped sum and the released gradient) and every DpafNet (C first, then D)."""

    def __init__(self, monkeypatch) -> None:
        self.opts: list = []
        self.nets: list = []
        self.initial: list[dict] = []  # each net's state when built
        spies = self

        class Opt(tr.CompressedDPOptimizer):
            def __init__(self, *a, **k):
                super().__init__(*a, **k)
                self.steps: list[dict] = []
                self._empty = False
                spies.opts.append(self)

            def empty_step(self):
                self._empty = True
                try:
                    super().empty_step()
                finally:
                    self._empty = False

            def clip_and_accumulate(self):
                super().clip_and_accumulate()  # after the compression: the rows opacus clipped
                self._rec = {"rows": [g.detach().clone() for g in self.grad_samples],
                             "clipped": [p.summed_grad.detach().clone() for p in self.params]}

            def add_noise(self):
                super().add_noise()
                self.steps.append({**self._rec, "released": [p.grad.detach().clone() for p in self.params],
                                   "empty": self._empty})

        class Net(tr.DpafNet):
            def __init__(self, *a, **k):
                super().__init__(*a, **k)
                spies.nets.append(self)
                spies.initial.append(_state(self))

        monkeypatch.setattr(tr, "CompressedDPOptimizer", Opt)
        monkeypatch.setattr(tr, "DpafNet", Net)


def _train(tmp_path, data=None, **over):
    from dpgen.core.config import register_resolvers
    from dpgen.dpaf import train

    register_resolvers()
    run_kwargs = over.pop("run_kwargs", {})
    ledger = PrivacyLedger(delta=1e-4, target_epsilon=4.0)
    run = in_memory_run(tmp_path, ledger, **run_kwargs)
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(OmegaConf.create({**HP, **over}), _data() if data is None else data, ledger, run)
    finally:
        run.close()
        torch.set_num_threads(threads)
    return ledger


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# ---- conv1=transfer|random|joint: what phase 2's DP-SGD covers -------------------------------------------------

Z2, CLIP_D = 3.0, 1e-3  # a clip far below every per-sample gradient's norm: clipping binds on every row


@pytest.mark.parametrize("conv1", ["transfer", "random", "joint"])
def test_phase2_dp_sgd_clips_and_noises_exactly_conv2_or_with_joint_conv1_too(tmp_path, monkeypatch, conv1):
    spies = Spies(monkeypatch)
    first_d2: dict = {}
    orig_conv2_step = tr.conv2_step

    def conv2_step(d_net, *a, **k):  # conv1 of D as phase 2 found it, before DP-SGD's first step
        first_d2.setdefault("conv1", _state(d_net.conv1))
        return orig_conv2_step(d_net, *a, **k)

    monkeypatch.setattr(tr, "conv2_step", conv2_step)
    z1 = 1.0 if conv1 == "transfer" else None
    split = [0.5, None, 0.5] if conv1 == "transfer" else [None, None, 0.5]
    ledger = _train(tmp_path, conv1=conv1, split=split, clip_d=CLIP_D, noise_multipliers=[z1, Z2, 2.0])
    d_net = spies.nets[-1]
    assert d_net.head[-1].out_features == 1, "the last DpafNet built is D"
    opt_d2 = spies.opts[-1]
    assert len(spies.opts) == (2 if conv1 == "transfer" else 1)
    assert [e.name for e in ledger.entries] == ([CONV1, GROUP] if conv1 == "transfer" else [GROUP])
    assert ledger.entries[-1].noise_multipliers == [2.0, Z2] and ledger.entries[-1].count == 2

    # exactly the parameters DP-SGD should cover: conv2*, and conv1 with it under joint; never the head
    covered = list(d_net.conv2.parameters()) + (list(d_net.conv1.parameters()) if conv1 == "joint" else [])
    assert {id(p) for p in opt_d2.params} == {id(p) for p in covered}
    assert len(opt_d2.params) == len(covered)
    assert len(opt_d2.steps) == 2, "one conv2* step per group"

    for step in opt_d2.steps:
        rows = step["rows"]
        b = len(rows[0])
        assert b > 0 and all(len(r) == b for r in rows)
        # one norm per record over every covered parameter, conv1's included under joint
        norms = torch.stack([r.reshape(b, -1).norm(dim=1) for r in rows], 1).norm(dim=1)
        assert (norms > 10 * CLIP_D).all(), "clipping binds on every row"
        factor = (CLIP_D / (norms + 1e-6)).clamp(max=1.0)
        for p, r, clipped, released in zip(opt_d2.params, rows, step["clipped"], step["released"]):
            torch.testing.assert_close(clipped, torch.einsum("i,i...", factor, r), rtol=1e-4, atol=1e-9)
            assert clipped.abs().max() > 0, "every covered parameter gets the data's (clipped) gradient"
        total = torch.cat([c.flatten() for c in step["clipped"]]).norm()
        assert total <= b * CLIP_D * (1 + 1e-4), "the data part of the release is bounded by the clip"
    # and noise N(0, (z2·C)²) on every covered parameter, conv1's under joint. Per parameter (a bias has 8 draws
    # over the two steps) within [0.2, 3]·z2·C; pooled per layer group (conv1: 80 draws, the std known to ±8%;
    # conv2*: ~2,000, ±1.6%) within 35% and 10%
    noise = [torch.cat([(s["released"][i] - s["clipped"][i]).flatten() for s in opt_d2.steps])
             for i in range(len(opt_d2.params))]
    for p, e in zip(opt_d2.params, noise):
        assert 0.2 < e.std().item() / (Z2 * CLIP_D) < 3, f"noise on parameter {tuple(p.shape)}"
    groups = {"conv2": (d_net.conv2, 0.1), **({"conv1": (d_net.conv1, 0.35)} if conv1 == "joint" else {})}
    for name, (module, rel) in groups.items():
        ids = {id(p) for p in module.parameters()}
        pooled = torch.cat([e for p, e in zip(opt_d2.params, noise) if id(p) in ids])
        assert pooled.std().item() == pytest.approx(Z2 * CLIP_D, rel=rel), f"noise on {name}"

    # conv1 outside DP-SGD is never updated in phase 2; under joint it is
    moved = any(not torch.equal(v, first_d2["conv1"][k]) for k, v in _state(d_net.conv1).items())
    assert moved is (conv1 == "joint")
    if conv1 == "transfer":  # Alg. 1 line 5: C's conv1, frozen
        for k, v in _state(spies.nets[0].conv1).items():
            assert torch.equal(d_net.conv1.state_dict()[k], v)
    if conv1 == "random":  # Table IV: N(0, 0.02) weights, zero biases, never updated
        w = [p for p in d_net.conv1.parameters() if p.dim() > 1]
        assert w and all(p.std().item() == pytest.approx(0.02, rel=0.3) for p in w)
        assert all(p.abs().max() == 0 for p in d_net.conv1.parameters() if p.dim() == 1)


# ---- an empty Poisson batch in phase 1 --------------------------------------------------------------------------

Z1, T1 = 2.0, 3


def _empty_phase1(tmp_path, monkeypatch, data):
    """Phase 1 of a transfer run whose every Poisson batch is empty (stopped after it); its C and the spies."""
    spies = Spies(monkeypatch)
    orig_sampler = tr._sampler

    def sampler(run, n, q, phase, steps):
        s = orig_sampler(run, n, q, phase, steps)
        return (lambda step: s(step)[:0]) if phase == 1 else s

    monkeypatch.setattr(tr, "_sampler", sampler)
    with pytest.raises(TrainingInterrupted):
        _train(tmp_path, data, noise_multipliers=[Z1, 1.0, 1.0],
               run_kwargs={"stop_after": T1, "noise_seed": 11, "checkpoint_every": 100})
    ledger = PrivacyLedger(delta=1e-4)
    ckpt = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=False)
    ledger.load_state_dict(ckpt["ledger"])
    return ckpt["state"]["c"], ledger, spies


def test_an_empty_poisson_batch_releases_pure_noise_and_is_recorded(tmp_path, monkeypatch):
    c_state, ledger, spies = _empty_phase1(tmp_path / "a", monkeypatch, _data(0))
    c_net = spies.nets[0]
    (opt_c,) = spies.opts
    # sound: all of C is trained by DP-SGD, so every parameter of C gets the noise
    assert {id(p) for p in opt_c.params} == {id(p) for p in c_net.parameters()}
    assert len(opt_c.steps) == T1 and all(s["empty"] for s in opt_c.steps), "every step an empty_step"
    for s in opt_c.steps:
        assert all(len(r) == 0 for r in s["rows"])
        assert all(torch.count_nonzero(c) == 0 for c in s["clipped"]), "the clipped sum of no record is 0"
    noise = torch.cat([g.flatten() for s in opt_c.steps for g in s["released"]])
    assert noise.numel() > 1000
    assert noise.std().item() == pytest.approx(Z1 * HP["clip_c"], rel=0.1), "pure noise of std z1·C"
    assert abs(noise.mean().item()) < 0.1 * Z1
    # the ledger records the empty steps like any other
    (entry,) = ledger.entries
    assert (entry.name, entry.noise_multipliers, entry.count) == (CONV1, [Z1], T1)
    assert entry.sampling_rate == pytest.approx(HP["c_batch_size"] / N)
    # C moved, by the noise only: other data and the same noise seed give the same C, bit for bit
    assert any(not torch.equal(v, spies.initial[0][k]) for k, v in c_state.items()), "the noise moved C"
    monkeypatch.undo()
    other_state, _, other = _empty_phase1(tmp_path / "b", monkeypatch, _data(1))
    assert len(other.opts[0].steps) == T1
    for k, v in c_state.items():
        assert torch.equal(other_state[k], v), f"C's {k} depends on the data"
