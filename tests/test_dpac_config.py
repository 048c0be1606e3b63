"""gswgan / dpac / efsgd configs: profile=paper keeps the published values, profile=quick is shared.

efsgd builds on dpac and gswgan is dpac with beta=1, so the three quick profiles must agree on every
GS-WGAN key; a drift between them would make the sweep's method comparison unfair. One key is set per method
by measurement: G's learning-rate schedule (``g_lr_decay_start``), see
:func:`test_each_quick_profile_keeps_the_generator_schedule_its_draws_chose`.
"""
from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from dpgen.core.config import register_resolvers
from dpgen.core.methods import CONFIG_DIR
from dpgen.gswgan.train import generator_lr, generator_lr_at

SHARED = ("num_discriminators", "iters", "batch_size", "critic_iters", "pretrain_iters", "pretrain_chunk", "gp_weight",
          "drift", "lr", "g_lr", "betas", "ema", "z_dim", "g_width", "d_width", "clip")


def _hp(method: str, *overrides: str):
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"method={method}", "dataset=fmnist", *overrides])
    return OmegaConf.to_container(cfg[cfg.method.hparams], resolve=True)


@pytest.mark.parametrize("profile", ["quick", "paper"])
def test_shared_keys_agree_across_gswgan_dpac_efsgd(profile):
    hps = {m: _hp(m, f"profile={profile}") for m in ("gswgan", "dpac", "efsgd")}
    for key in SHARED:
        assert hps["gswgan"][key] == hps["dpac"][key] == hps["efsgd"][key], key


def test_paper_profile_keeps_the_published_values():
    hp = _hp("dpac", "profile=paper")
    assert (hp["num_discriminators"], hp["iters"], hp["critic_iters"], hp["pretrain_iters"]) == (1000, 20000, 5, 2000)
    assert hp["lr"] == hp["g_lr"] == 1e-4 and hp["ema"] == 0.999 and hp["batch_size"] == 32
    assert hp["g_lr_decay_start"] is None  # the papers keep G's learning rate constant


def test_each_quick_profile_keeps_the_generator_schedule_its_draws_chose():
    """Judged by the mean over draws at sound eps=10 (docs/results.md, "The GS-WGAN family"): the papers' constant
    G rate read higher than the decay from T/2 for gswgan and level for efsgd, so both keep it; dpac's decay was
    measured with its cross-entropy classifier and its constant rate only with the papers' class score."""
    assert _hp("gswgan")["g_lr_decay_start"] is None
    assert _hp("efsgd")["g_lr_decay_start"] is None
    assert _hp("dpac")["g_lr_decay_start"] == 0.5
    for method in ("gswgan", "dpac", "efsgd"):
        assert _hp(method, "profile=paper")["g_lr_decay_start"] is None


def test_quick_profile_uses_its_own_generator_lr():
    """Issue 12 §4: g_lr 1e-3 > lr 4e-4 let G beat D and collapse; the quick profile uses 2e-4 < 4e-4."""
    hp = _hp("gswgan")
    assert generator_lr(OmegaConf.create(hp)) == hp["g_lr"] == 2e-4 < hp["lr"]


def test_generator_lr_falls_back_to_lr():
    assert generator_lr(OmegaConf.create({"lr": 3e-4})) == 3e-4
    assert generator_lr(OmegaConf.create({"lr": 3e-4, "g_lr": None})) == 3e-4
    assert generator_lr(OmegaConf.create({"lr": 3e-4, "g_lr": 1e-3})) == 1e-3


def test_generator_lr_schedule_holds_then_falls_to_zero():
    """g_lr_decay_start=0.5 of T=100: g_lr for iterations 0..49, then a half cosine that is halfway at 75."""
    hp = OmegaConf.create({"lr": 4e-4, "g_lr": 2e-4, "g_lr_decay_start": 0.5})
    lrs = [generator_lr_at(hp, it, 100) for it in range(100)]
    assert lrs[:51] == [2e-4] * 51
    assert lrs[75] == pytest.approx(1e-4) and 0 < lrs[99] < 1e-6
    assert all(a > b for a, b in zip(lrs[50:], lrs[51:]))


def test_generator_lr_is_constant_without_a_schedule():
    for hp in ({"lr": 3e-4}, {"lr": 3e-4, "g_lr_decay_start": None}):
        assert {generator_lr_at(OmegaConf.create(hp), it, 10) for it in range(10)} == {3e-4}


