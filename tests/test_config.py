"""Config composition: profiles, per-dataset values, run-directory names."""
from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from dpgen.core.config import register_resolvers
from dpgen.core.methods import CONFIG_DIR, available


def _compose(*overrides: str, hydra: bool = False):
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=hydra)


@pytest.mark.parametrize("eps", ["10", "10.0"])
def test_run_dir_names_eps_the_same_way(eps):
    cfg = _compose(f"eps={eps}", "seed=3", hydra=True)
    assert "/dpgan/digits/eps10/seed3/" in cfg.hydra.run.dir
    assert cfg.hydra.sweep.subdir == "dpgan/digits/eps10/seed3"


@pytest.mark.parametrize("eps", ["inf", ".inf", "Infinity"])
def test_privacy_off_runs_are_named_epsinf(eps):
    cfg = _compose(f"eps={eps}", hydra=True)
    assert cfg.hydra.sweep.subdir == "dpgan/digits/epsinf/seed0"


@pytest.mark.parametrize("eps", ["abc", "0", "-1", "nan"])
def test_bad_eps_is_one_line_before_anything_is_written(eps):
    from dpgen.cli import precheck
    from dpgen.errors import DpgenError

    with pytest.raises(DpgenError, match=r"^eps \(target epsilon\) must be a positive number or inf, got"):
        precheck([f"eps={eps}"])


def test_profile_and_dataset_pick_hyperparameters():
    quick, paper = _compose("dataset=fmnist"), _compose("dataset=fmnist", "profile=paper")
    assert (quick.dpgan.iters, paper.dpgan.iters) == (1500, 20000)
    assert _compose().dpgan.batch_size == 64 and quick.dpgan.batch_size == 256
    assert paper.eval.num_samples == 60000 and quick.eval.num_samples == 10000
    assert _compose("dataset=fmnist", "dpgan.iters=7").dpgan.iters == 7, "the command line wins"


@pytest.mark.parametrize("method", available("method"))
@pytest.mark.parametrize("profile", ["quick", "paper"])
def test_every_method_config_resolves(method, profile):
    cfg = _compose(f"method={method}", f"profile={profile}", "dataset=fmnist")
    OmegaConf.resolve(cfg)
    assert cfg.method.name == method and cfg[cfg.method.hparams]
