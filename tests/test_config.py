"""Config composition and the config schema: profiles, per-dataset values, run-directory names, every bad
value refused in one line before anything exists, and dataset=celeba|ffhq (the method's paper setting)."""
from __future__ import annotations

import pickle
import shutil

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from inprocess import call, one_error

from dpgen.core.config import register_configs
from dpgen.core.methods import CONFIG_DIR, METHODS, available


def _compose(*overrides: str, hydra: bool = False):
    register_configs()
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
def test_every_method_config_resolves_and_fits_the_schema(method, profile):
    from dpgen.core.schema import check_config

    cfg = _compose(f"method={method}", f"profile={profile}", "dataset=fmnist")
    OmegaConf.resolve(cfg)
    check_config(cfg)  # every yaml key declared and typed, every value in range
    assert pickle.loads(pickle.dumps(cfg)) == cfg  # joblib sweep workers get the typed config by pickle
    assert cfg.method.name == method and cfg[cfg.method.hparams]
    assert (cfg.method.module, cfg.method.hparams) == (METHODS[method].module, METHODS[method].hparams)


def test_the_registry_lists_exactly_the_method_configs():
    assert set(METHODS) == set(available("method"))


# ---- every value checked before anything is created (scripts/train.py's checks, in-process) ------------

@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A scratch working directory with the embedded default data; yields a check that nothing was created."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPGEN_DATA", str(tmp_path / "data"))
    return tmp_path


def _refused(capsys, workdir, *args: str) -> str:
    """train.py's checks for ``args``: exit 2, one error line (returned), no traceback, no run directory."""
    code, _, err = call(capsys, "train", *args)
    line = one_error(code, err)
    assert not (workdir / "outputs").exists() and not (workdir / "multirun").exists()
    return line


# The six values of issue 17 that used to end in a traceback (five after creating the run directory).
@pytest.mark.parametrize("args, needle", [
    (["eps=abc"], "eps (target epsilon) must be a positive number or inf, got 'abc'"),
    (["seed=-1"], "seed=-1 is invalid; expected an integer >= 0"),
    (["data_root=/proc/x"], "data_root='/proc/x' is invalid; expected a directory that exists or can be created"),
    (["dpgan.clip=-1"], "dpgan.clip=-1.0 is invalid; expected a number > 0"),
    (["dpgan.lr_d=abc"], "dpgan.lr_d='abc' is invalid; expected a number"),
    (["eval.num_samples=-1"], "eval.num_samples=-1 is invalid; expected an integer >= 1"),
    # and more of the same kind
    (["delta=1.5"], "delta=1.5 is invalid; expected a number > 0 and < 1"),
    (["seed=1.5"], "seed='1.5' is invalid; expected an integer"),
    (["threads=0"], "threads=0 is invalid; expected an integer >= 1, or null"),
    (["device=gpu"], "device='gpu' is invalid"),
    (["progress=maybe"], "progress='maybe' is invalid; expected true or false"),
    (["privacy.accounting=fancy"], "privacy.accounting='fancy' is invalid; expected one of sound, paper"),
    (["privacy.noise_seed=-1"], "privacy.noise_seed=-1 is invalid; expected an integer >= 0"),
    (["privacy.noise_seed=abc"], "privacy.noise_seed='abc' is invalid; expected an integer"),
    (["privacy.secure_noise=maybe"], "privacy.secure_noise='maybe' is invalid; expected true or false"),
    (["eval.classifiers=[cnn,svm]"], "eval.classifiers"),
    (["debug.stop_after=0"], "debug.stop_after=0 is invalid"),
    (["resume=/no/such/run"], "resume='/no/such/run' is invalid; expected the directory of an interrupted run"),
    (["no_such_key=1"], "unknown key no_such_key"),
    (["dpgan.no_such_key=1"], "unknown key dpgan.no_such_key"),
    (["+dpgan.no_such_key=1"], "unknown key dpgan.no_such_key"),
    (["method.module=os"], "method.module='os' is invalid; expected dpgen.dpgan"),
    (["method.hparams=feta"], "method.hparams='feta' is invalid"),
    (["method=nope"], "unknown method 'nope'"),
    (["dataset=nope"], "unknown dataset 'nope'"),
    (["dataset=mnist"], "mnist"),
    (["delta=0.01"], "1/N"),
    (["-m", "eps=1,abc"], "eps (target epsilon) must be a positive number or inf, got 'abc'"),
    (["-m", "seed=0,-3"], "seed=-3 is invalid"),
    (["-m", "dpgan.clip=1,0"], "dpgan.clip=0.0 is invalid"),
])
def test_bad_value_is_one_line_naming_the_key_before_anything_exists(capsys, workdir, args, needle):
    assert needle in _refused(capsys, workdir, *args)


