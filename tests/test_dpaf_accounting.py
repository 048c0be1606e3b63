"""DPAF accounting: one ledger, joint conv2*+DPAGG sampling events, budget split, paper mode."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from dpgen.data.base import ImageDataset, Split
from dpgen.dpaf.accounting import CONV1, GROUP, paper_epsilon_fn, paper_parts, parse_split
from dpgen.errors import DpgenError
from dpgen.privacy import LedgerEntry, PrivacyLedger
from dpgen.privacy.ledger import compute_epsilon

from conftest import in_memory_run

HP = {"layers": None, "width": 4, "fc_hidden": 8, "activation": "lrelu", "conv1": "transfer",
      "split": [0.5, None, 0.5], "split_unit": "eps", "batch_size": 20, "c_batch_size": 40, "mu": 2, "n_critic": 2,
      "c_epochs": 0.5, "d_epochs": 0.5, "clip_c": 1.0, "clip_d": 1.0, "gc_keep": 0.9, "sin_eps": 1e-5,
      "lr_c": 2e-4, "lr_d": 2e-4, "lr_g": 2e-4, "betas": [0.5, 0.999], "z_dim": 8, "g_width": 8}


def _train(tmp_path, accounting: str, eps: float = 4.0, **over):
    from dpgen.core.config import register_resolvers
    from dpgen.dpaf import train

    register_resolvers()
    rng = np.random.default_rng(0)
    split = Split(rng.integers(0, 256, (200, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, 200).astype(np.int64))
    data = ImageDataset("toy", split, split, [str(i) for i in range(10)])
    ledger = PrivacyLedger(delta=1e-4, target_epsilon=eps, accounting=accounting)
    run = in_memory_run(tmp_path, ledger)
    gen = train(OmegaConf.create({**HP, **over}), data, ledger, run)
    state = torch.load(run.checkpoint_path, weights_only=False)["state"]
    return gen, ledger, state


def test_sound_ledger_has_conv1_steps_and_one_joint_event_per_group(tmp_path):
    gen, ledger, state = _train(tmp_path, "sound")
    assert [e.name for e in ledger.entries] == [CONV1, GROUP]
    c1, grp = ledger.entries
    assert (c1.sampling, c1.count, c1.sampling_rate) == ("poisson", 3, pytest.approx(40 / 200))  # ceil(0.5*200/40)
    assert c1.noise_multipliers == [pytest.approx(state["z1"])]
    # 0.5 * 200 / (2 * 20) -> 3 groups; conv2* and DPAGG on one sample of rate mu*B/N: ONE event, two sigmas
    assert (grp.sampling, grp.count, grp.sampling_rate) == ("poisson", 3, pytest.approx(2 * 20 / 200))
    assert grp.noise_multipliers == [pytest.approx(state["z3"]), pytest.approx(state["z2"])]
    # conv1 gets eps1 = 0.5 alone; the whole ledger meets the target
    assert compute_epsilon([c1], 1e-4) == pytest.approx(0.5, rel=0.01)
    assert compute_epsilon([c1], 1e-4) <= 0.5
    assert ledger.epsilon() <= 4.0 and ledger.epsilon() == pytest.approx(4.0, rel=0.01)
    assert ledger.valid_dp_guarantee and ledger.paper_epsilon is None and not ledger.notes
    # DPAGG alone on top of conv1 costs eps1 + eps3 = 1.0
    only3 = LedgerEntry(GROUP, [state["z3"]], "poisson", grp.sampling_rate, grp.count)
    assert compute_epsilon([c1, only3], 1e-4) == pytest.approx(1.0, rel=0.01)
    x, _ = gen.sample(10)
    assert x.shape == (10, 1, 28, 28) and 0 <= x.min() and x.max() <= 1


def test_paper_mode_sum_of_parts_and_not_valid(tmp_path):
    _, ledger, state = _train(tmp_path, "paper")
    js = ledger.to_json()
    assert js["valid_dp_guarantee"] is False and js["accounting"] == "paper"
    assert any("couples all samples" in n for n in js["notes"]) and any("conv2*" in n for n in js["notes"])
    # the paper's epsilon: eps1 + eps2 + eps3, each part alone (0.5 + 3.0 + 0.5)
    parts = paper_parts(ledger.entries, mu=2)
    eps_parts = [compute_epsilon(p, 1e-4) for p in parts.values()]
    assert eps_parts == [pytest.approx(0.5, rel=0.01), pytest.approx(3.0, rel=0.01), pytest.approx(0.5, rel=0.01)]
    assert js["epsilon"] == pytest.approx(sum(eps_parts))
    assert parts["dpagg"][0].sampling_rate == pytest.approx(20 / 200) and parts["dpagg"][0].count == 6
    # the release is still recorded as it happened: a joint event per group
    assert ledger.entries[-1].name == GROUP and len(ledger.entries[-1].noise_multipliers) == 2
    assert js["sound_epsilon"] != pytest.approx(js["epsilon"], rel=1e-3)


def test_paper_epsilon_fn_splits_joint_entry():
    e = LedgerEntry(GROUP, [5.0, 1.0], "poisson", 0.08, 10)
    fn = paper_epsilon_fn(mu=4, accountant="rdp")
    want = (compute_epsilon([LedgerEntry("a", [5.0], "poisson", 0.02, 40)], 1e-5)
            + compute_epsilon([LedgerEntry("b", [1.0], "poisson", 0.08, 10)], 1e-5))
    assert fn([e], 1e-5) == pytest.approx(want)


def test_budget_split_notations():
    s = parse_split([0.1, None, 0.1], "eps", 10.0, True)
    assert (s.eps1, s.eps2, s.eps3, s.last) == (pytest.approx(0.1), pytest.approx(9.8), pytest.approx(0.1), "conv2")
    s = parse_split([0.2, 0.6, None], "fraction", 10.0, True)
    assert (s.eps1, s.eps2, s.eps3, s.last) == (pytest.approx(2.0), pytest.approx(6.0), pytest.approx(2.0), "dpagg")
    s = parse_split([None, None, 0.5], "eps", 1.0, False)  # Table IV "(x, 0.5)": random conv1
    assert (s.eps1, s.eps3) == (0.0, 0.5)
    for bad in ([0.1, None, None], [0.5, None, 0.6], [None, None, 0.1]):
        with pytest.raises(DpgenError):
            parse_split(bad, "eps", 1.0, True)


@pytest.mark.slow
def test_random_and_joint_conv1_variants_train(tmp_path):
    for mode in ("random", "joint"):
        _, ledger, _ = _train(tmp_path / mode, "sound", conv1=mode, split=[None, None, 0.5])
        assert [e.name for e in ledger.entries] == [GROUP]
        assert ledger.epsilon() <= 4.0


def _oracle_epsilon(parts: list[tuple[float, float, int]], delta: float, pld: bool = False) -> float:
    """ε of Poisson-subsampled Gaussians (noise multiplier, rate, steps) composed, straight from dp_accounting's
    events (no dpgen ledger code): the independent check of what the ledger reports."""
    import dp_accounting
    from dp_accounting import pld as dp_pld
    from dp_accounting import rdp as dp_rdp

    event = dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), t)
        for z, q, t in parts])
    rel = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    acct = dp_pld.PLDAccountant(neighboring_relation=rel) if pld else dp_rdp.RdpAccountant(neighboring_relation=rel)
    return acct.compose(event).get_epsilon(delta)


def test_sound_epsilon_matches_an_independent_oracle(tmp_path):
    """The run's sound ε, recomputed from its plan (t1 conv1 steps at B_C/N; per group ONE Poisson sample of rate
    μB/N carrying DPAGG (z3) and conv2* (z2), i.e. one Gaussian with σ = (z3⁻² + z2⁻²)^-½) and the σ's training
    used (checkpoint state), agrees with the ledger; PLD, near exact, is below it; and counting DPAGG and conv2*
    as independently sampled releases would understate ε."""
    _, ledger, state = _train(tmp_path, "sound")
    n, t1, groups = 200, 3, 3  # HP: ceil(0.5·200/40), ceil(0.5·200/(2·20))
    z1, z2, z3 = state["z1"], state["z2"], state["z3"]
    joint = (z3 ** -2 + z2 ** -2) ** -0.5
    plan = [(z1, 40 / n, t1), (joint, 2 * 20 / n, groups)]
    oracle = _oracle_epsilon(plan, 1e-4)
    assert ledger.epsilon() == pytest.approx(oracle, rel=1e-9)
    assert ledger.epsilon() <= 4.0 and oracle == pytest.approx(4.0, rel=0.01)
    assert _oracle_epsilon(plan, 1e-4, pld=True) <= oracle
    apart = [(z1, 40 / n, t1), (z3, 2 * 20 / n, groups), (z2, 2 * 20 / n, groups)]
    assert _oracle_epsilon(apart, 1e-4) < oracle


def test_paper_epsilon_matches_an_independent_oracle(tmp_path):
    """Paper mode reports Theorem 6's ε1 + ε2 + ε3, each part converted on its own: conv1 as run, DPAGG as μ·G
    batches of rate B/N, conv2* as G batches of rate μB/N."""
    _, ledger, state = _train(tmp_path, "paper")
    n, t1, groups, mu = 200, 3, 3, 2
    parts = [[(state["z1"], 40 / n, t1)], [(state["z3"], 20 / n, mu * groups)], [(state["z2"], mu * 20 / n, groups)]]
    assert ledger.report_epsilon() == pytest.approx(sum(_oracle_epsilon(p, 1e-4) for p in parts), rel=1e-9)
