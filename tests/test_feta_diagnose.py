"""The signal/noise that feta's and dpdm's DP-SGD steps log (``snr``) and ``python -m dpgen.feta.diagnose``: the
formula, and that the loop computes it from the very sums and σ it noises."""
from __future__ import annotations

import math

import pytest
import torch

from tiny import TINY


def test_signal_to_noise_is_the_summed_norm_over_the_noise_norm():
    from dpgen.feta.dpsgd import signal_to_noise

    sums = [torch.full((4,), 1.0), torch.full((5,), 2.0)]  # ‖·‖ = √(4 + 20), d = 9
    assert signal_to_noise(sums, 2.0, 0.5).item() == pytest.approx(math.sqrt(24) / (2.0 * 0.5 * 3.0))
    assert math.isinf(signal_to_noise(sums, 0.0, 1.0).item())  # eps=inf: no noise


@pytest.mark.parametrize("method", ["dpdm", "feta"])
def test_the_logged_snr_uses_the_sums_and_sigma_that_are_noised(method, tmp_path, monkeypatch, one_torch_thread):
    import importlib

    feta_train = importlib.import_module("dpgen.feta.train")  # dpgen.feta.train is also the function's name
    from dpgen.feta.diagnose import measure
    from dpgen.feta.dpsgd import signal_to_noise

    seen = []
    real = feta_train.set_noisy_grads

    def spy(params, sums, sigma, clip, expected_batch, generator):
        seen.append(signal_to_noise(sums, sigma, clip).item())
        return real(params, sums, sigma, clip, expected_batch, generator)

    monkeypatch.setattr(feta_train, "set_noisy_grads", spy)
    out = measure(method, 1, "digits", 2, str(tmp_path / "data"), [*TINY[method], "feta.iters=3"])
    assert len(seen) == out["steps"] == 2
    assert out["snr"] == pytest.approx(sum(seen) / 2, rel=1e-5)  # the median of two steps
    assert 0 < out["sigma"] and out["snr"] > 0