# A type error and a range error in every method's hyperparameter block (the key as the user types it).
BAD_HPARAMS = {
    "dpgan": ("dpgan.iters=many", "dpgan.n_critic=0"),
    "gswgan": ("gswgan.clip=abc", "gswgan.batch_size=0"),
    "dpac": ("dpac.classifier.enabled=maybe", "dpac.beta=1.5"),
    "efsgd": ("efsgd.sigma_noise=abc", "efsgd.encoder.code=leaky"),
    "gpate": ("gpate.bins=x", "gpate.bins=1"),
    "dpaf": ("dpaf.mu=abc", "dpaf.gc_keep=1.5"),
    "feta": ("feta.clip=[1]", "feta.aug_magnitude=31"),
    "dpdm": ("feta.multiplicity=abc", "feta.multiplicity=0"),
}


@pytest.mark.parametrize("method", sorted(BAD_HPARAMS))
@pytest.mark.parametrize("kind", ["type", "range"])
def test_every_method_block_refuses_a_bad_type_and_a_bad_range(capsys, workdir, method, kind):
    bad = BAD_HPARAMS[method][kind == "range"]
    key, value = bad.split("=", 1)
    line = _refused(capsys, workdir, f"method={method}", bad)
    assert f"{key}=" in line and ("is invalid; expected" in line) and value.strip("[]") in line


def test_method_rules_that_need_the_data_run_before_anything_exists(capsys, workdir):
    assert "dpgan.batch_size=5000 is invalid; expected an integer between 1 and N=1437" in \
        _refused(capsys, workdir, "dpgan.batch_size=5000")
    assert "gpate.sigma1" in _refused(capsys, workdir, "method=gpate", "gpate.sigma1=3")
    # C2 < C1: DiceSGD's noise rule (privacy.accounting=paper) needs C2 >= C1; the sound rule 2(C1+C2)z does not
    assert "efsgd.C2" in _refused(capsys, workdir, "method=efsgd", "efsgd.C2=0.25", "privacy.accounting=paper")
    assert "paper" in _refused(capsys, workdir, "method=efsgd", "efsgd.encoder.code=raw")


def test_a_yaml_key_missing_from_the_schema_says_where_to_declare_it(tmp_path):
    """A method engineer adds gpate.teacher_colour to the yaml but not to the schema: one line saying where."""
    from dpgen.core.schema import explain_config_error

    register_configs()
    conf = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, conf)
    (conf / "method" / "gpate.yaml").write_text((conf / "method" / "gpate.yaml").read_text() + "  teacher_colour: true\n")
    with pytest.raises(Exception) as info, initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        compose("train", overrides=["method=gpate"])
    msg = str(explain_config_error(info.value, {}))
    assert msg.startswith("unknown key gpate.teacher_colour") and "dpgen/core/hparams/gpate.py" in msg, msg


def test_privacy_off_reference_stays_valid(capsys, workdir):
    for eps in ("inf", ".inf"):
        code, _, err = call(capsys, "train", f"eps={eps}")
        assert code == 0, err


# ---- dataset=celeba | ffhq: the method's paper setting ------------------------------------------------

PAPER_CELEBA = {"dpaf": "celeba64", "dpac": "celeba32", "gswgan": "celeba32", "efsgd": "celeba32",
                "gpate": "celeba32", "feta": "celeba32", "dpdm": "celeba32", "dpgan": "celeba32"}


