"""``feta.micro_batch: null``: DP-SGD micro-batches sized from device memory (dpgen/privacy/micro_batch.py)."""
from __future__ import annotations

import pytest
import torch

from dpgen.feta.dpsgd import micro_batch_for
from dpgen.nets.edm import EDMDenoiser
from dpgen.nets.unet import UNet
from dpgen.privacy.micro_batch import FRACTION, MARGIN, auto_micro_batch, free_memory, record_footprint

from tiny import train_in_memory


def _net() -> EDMDenoiser:
    return EDMDenoiser(UNet(1, 8, 3, nf=4, ch_mult=[1, 2], num_res_blocks=1, attn_res=[4]))


def _example(dev: torch.device):
    return torch.zeros(1, 1, 8, 8, device=dev), torch.ones(1, device=dev), torch.zeros(1, dtype=torch.long, device=dev)


def test_the_footprint_is_k_rows_of_activations_plus_two_gradients_and_costs_no_memory():
    net = _net()
    params = sum(p.numel() * 4 for p in net.parameters())
    f1, f2, f3 = (record_footprint(net, _example, k) for k in (1, 2, 3))
    assert f2 - f1 == f3 - f2 > 0, "linear in the K draws of a record"
    assert f1 - (f2 - f1) == 2 * params, "one K-averaged gradient per record (and its clipped copy), not K"
    assert all(p.device.type == "cpu" for p in net.parameters()), "the network itself is untouched (a meta copy ran)"


def test_auto_micro_batch_fits_the_free_memory_with_a_margin():
    fp = 1000
    free = 10**6
    fit = int(FRACTION * free // (MARGIN * fp))
    m = auto_micro_batch(fp, torch.device("cpu"), cap=4096, free=free)
    assert m & (m - 1) == 0 and m <= fit < 2 * m, "the largest power of two that fits"
    assert auto_micro_batch(fp, torch.device("cpu"), cap=60, free=free) == 64, "capped by the batch (a bucket)"
    assert auto_micro_batch(fp, torch.device("cpu"), cap=4096, free=10) == 1, "never below one record"
    assert auto_micro_batch(fp, torch.device("cpu"), cap=4096, free=4 * free) >= 2 * m
    assert free_memory(torch.device("cpu")) > 0


def test_an_integer_keeps_todays_micro_batch_and_null_is_sized():
    net = _net()
    assert micro_batch_for(net, 16, 4, [1, 8, 8], 64, torch.device("cpu")) == 16
    m = micro_batch_for(net, None, 4, [1, 8, 8], 64, torch.device("cpu"))
    assert 1 <= m <= 64 and m & (m - 1) == 0


@pytest.mark.parametrize("method", ["dpdm"])
def test_a_run_with_micro_batch_null_trains_with_the_same_ledger(tmp_path, method):
    ledgers = []
    for mb in ("16", "null"):
        _, ledger, _ = train_in_memory(method, tmp_path / mb, f"feta.micro_batch={mb}", noise_seed=1)
        ledgers.append([e.to_dict() for e in ledger.entries])
    assert ledgers[0] == ledgers[1] and ledgers[0], "the split is not a privacy parameter"
