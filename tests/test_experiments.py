"""configs/experiment/: every sweep combination of every experiment composes into a valid job config.

No training: each combination is composed with Hydra's compose API exactly as the BasicSweeper would
build it (the experiment plus one value per swept key), resolved, and checked with the pipeline's
data-free validation.
"""
from __future__ import annotations

import itertools

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from dpgen.core.config import register_resolvers
from dpgen.core.methods import CONFIG_DIR, available
from dpgen.core.pipeline import validate

EXPERIMENTS = available("experiment")
# The tables the reproduction suite promises; a renamed or deleted file must fail here, not in a user's sweep.
REQUIRED = {"quick_all", "quick_all_feta_mode", "eps_sweep", "eps_sweep_feta_mode", "gpate_table1c", "dpac_table2",
            "efsgd_table2", "dpaf_table2", "feta_table2"}


def sweep_params(experiment: str) -> dict[str, str]:
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"+experiment={experiment}"], return_hydra_config=True)
    return {str(k): str(v) for k, v in (cfg.hydra.sweeper.params or {}).items()}


# Keys that change which method/dataset configs get composed: their full product is composed. Every other
# swept key (seed, privacy.accounting) only sets one value, so each of its values is composed once.
SHAPE_KEYS = ("method", "dataset", "eps", "profile", "feta.central")


def axes(params: dict[str, str]) -> dict[str, list[str]]:
    """Each swept key's values as the BasicSweeper enumerates them (Hydra's own override parser)."""
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    return {o.get_key_element(): list(o.sweep_string_iterator()) if o.is_sweep_override() else [str(o.value())]
            for o in parsed}


def combinations(params: dict[str, str]) -> list[list[str]]:
    """The product of the shape keys, plus one combination per remaining value of each other key."""
    ax = axes(params)
    shape = [[f"{k}={v}" for v in vals] for k, vals in ax.items() if k in SHAPE_KEYS]
    firsts = [f"{k}={vals[0]}" for k, vals in ax.items() if k not in SHAPE_KEYS]
    combos = [list(c) + firsts for c in itertools.product(*shape)]
    for k, vals in ax.items():
        if k not in SHAPE_KEYS:
            combos += [combos[0][:len(shape)] + [f for f in firsts if not f.startswith(f"{k}=")] + [f"{k}={v}"]
                       for v in vals[1:]]
    return combos


def test_the_promised_experiments_exist():
    assert REQUIRED <= set(EXPERIMENTS)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_sweep_combination_composes(experiment):
    params = sweep_params(experiment)
    for key in ("method", "dataset", "eps", "seed", "profile"):
        assert key in params, f"{experiment} does not sweep/fix {key}"
    combos = combinations(params)
    assert len(combos) >= 2
    seen = set()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        for combo in combos:
            cfg = compose("train", overrides=[f"+experiment={experiment}", *combo])
            OmegaConf.resolve(cfg)  # by_profile/by_dataset lookups fail here for a dataset a method cannot run
            validate(cfg)
            assert cfg.method.name in available("method")
            assert cfg.dataset.name in available("dataset")
            assert cfg.dataset.name != "digits", f"{experiment}: a swept dataset did not apply"
            seen.add((cfg.method.name, cfg.dataset.name, float(cfg.eps), cfg.profile))
    expected = {(c["method"], c["dataset"], float(c["eps"])) for c in
                (dict(x.split("=", 1) for x in combo) for combo in combos)}
    assert {(m, d, e) for m, d, e, _ in seen} == expected  # every swept value reached the composed config


def test_paper_tables_use_the_paper_profile_and_quick_all_and_eps_sweep_the_quick_one():
    for name in EXPERIMENTS:
        expected = "quick" if name.startswith(("quick_all", "eps_sweep")) else "paper"
        assert sweep_params(name)["profile"] == expected, name


def test_quick_all_covers_every_method_on_fmnist_with_two_single_thread_workers():
    params = sweep_params("quick_all")
    assert set(params["method"].split(",")) == {"dpgan", "gswgan", "dpac", "efsgd", "gpate", "dpaf", "feta", "dpdm"}
    assert params["dataset"] == "fmnist" and params["eps"].split(",") == ["1", "10"] and params["seed"] == "0"
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["+experiment=quick_all"], return_hydra_config=True)
    assert cfg.threads == 1
    assert cfg.hydra.launcher.n_jobs == 2 and "joblib" in cfg.hydra.launcher._target_.lower()


def test_eps_sweep_covers_every_method_at_five_eps_with_three_draws_and_the_full_evaluation():
    """docs/results.md's summary columns (eps 1, 2, 5, 10, inf), three seeds each, eval=full as the data's rows."""
    params = sweep_params("eps_sweep")
    assert set(params["method"].split(",")) == set(sweep_params("quick_all")["method"].split(","))
    assert params["dataset"] == "fmnist" and params["profile"] == "quick"
    assert axes(params)["eps"] == ["1", "2", "5", "10", "inf"] and axes(params)["seed"] == ["0", "1", "2"]
    twin = sweep_params("eps_sweep_feta_mode")
    assert {k: twin[k] for k in ("dataset", "eps", "seed", "profile")} == \
        {k: params[k] for k in ("dataset", "eps", "seed", "profile")}
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        for name in ("eps_sweep", "eps_sweep_feta_mode"):
            cfg = compose("train", overrides=[f"+experiment={name}"], return_hydra_config=True)
            full = compose("train", overrides=["eval=full"])
            assert cfg.eval == full.eval and cfg.threads == 1 and cfg.hydra.launcher.n_jobs == 2


def test_feta_mode_experiments_reach_feta_only():
    for name, mean_twin in (("quick_all_feta_mode", "quick_all"), ("feta_table2_mode", "feta_table2"),
                            ("eps_sweep_feta_mode", "eps_sweep")):
        params = sweep_params(name)
        assert params["method"] == "feta" and params["feta.central"] == "mode"
        assert "feta.central" not in sweep_params(mean_twin)  # dpdm must keep central: none
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("train", overrides=[f"+experiment={name}", *combinations(params)[0]])
        assert cfg.feta.central == "mode"
