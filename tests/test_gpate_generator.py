"""G-PATE's generator: batch statistics per group (official sampling), no private labels in its buffers,
the research option work_size."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from dpgen.gpate.nets import GPateGenerator, GPateTabularGenerator, GroupBatchNorm, dcgan_init_


@pytest.mark.parametrize("shape", [(8, 5), (8, 3, 4, 4)])
def test_group_batch_norm_is_batch_norm_per_group(shape):
    torch.manual_seed(0)
    h = torch.randn(*shape) * 3 + 1
    gbn = GroupBatchNorm(shape[1])
    ref = (nn.BatchNorm1d if len(shape) == 2 else nn.BatchNorm2d)(shape[1])
    torch.testing.assert_close(gbn(h, update=True), ref(h), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gbn.running_mean, ref.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gbn.running_var, ref.running_var, rtol=1e-5, atol=1e-6)
    grouped = gbn(h, group=4)
    torch.testing.assert_close(grouped, torch.cat([gbn(h[:4]), gbn(h[4:])]), rtol=1e-5, atol=1e-6)
    ref.eval()
    torch.testing.assert_close(gbn(h, running=True), ref(h), rtol=1e-5, atol=1e-6)
    assert set(gbn.state_dict()) == set(ref.state_dict()), "generator.pt keys as nn.BatchNorm's"


def _gen(**kw):
    torch.manual_seed(0)
    return dcgan_init_(GPateGenerator(10, [1, 28, 28], z_dim=6, gf_dim=4, gfc_dim=16, **kw))


def test_teacher_fakes_leave_nothing_in_the_generator():
    """Fakes built from the teachers' (private) labels use batch statistics and write no buffer; only G's own
    step (labels drawn without data) moves the running statistics."""
    g = _gen(sample_stats="running", sample_group=4)
    before = {k: v.clone() for k, v in g.state_dict().items()}
    with torch.no_grad():
        g(torch.rand(12, 6), torch.randint(0, 10, (12,)), group=4)
    assert all(torch.equal(before[k], v) for k, v in g.state_dict().items())
    g(torch.rand(4, 6), torch.randint(0, 10, (4,)), update_stats=True)
    assert not torch.equal(before["fc1.1.running_mean"], g.state_dict()["fc1.1.running_mean"])


def test_sampling_with_batch_statistics_as_the_official_code():
    g = _gen(sample_stats="batch", sample_group=4).eval()
    labels = torch.arange(10)
    x1, _ = g.sample(10, labels=labels, seed=3)
    x2, _ = g.sample(10, labels=labels, seed=3)
    assert torch.equal(x1, x2) and x1.shape == (10, 1, 28, 28), "seeded, and a size not a multiple of the group"
    # each released sample is G in training mode on a group of 4 (its group's statistics), not running ones
    running = GPateGenerator(**{**g.init_kwargs, "sample_stats": "running"})
    running.load_state_dict(g.state_dict())
    x3, _ = running.eval().sample(10, labels=labels, seed=3)
    assert not torch.allclose(x1, x3, atol=1e-3)
    gen = torch.Generator().manual_seed(0)
    z = torch.rand(8, 6, generator=gen) * 2 - 1
    y = torch.randint(0, 10, (8,), generator=gen)
    g.train()
    torch.testing.assert_close(g(z, y, group=4), torch.cat([g(z[:4], y[:4]), g(z[4:], y[4:])]), rtol=1e-5, atol=1e-6)


def test_work_size_generates_at_the_data_resolution():
    g = _gen(sample_stats="batch", sample_group=2, work_size=14)
    assert g(torch.rand(4, 6), torch.zeros(4, dtype=torch.long)).shape == (4, 1, 14, 14)
    x, _ = g.sample(6, seed=0)
    assert x.shape == (6, 1, 28, 28) and 0 <= x.min() and x.max() <= 1


def test_tabular_generator_keeps_running_statistics_and_loads_old_keys():
    g = GPateTabularGenerator(2, [5], z_dim=4, hidden=8)
    keys = set(g.state_dict())
    assert {"net.1.running_mean", "net.1.running_var", "net.1.num_batches_tracked"} <= keys
    before = g.state_dict()["net.1.running_mean"].clone()
    with torch.no_grad():
        g(torch.rand(6, 4), torch.zeros(6, dtype=torch.long), group=3)
    assert torch.equal(before, g.state_dict()["net.1.running_mean"])
    x, _ = g.eval().sample(5)
    assert x.shape == (5, 5) and torch.isfinite(x).all()
