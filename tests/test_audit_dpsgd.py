"""DP-SGD's and DPAGG's canaries, summed sparsely (dpgen.audit.hooks): a canary's Dirac row is clipped by the
optimizer's own factors and released on its reserved coordinate, with the optimizer's noise, and the model's
update is what it is without canaries."""
from __future__ import annotations

import pytest
import torch
from opacus import GradSampleModule
from torch import nn

from dpgen.audit.canaries import Canaries
from dpgen.audit.hooks import DIRAC_NORM, DpsgdCanaries, FeatureCanaries
from dpgen.dpaf.mechanisms import CompressedDPOptimizer, compress_top
from dpgen.privacy.optimizer import DPSGDOptimizer
from dpgen.privacy.randomness import secret_generator


def canaries_of(m: int) -> Canaries:
    c = Canaries(m, lambda name: secret_generator("cpu", seed=3), "cpu")
    c.included = torch.ones(m, dtype=torch.bool)
    c.members = torch.arange(m)
    return c


def one_step(canaries: bool, sigma: float, compressed: bool, m: int = 3000, clip: float = 0.05):
    """One DP-SGD step of a small net on 7 records (and canaries 0, 2 and m-1 when ``canaries``)."""
    torch.manual_seed(0)
    net = GradSampleModule(nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2)), loss_reduction="sum")
    can = (DpsgdCanaries(canaries_of(m), "dp-sgd", clip, sigma, lambda: torch.tensor([0, 2, m - 1]))
           if canaries else None)
    cls, kw = (CompressedDPOptimizer, {"keep": 0.9}) if compressed else (DPSGDOptimizer, {})
    opt = cls(torch.optim.SGD(net.parameters(), lr=0.0), noise_multiplier=sigma, max_grad_norm=clip,
              expected_batch_size=7, loss_reduction="sum", generator=secret_generator("cpu", seed=5),
              canaries=can, **kw)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(7, 6, generator=g) * 10, torch.randn(7, 2, generator=g)
    nn.functional.mse_loss(net(x), y, reduction="sum").backward()
    released = []
    if can is not None:
        can.observe = lambda grad: released.append(grad.detach().clone())
    opt.step()
    return [p.grad.detach().clone() for p in net.parameters()], (released[0] if released else None), opt


@pytest.mark.parametrize("compressed", [False, True], ids=["opacus", "dpaf-compressed"])
def test_dpsgd_canaries_are_clipped_to_c_on_their_coordinates_and_leave_the_model_alone(compressed):
    clip = 0.05
    plain, _, _ = one_step(False, 0.0, compressed, clip=clip)
    model, released, opt = one_step(True, 0.0, compressed, clip=clip)
    for a, b in zip(plain, model):
        assert torch.equal(a, b)
    assert opt.real_rows == 7
    hit = torch.zeros_like(released, dtype=torch.bool)
    hit[[0, 2, -1]] = True
    value = DIRAC_NORM * clip
    assert torch.allclose(released[hit], torch.full((3,), value * clip / (value + 1e-6)), rtol=1e-6)
    assert torch.count_nonzero(released[~hit]) == 0


def test_dpsgd_canary_coordinates_get_the_optimizers_noise():
    """σ = 2: the reserved coordinates not hit carry N(0, σ²C²); half the σ would read half the std."""
    sigma, clip = 2.0, 0.05
    _, released, _ = one_step(True, sigma, False, m=20000, clip=clip)
    rest = torch.cat([released[1:2], released[3:-1]])
    assert rest.std().item() == pytest.approx(sigma * clip, rel=0.03)


@pytest.mark.parametrize("d", [600, 9000])
def test_compress_top_passes_a_dirac_row_unchanged(d):
    """A canary's row has one non-zero entry, its largest: gradient compression keeps it, so clipping the
    canaries apart from the compressed records' rows is what compressing them together would give."""
    rows = torch.zeros(4, d)
    rows[torch.arange(4), torch.tensor([0, 7, d // 2, d - 1])] = DIRAC_NORM * 0.05
    assert torch.equal(compress_top(rows, 0.9, torch.Generator().manual_seed(0)), rows)


def test_dpagg_canaries_sum_their_sub_batchs_rows():
    """The sampled canaries of sub-batch j (canary i in sub-batch i mod μ) each add √m·p on their coordinate."""
    fc = FeatureCanaries(canaries_of(10), "dpagg", 2.5, 1.0, 0.5, 3)
    fc.sampled = torch.tensor([0, 1, 3, 4, 9])
    want = {0: [0, 3, 9], 1: [1, 4], 2: []}
    for j, idx in want.items():
        expected = torch.zeros(10)
        expected[idx] = 2.5
        assert torch.equal(fc.summed(j), expected) and fc.part == j