@pytest.mark.parametrize("method", ["gswgan", "dpac", "efsgd"])
def test_training_loop_steps_g_at_the_scheduled_rate(method, tmp_path, monkeypatch):
    """Wiring: the rate G's Adam step uses at each iteration is generator_lr_at's (and every other optimiser's
    rate is untouched)."""
    import importlib

    from tiny import train_in_memory

    tr = importlib.import_module("dpgen.gswgan.train")
    seen: list[float] = []
    orig = tr.EnsembleSetup.__init__

    def init(self, *a, **kw):
        orig(self, *a, **kw)
        step = self.opt_g.step

        def spy_step(*sa, **skw):
            seen.append(self.opt_g.param_groups[0]["lr"])
            return step(*sa, **skw)

        self.opt_g.step = spy_step

    monkeypatch.setattr(tr.EnsembleSetup, "__init__", init)
    block = method  # each method of the family has its own block
    _, _, run = train_in_memory(method, tmp_path, f"{block}.iters=6", f"{block}.g_lr=1e-3",
                                f"{block}.g_lr_decay_start=0.5", eps="inf")
    hp = OmegaConf.create({"lr": 1.0, "g_lr": 1e-3, "g_lr_decay_start": 0.5})
    assert seen == pytest.approx([generator_lr_at(hp, it, 6) for it in range(6)])
    assert seen[-1] < seen[0]


@pytest.mark.parametrize("method", ["dpac", "efsgd"])
def test_kept_classifier_is_refused_by_the_schema_under_sound_accounting(method):
    """classifier.reinit=false is refused while the config is checked, before any run directory exists."""
    from dpgen.core.config import register_configs
    from dpgen.core.schema import check_config
    from dpgen.errors import DpgenError

    register_configs()
    block = method  # each method of the family has its own block
    base = [f"method={method}", "dataset=fmnist", f"{block}.classifier.enabled=true", f"{block}.classifier.reinit=false"]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        sound = compose("train", overrides=[*base, "eps=10"])
        uniform = [f"{block}.sampling=uniform", f"{block}.partitions_per_iter=1"]
        paper = compose("train", overrides=[*base, "eps=10", "privacy.accounting=paper", *uniform])
        off = compose("train", overrides=[*base, "eps=inf", *uniform])
        poisson = compose("train", overrides=[*base, "eps=inf"])
    with pytest.raises(DpgenError, match=rf"^{block}\.classifier\.reinit=false carries earlier partitions"):
        check_config(sound)
    check_config(paper)
    check_config(off)
    with pytest.raises(DpgenError, match=rf"^{block}\.classifier\.reinit=False is invalid; expected true with "
                                         rf"{block}\.sampling=poisson"):
        check_config(poisson)  # one kept classifier cannot serve several partitions of one iteration


def test_grad_basis_larger_than_the_image_is_refused_before_any_run_directory(tmp_path):
    """gswgan.grad_basis counts DCT atoms of the image: more atoms than pixels is one line, exit 2, nothing written."""
    from conftest import run_script

    res = run_script("train.py", "method=gswgan", "dataset=digits", "gswgan.grad_basis=785",
                     f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == \
        "error: gswgan.grad_basis=785 is invalid; expected at most the image size 784 (or null)"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("method", ["gswgan", "dpac", "efsgd"])
def test_the_uniform_draw_is_refused_where_a_valid_bound_is_claimed(method, tmp_path):
    """``sampling=uniform`` (the paper's one partition per iteration) has no valid sound bound (docs/privacy.md,
    "Sampling partitions"): one line, exit 2, before any run directory exists; paper accounting and eps=inf run."""
    from tiny import compose_cfg

    from dpgen.core.schema import check_config
    from dpgen.errors import DpgenError

    block = method  # each method of the family has its own block
    with pytest.raises(DpgenError, match=rf"^{block}\.sampling=uniform \(one partition per iteration, as the paper\) "
                                         "has no valid sound bound"):
        check_config(compose_cfg(method, f"{block}.sampling=uniform"))
    check_config(compose_cfg(method, f"{block}.sampling=uniform", "privacy.accounting=paper"))
    check_config(compose_cfg(method, f"{block}.sampling=uniform", eps="inf"))
    with pytest.raises(DpgenError, match=rf"^{block}\.partitions_per_iter=2 is invalid; expected 1 with "):
        check_config(compose_cfg(method, f"{block}.sampling=uniform", f"{block}.partitions_per_iter=2",
                                 "privacy.accounting=paper"))
    with pytest.raises(DpgenError, match=rf"^{block}\.partitions_per_iter=5 is invalid; expected an integer between 1 "):
        check_config(compose_cfg(method, f"{block}.partitions_per_iter=5"))  # tiny K = 4


@pytest.mark.parametrize("method", ["gswgan", "efsgd"])
def test_train_refuses_the_uniform_draw_under_sound_accounting(method, tmp_path):
    """The same refusal at training time (a config built in code, not through the schema); nothing written."""
    from tiny import train_in_memory

    from dpgen.errors import DpgenError

    block = method  # each method of the family has its own block
    with pytest.raises(DpgenError, match=rf"^{block}\.sampling=uniform .* has no valid sound bound"):
        train_in_memory(method, tmp_path, f"{block}.sampling=uniform")
    assert not (tmp_path / "checkpoints").exists()
