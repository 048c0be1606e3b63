"""``${by_eps:...}``: a value chosen by the run's target ε (dpgen/core/config.py), and the ledger still meeting
its target at every ε of a sweep when a profile's iterations, batch or teacher count depend on ε.

No training: each ε's config is composed as scripts/train.py composes it, and the method's own calibration
(``plan_noise``, ``calibrate_sigmas``) plans its noise; the planned releases then go into a ledger whose ε must
not exceed the target, and whose budget guard must allow every planned step."""
from __future__ import annotations

import math

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from inprocess import call, one_error

from dpgen.core.config import by_eps, register_configs
from dpgen.core.methods import CONFIG_DIR
from dpgen.errors import DpgenError
from dpgen.privacy import PrivacyLedger, parse_epsilon

TABLE = {1: "a", 5: "b", "default": "c"}
SWEEP = ("1", "2", "5", "10")
N_FMNIST, SHAPE = 60000, [1, 28, 28]


def _compose(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides))
    OmegaConf.resolve(cfg)
    return cfg


@pytest.mark.parametrize("eps, expected", [
    (0.1, "a"), (1, "a"), ("1.0", "a"),          # a key is an upper bound: ε = 1 is in "ε <= 1"
    (1.0001, "b"), (2, "b"), (5, "b"),          # between two keys: the next larger key's value
    (5.5, "c"), (10, "c"), ("inf", "c"), (math.inf, "c"), (".inf", "c"),  # above every key, and privacy off
])
def test_the_smallest_key_at_or_above_eps_applies(eps, expected):
    assert by_eps(TABLE, eps) == expected


def test_keys_need_no_order_and_inf_may_replace_default():
    assert by_eps({10: "x", 1: "y"}, 3) == "x"
    assert by_eps({1: "y", math.inf: "z"}, "inf") == "z" and by_eps({1: "y", "inf": "z"}, 2) == "z"
    assert by_eps({"0.5": "s", "default": "d"}, 0.4) == "s"  # a key written as a string is parsed as ε


@pytest.mark.parametrize("table, eps, needle", [
    ({1: "a"}, 2, "no value for eps=2 in by_eps table {1: 'a'}: its largest key is 1; add a default"),
    ({1: "a"}, "inf", "no value for eps=inf"),
    ({}, 1, "by_eps takes a table of epsilon thresholds"),
    (300, 1, "by_eps takes a table of epsilon thresholds"),
    ({"low": 1, "default": 2}, 1, "by_eps keys are epsilon thresholds (positive numbers or inf) or default, got 'low'"),
    ({0: 1, "default": 2}, 1, "got 0"),
    ({-1: 1, "default": 2}, 1, "got -1"),
    ({1: 1, "1.0": 2}, 1, "by_eps has epsilon threshold 1 twice"),
    ({1: 1, math.inf: 2, "default": 3}, 1, "both inf and default"),
    ({1: 1, "default": 2}, "abc", "eps (target epsilon) must be a positive number or inf"),
])
def test_a_bad_table_is_one_line(table, eps, needle):
    with pytest.raises(DpgenError) as info:
        by_eps(table, eps)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_the_resolver_reads_the_runs_eps_in_a_config_file_and_on_the_command_line():
    table = "${by_eps:{1: 300, 5: 600, default: 1000}}"
    got = {eps: _compose("method=dpgan", f"eps={eps}", f"dpgan.iters='{table}'").dpgan.iters for eps in
           (*SWEEP, "inf")}
    assert got == {"1": 300, "2": 600, "5": 600, "10": 1000, "inf": 1000}
    # nested in another resolver, as a profile writes it
    cfg = _compose("method=dpgan", "eps=1", "profile=paper",
                   "dpgan.batch_size='${by_profile:${by_eps:{1: 512, default: 256}},64}'")
    assert cfg.dpgan.batch_size == 512


