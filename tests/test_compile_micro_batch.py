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


class _FakeMemory:
    """Allocator statistics of a fake device: ``peak()`` is what the spy says the last run held."""

    def __init__(self, held) -> None:
        self.held = held

    def start(self) -> int:
        return 7  # bytes held before the run (the model): subtracted

    def peak(self) -> int:
        return 7 + self.held()


def test_measured_footprint_is_the_peak_growth_per_record_after_a_warm_up():
    runs = []
    held = {2: 5_000 + 2 * 300, 6: 5_000 + 6 * 300}

    def run(m):
        runs.append(m)

    def last():
        return held[runs[-1]] + (9_999 if len(runs) == 1 else 0)  # a one-time allocation in the warm-up run
    from dpgen.privacy.micro_batch import PROBE_SIZES, measured_footprint
    assert measured_footprint(run, _FakeMemory(last)) == 300
    assert runs == list(PROBE_SIZES) == [2, 2, 6]


def test_null_on_a_measured_device_probes_the_runs_step_on_zeros(monkeypatch):
    """With the run's step (CUDA: here a fake allocator), the step itself runs on 2, 2 and 6 records of zeros with
    K rows each, and the micro-batch takes the measured fraction of the free memory with the measured margin."""
    import dpgen.privacy.micro_batch as mb
    from dpgen.feta.dpsgd import MicroStep

    net, k = _net(), 4
    step = MicroStep(net, 0.5, grad_backend="ghost")
    seen = []
    inner = step.fn
    step.fn = lambda w, *b: (seen.append((b[0].shape[:2], float(b[0].abs().sum()))), inner(w, *b))[1]
    monkeypatch.setattr(mb, "free_memory", lambda device: 10**9)
    m = micro_batch_for(net, None, k, [1, 8, 8], 4096, torch.device("cpu"), step=step,
                        memory=_FakeMemory(lambda: seen[-1][0][0] * 10**6))
    assert [s for s, _ in seen] == [(2, k), (2, k), (6, k)] and all(v == 0.0 for _, v in seen)
    fit = mb.MEASURED_FRACTION * 10**9 / (mb.MEASURED_MARGIN * 10**6)  # 640 records
    assert m == 512 and m <= fit < 2 * m
    assert micro_batch_for(net, None, k, [1, 8, 8], 64, torch.device("cpu"), step=step,
                           memory=_FakeMemory(lambda: seen[-1][0][0] * 10**6)) == 64, "capped by the batch"
