"""Non-private reference training of DPAF's networks: the "SGD" row of the paper's Table XVII.

Used only by ``scripts/audit_mia.py`` to measure how much a generator leaks membership WITHOUT privacy.
It is never reachable from ``scripts/train.py`` and releases nothing: training with no clipping, no noise
and no aggregation has no DP guarantee at all.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from dpgen.data.base import ImageDataset
from dpgen.data.torch_utils import to_float
from dpgen.dpaf.mechanisms import schedule
from dpgen.dpaf.nets import DpafNet, resolve_layers
from dpgen.nets.dcgan import CondGenerator


def train_plain(hp: DictConfig, data: ImageDataset, seed: int = 0, device: str | torch.device = "cpu",
                d_batches: int | None = None) -> CondGenerator:
    """Same G and D̂ as :func:`dpgen.dpaf.train.train` (D̂ = D without aggregation, all layers trainable),
    trained by plain Adam on the non-saturating BCE loss: D every batch, G every ``n_critic`` batches
    (the Fig. 7 G cadence). ``d_batches`` defaults to what the DP run does in phase 2: groups·μ batches,
    groups = ⌈d_epochs·N/(μB)⌉. Batches are drawn uniformly with replacement of size B = ``hp.batch_size``.
    """
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(int(seed))
    torch.manual_seed(int(seed))
    x_all = to_float(data.train.x).to(dev)
    y_all = torch.as_tensor(data.train.y, dtype=torch.long, device=dev)
    n, k, shape = len(x_all), data.num_classes, list(data.shape)
    mu, n_critic, bsz = int(hp.mu), int(hp.n_critic), min(int(hp.batch_size), n)
    if d_batches is None:
        d_batches = max(1, int(-(-float(hp.d_epochs) * n // (mu * int(hp.batch_size))))) * mu
    layers = resolve_layers(hp.layers, shape[1])
    d_net = DpafNet(shape, layers, out_dim=1, num_classes_in=k, width=int(hp.width), fc_hidden=int(hp.fc_hidden),
                    activation=hp.activation).to(dev)
    g_net = CondGenerator(k, shape, z_dim=int(hp.z_dim), width=int(hp.g_width)).to(dev)
    opt_d = torch.optim.Adam(d_net.parameters(), lr=float(hp.lr_d), betas=tuple(hp.betas))
    opt_g = torch.optim.Adam(g_net.parameters(), lr=float(hp.lr_g), betas=tuple(hp.betas))
    eps = float(hp.sin_eps)

    def fake(m: int):
        y = torch.randint(0, k, (m,), generator=gen, device=dev)
        return g_net(torch.randn(m, g_net.z_dim, generator=gen, device=dev), y), y

    ones, zeros = torch.ones(bsz, device=dev), torch.zeros(bsz, device=dev)
    for i in range(1, d_batches + 1):
        idx = torch.randint(0, n, (bsz,), generator=gen, device=dev)
        with torch.no_grad():
            xf, yf = fake(bsz)
        opt_d.zero_grad(set_to_none=True)
        loss_d = (F.binary_cross_entropy_with_logits(d_net.score(d_net.features(x_all[idx], y_all[idx], eps)), ones)
                  + F.binary_cross_entropy_with_logits(d_net.score(d_net.features(xf, yf, eps)), zeros))
        loss_d.backward()
        opt_d.step()
        if "G" in schedule(i, mu, n_critic):
            opt_g.zero_grad(set_to_none=True)
            xf, yf = fake(bsz)
            F.binary_cross_entropy_with_logits(d_net.score(d_net.features(xf, yf, eps)), ones).backward()
            opt_g.step()
    return g_net.eval()