def test_a_bad_table_on_the_command_line_is_one_line_before_anything_exists(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPGEN_DATA", str(tmp_path / "data"))
    code, _, err = call(capsys, "train", "eps=20", "dpgan.iters='${by_eps:{1: 300, 10: 600}}'")
    assert "no value for eps=20 in by_eps table" in one_error(code, err)
    assert not (tmp_path / "outputs").exists()


def test_gpate_readme_rule_is_a_by_eps_table():
    """G-PATE's teacher count for a null ``gpate.teachers`` (its README's settings at ε = 1 and 10, applied in code as
    4000 for ε <= 1, else 2000) is the table ``{1: 4000, default: 2000}``: one rule for both."""
    from dpgen.gpate.train import resolve_hparams

    for eps in (0.5, 1, 1.5, 2, 5, 10):
        hp = _compose("method=gpate", "profile=paper", "dataset=fmnist", f"eps={eps}").gpate
        assert hp.teachers is None
        assert resolve_hparams(hp, float(eps), N_FMNIST, SHAPE)["teachers"] == by_eps({1: 4000, "default": 2000}, eps)


# ---- the ledger meets the target at every ε of a sweep ------------------------------------------------------

def _ledger(cfg) -> PrivacyLedger:
    return PrivacyLedger(float(cfg.delta), target_epsilon=parse_epsilon(cfg.eps), accountant=cfg.privacy.accountant)


def test_dpgan_with_eps_dependent_iterations_and_batch_meets_each_target():
    from dpgen.dpgan.train import ENTRY, plan_noise

    planned = {}
    for eps in SWEEP:
        cfg = _compose("method=dpgan", "dataset=fmnist", f"eps={eps}",
                       "dpgan.iters='${by_eps:{1: 300, 5: 800, default: 1500}}'",
                       "dpgan.batch_size='${by_eps:{2: 128, default: 256}}'")
        hp, ledger = cfg.dpgan, _ledger(cfg)
        q, steps = int(hp.batch_size) / N_FMNIST, int(hp.iters) * int(hp.n_critic)
        sigma = plan_noise(hp, ledger, q, steps)
        assert ledger.budget_guard(ENTRY, [sigma], "poisson", q).remaining >= steps, eps  # no step is cut
        ledger.record(ENTRY, [sigma], "poisson", q, count=steps)
        spent = ledger.epsilon()
        assert spent <= float(eps) and spent > 0.95 * float(eps), (eps, spent)  # met, and not far below
        planned[eps] = (steps, int(hp.batch_size), sigma)
    assert [p[:2] for p in planned.values()] == [(300, 128), (800, 128), (800, 256), (1500, 256)]


def test_gpate_quick_profile_meets_each_target_with_its_eps_dependent_sizes():
    """The quick profile's own ε table (configs/method/gpate.yaml): teachers, iterations and proj_dim per ε, the
    ledger meeting each target with every planned query, and σ2 against the teacher count kept near ε=10's ratio
    (a vote's top count is at most n: with 400 teachers at ε=1, σ2 ≈ 886 > n and the argmax reads noise)."""
    from dpgen.gpate.train import ENTRY, calibrate_sigmas, query_noise, resolve_hparams

    sizes = {}
    for eps in SWEEP:
        cfg = _compose("method=gpate", "dataset=fmnist", f"eps={eps}")
        ledger = _ledger(cfg)
        plan = resolve_hparams(cfg.gpate, float(eps), N_FMNIST, SHAPE)
        queries_per_iter, iters = plan["batch"] * plan["k"], int(cfg.gpate.iters)
        plan["sigma1"], plan["sigma2"] = calibrate_sigmas(ledger, plan["sigma_ratio"], iters * queries_per_iter,
                                                          threshold=plan["threshold"] is not None)
        nm = query_noise(plan)
        assert ledger.budget_guard(ENTRY, nm).remaining // queries_per_iter >= iters, eps  # no iteration is cut
        ledger.record(ENTRY, nm, count=iters * queries_per_iter)
        spent = ledger.epsilon()
        assert spent <= float(eps) and spent > 0.95 * float(eps), (eps, spent)
        assert 0.25 < plan["sigma2"] / plan["teachers"] < 0.4, (eps, plan["sigma2"], plan["teachers"])
        sizes[eps] = (plan["teachers"], iters, plan["k"], plan["batch"])
    assert sizes == {"1": (2000, 150, 20, 4), "2": (1000, 300, 10, 4), "5": (600, 600, 10, 4), "10": (400, 600, 10, 4)}
    for other in ("dataset=digits", "profile=paper"):  # the table is the quick F-MNIST-sized profile's only
        cfg = _compose("method=gpate", other, "eps=1")
        assert (cfg.gpate.teachers, cfg.gpate.proj_dim) == ((20, 10) if other == "dataset=digits" else (None, 10))


def test_gpate_with_eps_dependent_teachers_and_iterations_meets_each_target():
    from dpgen.gpate.train import ENTRY, calibrate_sigmas, query_noise, resolve_hparams

    teachers = []
    for eps in SWEEP:
        cfg = _compose("method=gpate", "dataset=fmnist", f"eps={eps}",
                       "gpate.teachers='${by_eps:{1: 200, default: 400}}'",
                       "gpate.iters='${by_eps:{1: 200, 5: 400, default: 600}}'")
        ledger = _ledger(cfg)
        plan = resolve_hparams(cfg.gpate, float(eps), N_FMNIST, SHAPE)
        queries_per_iter, iters = plan["batch"] * plan["k"], int(cfg.gpate.iters)
        plan["sigma1"], plan["sigma2"] = calibrate_sigmas(ledger, plan["sigma_ratio"], iters * queries_per_iter,
                                                          threshold=plan["threshold"] is not None)
        nm = query_noise(plan)
        assert ledger.budget_guard(ENTRY, nm).remaining // queries_per_iter >= iters, eps
        ledger.record(ENTRY, nm, count=iters * queries_per_iter)
        spent = ledger.epsilon()
        assert spent <= float(eps) and spent > 0.95 * float(eps), (eps, spent)
        teachers.append(plan["teachers"])
    assert teachers == [200, 400, 400, 400]