@pytest.mark.parametrize("method", sorted(PAPER_CELEBA))
def test_dataset_celeba_is_the_methods_paper_setting(method):
    cfg = _compose(f"method={method}", "dataset=celeba", hydra=True)
    assert cfg.dataset.name == PAPER_CELEBA[method] and cfg.dataset.alias == "celeba"
    assert cfg.dataset.delta == _compose(f"dataset={PAPER_CELEBA[method]}").dataset.delta
    assert f"/{PAPER_CELEBA[method]}/" in cfg.hydra.run.dir and cfg.hydra.runtime.choices.dataset == "celeba"
    assert cfg.dataset.note  # why (logged): the paper's table


def test_dataset_ffhq_exists_only_where_a_paper_has_it(capsys, workdir):
    assert _compose("method=dpaf", "dataset=ffhq").dataset.name == "ffhq128"
    line = _refused(capsys, workdir, "method=dpac", "dataset=ffhq")
    assert "dataset=ffhq has no paper setting for method=dpac" in line and "dpaf: ffhq128" in line
    line = _refused(capsys, workdir, "-m", "method=dpaf,gpate", "dataset=ffhq")
    assert "method=gpate" in line


def test_a_method_that_cannot_make_the_images_is_refused_before_anything_exists(capsys, workdir):
    from fixtures_data import make_celeba

    make_celeba(workdir / "data")
    line = _refused(capsys, workdir, "method=dpac", "dataset=celeba64")
    assert "dataset=celeba64 is invalid for method=dpac" in line and "32x32" in line


def test_dataset_celeba_is_logged_and_recorded(tmp_path, monkeypatch, caplog):
    """On (fake) CelebA files: the run's config names celeba32 (and the alias), the log says why, and
    metrics.json records both."""
    import json
    import logging

    from fixtures_data import make_celeba
    from tiny import compose_cfg
    from dpgen.core.pipeline import run_training

    make_celeba(tmp_path / "data")
    cfg = compose_cfg("dpgan", "dpgan.batch_size=2", "dpgan.iters=2", f"data_root={tmp_path / 'data'}",
                      "tensorboard=false", "progress=false", "eval.num_samples=20", "eval.epochs=1",
                      "eval.classifiers=[mlp]", "eval.r2g=false", "eval.real_baseline=false", "eval.cnn_fid=false",
                      "eval.fid=false", "eval.inception_score=false", "samples_per_class=1", "threads=1", dataset="celeba")
    assert cfg.dataset.name == "celeba32" and cfg.dataset.alias == "celeba"
    with caplog.at_level(logging.INFO, logger="dpgen"):
        run_training(cfg, tmp_path / "run")
    assert "dataset=celeba resolves to celeba32 for method=dpgan" in caplog.text
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["dataset"] == "celeba32" and metrics["dataset_alias"] == "celeba"
    assert json.loads((tmp_path / "run" / "privacy.json").read_text())["delta"] == 1e-6


def test_a_run_saved_before_the_latest_keys_still_loads(tmp_path):
    """A run directory written before privacy.noise_seed/secure_noise, eval.fixed_* and precision/cudnn_benchmark
    existed: its config loads (scripts/evaluate.py can re-evaluate it) with the values that describe it; a key
    in the file is kept."""
    from omegaconf import OmegaConf

    from dpgen.core.config import register_configs
    from dpgen.core.schema import load_run_config
    from tiny import compose_cfg

    register_configs()
    cfg = OmegaConf.to_container(compose_cfg("dpgan", "eval.epochs=3"), resolve=True)
    for block, key in (("privacy", "noise_seed"), ("privacy", "secure_noise"), ("eval", "fixed_reading"),
                       ("eval", "fixed_epochs")):
        del cfg[block][key]
    del cfg["precision"], cfg["cudnn_benchmark"]
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    loaded = load_run_config(tmp_path)
    assert loaded.privacy.noise_seed is None and loaded.privacy.secure_noise is False
    assert loaded.eval.fixed_reading is True and loaded.eval.fixed_epochs is None and loaded.eval.epochs == 3
    assert loaded.precision == "fp32" and loaded.cudnn_benchmark is False
