"""dpgan's training loop passes the mechanism what the ledger records (issue 18).

The mechanism tests in test_dpgan.py build their own optimizer. These spy on the DP-SGD optimizer, the
noise draw and the Poisson sampler that ``dpgen.dpgan.train`` itself uses, and compare every value with the
ledger entry of the same run: halving σ, scaling the clip, removing the budget guard, replacing the Poisson
batch or drawing the noise or the batch from a public stream each fail a test here.
"""
from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
import torch
import dpgen.privacy.optimizer as dp_optimizer
from dpgen.data.base import ImageDataset, Split
from dpgen.privacy import LedgerEntry, calibrate_steps
from dpgen.privacy.randomness import SecretGenerator

from tiny import compose_cfg, train_in_memory

tr = importlib.import_module("dpgen.dpgan.train")  # the package attribute `train` is the function


class Spy:
    """Records what dpgan's training loop hands to opacus and to the Poisson sampler."""

    def __init__(self, monkeypatch):
        self.optimizers: list[dict] = []
        self.noise_stds: list[float] = []
        self.secret: list[bool] = []  # per noise draw and per Poisson batch: was the stream secret?
        self.batches: list[tuple[int, float, int]] = []  # (n, q, size) per poisson_batch call
        self.real_rows: list[int] = []  # rows of real data per discriminator step
        self.clipped_norms: list[float] = []
        self.backends: list[str] = []  # per step: the per-sample path the optimizer clipped
        spy = self

        class SpyOptimizer(tr.DPSGDOptimizer):
            def __init__(self, *a, **k):
                super().__init__(*a, **k)
                spy.optimizers.append({"noise_multiplier": self.noise_multiplier, "clip": self.max_grad_norm,
                                       "expected_batch_size": self.expected_batch_size})

            def clip_and_accumulate(self):
                if self.recorded is not None:  # grad_backend=ghost: each sample's norm over all parameters
                    norms = self.recorded.norms
                else:  # the per-sample gradients opacus clips, flattened across parameters
                    norms = torch.cat([p.grad_sample.reshape(len(p.grad_sample), -1) for p in self.params], 1).norm(dim=1)
                factor = (self.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
                spy.clipped_norms.append(float((norms * factor).max()))
                spy.backends.append("ghost" if self.recorded is not None else "opacus")
                super().clip_and_accumulate()

        real_noise = dp_optimizer.gaussian_noise

        def gaussian_noise(shape, std, generator, **kw):
            spy.noise_stds.append(float(std))
            spy.secret.append(isinstance(generator, SecretGenerator))
            return real_noise(shape, std, generator, **kw)

        real_batch, real_step = tr.poisson_batch, tr.discriminator_step

        def poisson_batch(n, q, generator, device):
            idx = real_batch(n, q, generator, device)
            spy.batches.append((n, q, len(idx)))
            spy.secret.append(isinstance(generator, SecretGenerator))
            return idx

        def discriminator_step(d_net, opt_d, x_real, y_real, x_fake, y_fake, **backend):
            spy.real_rows.append(len(x_real))
            return real_step(d_net, opt_d, x_real, y_real, x_fake, y_fake, **backend)

        monkeypatch.setattr(tr, "DPSGDOptimizer", SpyOptimizer)
        monkeypatch.setattr(dp_optimizer, "gaussian_noise", gaussian_noise)
        monkeypatch.setattr(tr, "poisson_batch", poisson_batch)
        monkeypatch.setattr(tr, "discriminator_step", discriminator_step)


@pytest.mark.parametrize("backend", ["ghost", "opacus"])
def test_sigma_clip_and_poisson_batch_match_the_ledger(tmp_path, monkeypatch, backend):
    spy = Spy(monkeypatch)
    _, ledger, _ = train_in_memory("dpgan", tmp_path, "dpgan.clip=0.5", f"dpgan.grad_backend={backend}", eps=10)
    hp = compose_cfg("dpgan", eps=10).dpgan
    assert spy.backends and set(spy.backends) == {backend}
    (entry,) = ledger.entries
    (opt,) = spy.optimizers
    steps = entry.count
    assert steps == int(hp.iters) * int(hp.n_critic) == len(spy.batches) == len(spy.real_rows)
    # noise: every parameter of every step gets std = z_ledger × C (sensitivity of a sum of C-clipped rows)
    assert opt["noise_multiplier"] == entry.noise_multipliers[0] and opt["clip"] == 0.5
    n_params = len(spy.noise_stds) // steps
    assert n_params > 0 and len(spy.noise_stds) == n_params * steps
    assert spy.noise_stds == pytest.approx([entry.noise_multipliers[0] * 0.5] * len(spy.noise_stds), rel=1e-12)
    # clipping: no sample's gradient leaves the C-ball, and the clip binds (so a larger C would show)
    assert max(spy.clipped_norms) <= 0.5 * (1 + 1e-4)
    # sampling: the Poisson batch drawn at the ledger's rate is the batch the step trains on
    n = ledger_n = spy.batches[0][0]
    assert all(b[0] == ledger_n and b[1] == pytest.approx(entry.sampling_rate, rel=1e-12) for b in spy.batches)
    assert entry.sampling == "poisson" and entry.sampling_rate == pytest.approx(int(hp.batch_size) / n)
    assert [b[2] for b in spy.batches] == spy.real_rows
    assert len(set(spy.real_rows)) > 1, "Poisson batches have random sizes"
    assert opt["expected_batch_size"] == int(hp.batch_size)
    # randomness: every noise draw and every Poisson batch came from a secret stream
    assert len(spy.secret) == len(spy.noise_stds) + len(spy.batches) and all(spy.secret)


def test_budget_guard_stops_exactly_at_the_limit(tmp_path):
    """σ fixed too small for the planned steps: training stops at the last step the budget allows."""
    _, ledger, _ = train_in_memory("dpgan", tmp_path, "dpgan.noise_multiplier=1.0", "dpgan.iters=40", eps=2.0)
    (entry,) = ledger.entries
    allowed = calibrate_steps(2.0, ledger.delta, lambda c: [LedgerEntry(entry.name, [1.0], "poisson",
                                                                        entry.sampling_rate, count=c)])
    assert 0 < allowed < 40, "test setup: the budget must bind before the planned 40 steps"
    assert entry.count == allowed
    assert ledger.epsilon() <= 2.0


def _shuffled_digits(run_dir) -> ImageDataset:
    """Another training set of the same size: digits with pixels scrambled and labels permuted."""
    from dpgen.data import load_dataset

    data = load_dataset("digits", str(run_dir / "data"))
    rng = np.random.default_rng(1)
    x = data.train.x.copy().reshape(len(data.train.x), -1)
    x = rng.permuted(x, axis=1).reshape(data.train.x.shape)
    y = rng.permutation(data.train.y)
    return ImageDataset(data.name, Split(x, y), data.test, data.classes)


def test_generator_depends_on_data_only_through_dp_sgd(tmp_path, monkeypatch):
    """With DP-SGD's released gradient replaced by a fixed tensor, G is bit-identical for any training set."""
    def fixed_release(self, closure=None):
        for p in self.params:
            p.grad = torch.full_like(p, 1e-3)
            p.grad_sample = None
        return True

    monkeypatch.setattr(tr.DPSGDOptimizer, "pre_step", fixed_release)
    from dpgen.data import load_dataset

    gen_a, _, _ = train_in_memory("dpgan", tmp_path / "a", eps=10)
    gen_b, _, _ = train_in_memory("dpgan", tmp_path / "b", eps=10, data=_shuffled_digits(tmp_path))
    assert len(load_dataset("digits", str(tmp_path / "a" / "data")).train.x) > 0
    for (k, va), vb in zip(gen_a.state_dict().items(), gen_b.state_dict().values()):
        assert torch.equal(va, vb), f"generator weight {k} depends on the data outside the mechanism"
    assert not math.isnan(float(next(iter(gen_a.state_dict().values())).sum()))
