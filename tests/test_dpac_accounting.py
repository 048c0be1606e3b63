"""dpac/gswgan accounting: the paper oracle (GS-WGAN 9.9926) and sound calibration to the target."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dpgen.gswgan.accounting import (gswgan_paper_epsilon, iteration_entries, paper_epsilon_fn, paper_max_iters,
                                   paper_noise_multiplier)
from dpgen.privacy import calibrate_noise_multiplier
from dpgen.privacy.ledger import compute_epsilon

K, B, T, DELTA = 1000, 32, 20000, 1e-5


def test_paper_mode_reproduces_gswgan_9_99():
    assert gswgan_paper_epsilon(1.07, K, T * B, DELTA) == pytest.approx(9.9926, abs=0.001)
    # through the ledger entries: GS-WGAN (D only) and DPAC (C path from 6000 on, ignored by the paper's count)
    fn = paper_epsilon_fn(B)
    assert fn(iteration_entries(1.07, K, B, T, None), DELTA) == pytest.approx(9.99, abs=0.01)
    assert fn(iteration_entries(1.07, K, B, T, 6000), DELTA) == pytest.approx(9.99, abs=0.01)
    assert paper_max_iters(1.07, K, B, DELTA, 10.0, 10**6) >= T > paper_max_iters(1.07, K, B, DELTA, 9.9, 10**6)
    assert paper_noise_multiplier(K, B, T, DELTA, 10.0) == pytest.approx(1.07, abs=0.005)


def test_sound_epsilon_of_the_paper_setting_is_far_above_10():
    eps = compute_epsilon(iteration_entries(1.07, K, B, T, None), DELTA)
    assert eps > 100, "all B gradients of one iteration come from one sampled discriminator (accounting.md §4)"


@pytest.mark.parametrize("c_start", [None, 6000])
def test_sound_calibration_meets_the_target(c_start):
    z = calibrate_noise_multiplier(10.0, DELTA, lambda v: iteration_entries(v, K, B, T, c_start))
    eps = compute_epsilon(iteration_entries(z, K, B, T, c_start), DELTA)
    assert eps <= 10.0 and eps == pytest.approx(10.0, rel=0.01)
    if c_start is None:
        assert 2.4 < z < 3.0, "about 2.7 for the GS-WGAN MNIST defaults (issue 3)"
    else:
        assert z > 3.0, "the second (classifier) path needs more noise per gradient"


def test_iteration_entries_split_at_classifier_start():
    es = iteration_entries(2.0, 10, 4, 10, 3, start=1)
    assert [(e.count, len(e.noise_multipliers)) for e in es] == [(2, 1), (7, 2)]
    assert es[0].noise_multipliers[0] == pytest.approx(1.0) and es[0].sampling_rate == pytest.approx(0.1)


@pytest.mark.parametrize("method", ["gswgan", "dpac", "efsgd"])
def test_paper_accounting_runs_the_noiseless_reference_at_eps_inf(method, tmp_path):
    """eps=inf under privacy.accounting=paper: the paper calibration gives z = 0 and its iteration cap does not
    bind (GS-WGAN's analysis is never asked about a noiseless run)."""
    from tiny import train_in_memory

    assert paper_noise_multiplier(1000, 32, 20000, 1e-5, math.inf) == 0.0
    assert paper_max_iters(0.0, 1000, 32, 1e-5, math.inf, 123) == 123
    _, ledger, _ = train_in_memory(method, tmp_path, eps="inf", accounting="paper")
    assert ledger.privacy_off and ledger.accounting == "paper"
    assert sum(e.count for e in ledger.entries) == 4, "the configured iterations (tiny: 4) end training"
    assert all(z == 0.0 for e in ledger.entries for z in e.noise_multipliers)
    js = ledger.to_json()
    assert js["epsilon"] == math.inf and js["valid_dp_guarantee"] is False


def test_poisson_partitions_and_the_extended_paper_analysis_use_rate_m_over_k():
    """m partitions per iteration: the sound entries sample at m/K (one Gaussian z/√B per path), and the paper
    analysis composes B·T Gaussians sampled m of K without replacement (per_iter=1 is GS-WGAN's 1/K)."""
    import dp_accounting
    from dp_accounting import rdp as dp_rdp

    es = iteration_entries(3.0, 200, 16, 100, None, per_iter=20)
    assert [(e.sampling, e.sampling_rate, e.count) for e in es] == [("poisson", pytest.approx(0.1), 100)]
    assert es[0].noise_multipliers == pytest.approx([3.0 / 4])
    acct = dp_rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acct.compose(dp_accounting.SampledWithoutReplacementDpEvent(200, 20, dp_accounting.GaussianDpEvent(3.0)), 1600)
    orders = np.array(acct._orders, dtype=float)
    direct = float(np.nanmin(acct._rdp - math.log(DELTA) / (orders - 1.0)))  # Mironov's conversion, as the paper
    assert gswgan_paper_epsilon(3.0, 200, 1600, DELTA, per_iter=20) == pytest.approx(direct, rel=1e-9)
    assert paper_epsilon_fn(16, per_iter=20)(es, DELTA) == pytest.approx(direct, rel=1e-9)
    assert gswgan_paper_epsilon(3.0, 200, 1600, DELTA, per_iter=20) > gswgan_paper_epsilon(3.0, 200, 1600, DELTA)
