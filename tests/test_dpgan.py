"""dpgan's DP-SGD discriminator step: clipping (sensitivity C), noise scale σ·C, ledger composition."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from opacus import GradSampleModule

from dpgen.data.base import ImageDataset, Split
from dpgen.dpgan.train import discriminator_step, poisson_batch
from dpgen.nets.dcgan import ProjectionDiscriminator
from dpgen.privacy import PrivacyLedger
from dpgen.privacy.optimizer import DPSGDOptimizer
from dpgen.privacy.randomness import secret_generator

from conftest import in_memory_run


def _private_d(sigma: float, clip: float, batch: int, seed: int = 0):
    torch.manual_seed(seed)
    d = GradSampleModule(ProjectionDiscriminator(10, [1, 28, 28], width=4), loss_reduction="sum")
    opt = DPSGDOptimizer(torch.optim.SGD(d.parameters(), lr=1.0), noise_multiplier=sigma, max_grad_norm=clip,
                         expected_batch_size=batch, loss_reduction="sum", generator=secret_generator("cpu", seed=seed))
    return d, opt


def _per_sample_grads(d: GradSampleModule, x, y, target) -> torch.Tensor:
    """Reference per-sample gradients with torch.func on a hook-free copy, independent of opacus."""
    from torch.func import functional_call, grad, vmap

    module = ProjectionDiscriminator(10, [1, 28, 28], width=4)
    module.load_state_dict(d._module.state_dict())
    params = {k: v.detach() for k, v in module.named_parameters()}

    def loss(p, xi, yi, ti):
        out = functional_call(module, p, (xi[None], yi[None]))
        return F.binary_cross_entropy_with_logits(out, ti[None], reduction="sum")

    g = vmap(grad(loss), in_dims=(None, 0, 0, 0))(params, x, y, target)
    return torch.cat([g[k].reshape(len(x), -1) for k in params], dim=1)


def test_clipping_bounds_each_sample_and_noise_free_sum_matches_reference():
    clip = 0.05  # small enough that every sample is clipped
    d, opt = _private_d(sigma=0.0, clip=clip, batch=8)
    x, y = torch.rand(6, 1, 28, 28), torch.randint(0, 10, (6,))
    xf, yf = torch.rand(2, 1, 28, 28), torch.randint(0, 10, (2,))
    before = torch.cat([p.detach().flatten().clone() for p in d.parameters()])
    discriminator_step(d, opt, x, y, xf, yf)
    after = torch.cat([p.detach().flatten() for p in d.parameters()])
    target = torch.cat([torch.ones(6), torch.zeros(2)])
    d2, _ = _private_d(sigma=0.0, clip=clip, batch=8)
    ps = _per_sample_grads(d2, torch.cat([x, xf]), torch.cat([y, yf]), target)
    norms = ps.norm(dim=1, keepdim=True)
    assert (norms > clip).all(), "test setup: every sample should need clipping"
    clipped = ps * (clip / norms).clamp(max=1.0)
    assert (clipped.norm(dim=1) <= clip * (1 + 1e-5)).all()
    # SGD lr=1, loss_reduction=sum: the update is exactly minus the sum of clipped gradients
    torch.testing.assert_close(before - after, clipped.sum(0), rtol=1e-4, atol=1e-6)
    # sensitivity: dropping one real record changes the released sum by at most C
    assert (clipped.sum(0) - clipped[1:].sum(0)).norm() <= clip * (1 + 1e-5)


def test_noise_std_is_sigma_times_clip():
    sigma, clip = 2.0, 1.5
    d, opt = _private_d(sigma=sigma, clip=clip, batch=8)
    x, y = torch.rand(4, 1, 28, 28), torch.randint(0, 10, (4,))
    opt.zero_grad(set_to_none=True)
    (d(x, y).sum() * 0.0).backward()  # zero gradients: what remains after pre_step is the noise
    opt.pre_step()
    noise = torch.cat([p.grad.flatten() for p in d.parameters()])
    assert noise.numel() > 1000
    assert noise.std().item() == pytest.approx(sigma * clip, rel=0.05)
    assert abs(noise.mean().item()) < 0.1


def test_poisson_batch_rate():
    g = secret_generator("cpu", seed=0)
    sizes = [len(poisson_batch(10_000, 0.02, g, torch.device("cpu"))) for _ in range(50)]
    assert np.mean(sizes) == pytest.approx(200, rel=0.05)
    assert len(set(sizes)) > 5, "Poisson batches must have random sizes"


def test_training_records_one_poisson_entry_per_step_and_meets_target(tmp_path):
    from dpgen.core.config import register_resolvers
    from dpgen.dpgan import train

    register_resolvers()
    rng = np.random.default_rng(0)
    split = Split(rng.integers(0, 256, (400, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, 400).astype(np.int64))
    data = ImageDataset("toy", split, split, [str(i) for i in range(10)])
    hp = OmegaConf.create({"iters": 5, "n_critic": 2, "batch_size": 40, "clip": 1.0, "noise_multiplier": None,
                           "lr_d": 2e-4, "lr_g": 2e-4, "mode_seeking": 1.0, "betas": [0.5, 0.999], "z_dim": 8, "g_width": 8, "d_width": 4})
    ledger = PrivacyLedger(delta=1e-5, target_epsilon=4.0)
    run = in_memory_run(tmp_path, ledger)
    gen = train(hp, data, ledger, run)
    assert len(ledger.entries) == 1
    e = ledger.entries[0]
    assert (e.name, e.sampling, e.count) == ("dpgan.discriminator", "poisson", 10)
    assert e.sampling_rate == pytest.approx(40 / 400)
    assert ledger.epsilon() <= 4.0 and ledger.epsilon() == pytest.approx(4.0, rel=0.01), "σ is calibrated to the target"
    x, labels = gen.sample(20)
    assert x.shape == (20, 1, 28, 28) and 0 <= x.min() and x.max() <= 1
