"""GS-WGAN as its own package (dpgen/gswgan): the registry entry, the legacy generator name, the extension points.

* ``method=gswgan`` runs :mod:`dpgen.gswgan` (multi-process capable), ``dpac`` and ``efsgd`` build on it;
* a ``generator.pt`` written before the move names ``dpgen.dpac.nets:ResNetGenerator``: it still loads, as the
  same weights in the class that now holds them, and nothing else is accepted in its place;
* GS-WGAN's keys are ``gswgan.*`` (no classifier or β: that is DPAC); a run saved when they lived under ``dpac.*``
  still loads and resumes, and an old key on the command line points to its new name;
* no package imports another's private name.
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import torch

from dpgen.core.generator import load_generator, save_generator
from dpgen.core.methods import LEGACY_GENERATORS, METHODS, RELEASED_GENERATORS, load_method
from dpgen.errors import DpgenError

ROOT = Path(__file__).resolve().parents[1]


def test_gswgan_is_its_own_registry_entry():
    assert METHODS["gswgan"].module == "dpgen.gswgan" and METHODS["gswgan"].multi_process
    assert METHODS["dpac"].module == "dpgen.dpac" and METHODS["efsgd"].module == "dpgen.efsgd"
    gtr = importlib.import_module("dpgen.gswgan.train")  # the package attribute `train` is the function
    assert load_method("gswgan").train is gtr.train
    assert load_method("dpgen.dpac").train is not gtr.train  # dpac's own extension


def test_a_generator_saved_under_the_old_class_name_still_loads(tmp_path):
    from dpgen.gswgan.nets import ResNetGenerator

    gen = ResNetGenerator(10, [1, 28, 28], z_dim=4, width=8)
    save_generator(gen, tmp_path / "generator.pt")
    payload = torch.load(tmp_path / "generator.pt", weights_only=True)
    assert payload["class"] == "dpgen.gswgan.nets:ResNetGenerator"
    payload["class"] = "dpgen.dpac.nets:ResNetGenerator"  # what runs before the move wrote
    torch.save(payload, tmp_path / "old.pt")
    old = load_generator(tmp_path / "old.pt")
    assert type(old) is ResNetGenerator
    for (n, a), b in zip(gen.state_dict().items(), old.state_dict().values()):
        assert torch.equal(a, b), n
    assert set(LEGACY_GENERATORS.values()) <= set(RELEASED_GENERATORS)
    payload["class"] = "dpgen.dpac.nets:GBlock"  # the old module's other names are not aliased
    torch.save(payload, tmp_path / "bad.pt")
    with pytest.raises(DpgenError, match="not a released dpgen generator"):
        load_generator(tmp_path / "bad.pt")


def test_gswgan_has_its_own_block_without_a_classifier(capsys, tmp_path, monkeypatch):
    from inprocess import call, one_error
    from tiny import compose_cfg

    cfg = compose_cfg("gswgan")
    assert cfg.method.hparams == "gswgan" and cfg.get("dpac") is None
    assert {"beta", "sanitize", "classifier"}.isdisjoint(cfg.gswgan) and "grad_basis" in cfg.gswgan
    monkeypatch.chdir(tmp_path)
    code, _, err = call(capsys, "train", "method=gswgan", "+gswgan.beta=0.8")
    assert one_error(code, err).startswith("error: unknown key gswgan.beta")


@pytest.mark.parametrize("args,says", [
    (["method=gswgan", "dpac.iters=10"], "dpac.iters is gswgan.iters for method=gswgan (its keys moved to their own "
                                         "block); use gswgan.iters=10"),
    (["-m", "method=dpac,gswgan", "dpac.partitions_per_iter=4"], "use gswgan.partitions_per_iter=4"),
    (["method=gswgan", "+dpac.classifier.enabled=true"], "dpac.classifier.enabled is not read by method=gswgan: its "
                                                        "hyperparameters are gswgan.*"),
    (["method=dpac", "gswgan.iters=3"], "gswgan.iters is not read by method=dpac: its hyperparameters are dpac.*"),
])
def test_an_old_key_on_the_command_line_points_to_the_new_one(args, says, capsys, tmp_path, monkeypatch):
    from inprocess import call, files_in, one_error

    monkeypatch.chdir(tmp_path)
    code, _, err = call(capsys, "train", *args)
    assert says in one_error(code, err)
    assert files_in(tmp_path) == {}


def _old_style(cfg: dict, beta: float = 1.0) -> dict:
    """A resolved gswgan config as a run saved before GS-WGAN had its own block wrote it: ``method.hparams: dpac``
    and the keys under ``dpac:`` with DPAC's (beta, sanitize, classifier), as the old configs/method/gswgan.yaml
    set them."""
    old = {k: v for k, v in cfg.items() if k != "gswgan"}
    old["method"] = {**cfg["method"], "hparams": "dpac"}
    old["dpac"] = {**cfg["gswgan"], "beta": beta, "sanitize": "joint",
                   "classifier": {"enabled": False, "start": 200, "n_fake": 5, "n_real": 5, "fake_batch": 64,
                                  "reinit": True, "order": "sequential", "loss": "ce", "lr": 2e-3,
                                  "real_batch": None}}
    return old


def test_a_run_saved_with_the_dpac_keys_still_loads(tmp_path):
    from omegaconf import OmegaConf

    from dpgen.core.config import register_configs
    from dpgen.core.schema import load_run_config
    from tiny import compose_cfg

    register_configs()
    cfg = OmegaConf.to_container(compose_cfg("gswgan", "gswgan.iters=7"), resolve=True)
    (tmp_path / ".hydra").mkdir()
    saved = tmp_path / ".hydra" / "config.yaml"
    saved.write_text(OmegaConf.to_yaml(OmegaConf.create(_old_style(cfg))))
    loaded = load_run_config(tmp_path)
    assert loaded.method.hparams == "gswgan" and loaded.dpac is None
    assert OmegaConf.to_container(loaded.gswgan) == cfg["gswgan"] and loaded.gswgan.iters == 7
    # older still: before partition sampling existed, such runs drew one uniform partition (LATER_KEYS)
    older = _old_style(cfg)
    for key in ("sampling", "partitions_per_iter"):
        del older["dpac"][key]
    saved.write_text(OmegaConf.to_yaml(OmegaConf.create({**older, "privacy": {**older["privacy"],
                                                                              "accounting": "paper"}})))
    loaded = load_run_config(tmp_path)
    assert loaded.gswgan.sampling == "uniform" and loaded.gswgan.partitions_per_iter == 1
    # a β other than 1 weighted G's loss: not a GS-WGAN run any more, said in one line
    saved.write_text(OmegaConf.to_yaml(OmegaConf.create(_old_style(cfg, beta=0.8))))
    with pytest.raises(DpgenError, match=r"^\S+config.yaml is not a valid dpgen run config: a method=gswgan run "
                                         r"saved with dpac.beta=0.8 is not GS-WGAN, which trains with beta=1"):
        load_run_config(tmp_path)


def test_an_interrupted_run_saved_with_the_dpac_keys_resumes(tmp_path):
    """Its saved config and its checkpoint's fingerprint both name the ``dpac`` block: the resume check reads them
    as ``gswgan``'s, accepts the same settings and still refuses other ones."""
    from omegaconf import OmegaConf

    from dpgen.core.config import register_configs
    from dpgen.core.pipeline import check_resume, fingerprint
    from dpgen.core.run import TrainingInterrupted
    from dpgen.io import atomic_save
    from tiny import compose_cfg, train_in_memory

    register_configs()
    run_dir = tmp_path / "run"
    with pytest.raises(TrainingInterrupted):
        train_in_memory("gswgan", run_dir, stop_after=2, checkpoint_every=1)
    cfg = compose_cfg("gswgan", f"resume={run_dir}")
    old = _old_style(OmegaConf.to_container(cfg, resolve=True))
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(old)))
    ckpt_path = run_dir / "checkpoints" / "last.pt"
    ckpt = torch.load(ckpt_path, weights_only=True)
    ckpt["fingerprint"] = {**fingerprint(cfg), "hparams": old["dpac"]}
    atomic_save(ckpt, ckpt_path)
    check_resume(cfg)
    with pytest.raises(DpgenError, match="resume config differs from the checkpoint .*iters"):
        check_resume(compose_cfg("gswgan", f"resume={run_dir}", "gswgan.iters=5"))


def test_no_package_imports_a_private_name_of_another():
    """The GS-WGAN family shares code through public names and the extension points only."""
    bad = []
    for pkg in ("gswgan", "dpac", "efsgd"):
        for path in sorted((ROOT / "dpgen" / pkg).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dpgen."):
                    other = node.module.split(".")[1]
                    bad += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                            if other != pkg and a.name.startswith("_")]
    assert not bad, bad
