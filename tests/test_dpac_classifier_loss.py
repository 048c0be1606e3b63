"""DPAC's / EFSGD's classifier score (``classifier.loss``: the papers' WGAN-style class score, or cross-entropy),
C's own learning rate (``classifier.lr``) and real batch (``classifier.real_batch``): the losses, the wiring into
C's training and G's C path, the profiles."""
from __future__ import annotations

import importlib
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from dpgen.dpac.classifier import classifier_loss, classifier_lr, classifier_real_batch
from dpgen.ensemble import NetStack
from dpgen.gswgan.nets import CLF_SCORES, clf_forward, clf_init, clf_logits, clf_logprob
from dpgen.nets.spectral import sn_init


def _one_classifier(seed: int = 0, shape=(1, 28, 28), width: int = 4):
    g = torch.Generator().manual_seed(seed)
    clf = NetStack(partial(clf_init, 10, list(shape), width), sn_init, 1, g, torch.device("cpu"))
    return clf, {n: t[0] for n, t in clf.params.items()}, {n: t[0] for n, t in clf.buffers.items()}


def test_ce_score_is_the_class_log_probability():
    _, p, u = _one_classifier()
    x, y = torch.rand(7, 1, 28, 28), torch.tensor([0, 1, 2, 3, 9, 9, 5])
    logp = torch.log_softmax(clf_logits(p, u, x), dim=1)
    assert torch.allclose(clf_logprob(p, u, x, y), logp[torch.arange(7), y])
    assert CLF_SCORES == {"wgan": clf_forward, "ce": clf_logprob}


def test_ce_loss_is_cross_entropy_without_the_penalty():
    _, p, u = _one_classifier()
    x, y = torch.rand(6, 1, 28, 28), torch.arange(6)
    ce = F.cross_entropy(clf_logits(p, u, x), y)
    assert torch.allclose(classifier_loss(p, u, x, y, 10.0, 1e-3, loss="ce"), ce)
    assert torch.allclose(classifier_loss(p, u, x, y, 0.0, 0.0, loss="ce"), ce)  # no penalty, no drift
    wgan = classifier_loss(p, u, x, y, 10.0, 1e-3)  # the papers' score stays the default
    assert torch.allclose(wgan, classifier_loss(p, u, x, y, 10.0, 1e-3, loss="wgan"))
    assert not torch.allclose(wgan, ce)


def test_a_fresh_ce_classifier_learns_the_embedded_digits_in_a_few_steps(tmp_path, capsys):
    """Why the option exists (``python -m dpgen.dpac.classifier_probe``): a re-initialised C gets a handful of
    steps per iteration. With cross-entropy, 30 Adam steps of 64 digits take it well past chance on held-out
    digits."""
    from dpgen.data import load_dataset
    from dpgen.data.torch_utils import to_float
    from dpgen.dpac.classifier_probe import main, probe

    data = load_dataset("digits", str(tmp_path), cache=False)
    x, y = to_float(torch.as_tensor(data.train.x)), torch.as_tensor(data.train.y).long()
    xt, yt = to_float(torch.as_tensor(data.test.x)), torch.as_tensor(data.test.y).long()
    assert probe(x, y, xt, yt, "ce", 2e-3, 30, seed=0) > 0.5
    assert main(["--dataset", "digits", "--data-root", str(tmp_path), "--steps", "1", "--lrs", "1e-3",
                 "--starts", "1", "--batches", "8", "16"]) == 0
    rows = [line.split(":")[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert rows == [f"{loss} 0.001 {b} 1" for loss in ("wgan", "ce") for b in (8, 16)]


def test_classifier_lr_falls_back_to_lr():
    assert classifier_lr(OmegaConf.create({"classifier": {"lr": None}}), 4e-4) == 4e-4
    assert classifier_lr(OmegaConf.create({"classifier": {"lr": 2e-3}}), 4e-4) == 2e-3


def test_classifier_real_batch_falls_back_to_batch_size():
    assert classifier_real_batch(OmegaConf.create({"batch_size": 16, "classifier": {"real_batch": None}})) == 16
    assert classifier_real_batch(OmegaConf.create({"batch_size": 16, "classifier": {"real_batch": 48}})) == 48


@pytest.mark.parametrize("method,module", [("dpac", "dpgen.dpac.method"), ("efsgd", "dpgen.efsgd.train")])
@pytest.mark.parametrize("loss,lr,real_batch", [("ce", 3e-3, 5), ("wgan", None, None)])
def test_training_loop_trains_and_follows_the_configured_classifier(method, module, loss, lr, real_batch, tmp_path,
                                                                    monkeypatch):
    """Wiring: every classifier phase trains C on ``classifier.loss`` at ``classifier.lr`` (D's lr when null) on
    real batches of ``classifier.real_batch`` images (B when null), and every G step from t_c on ascends that same
    score on its C path."""
    from tiny import train_in_memory

    dpac_method = importlib.import_module("dpgen.dpac.method")
    mod = importlib.import_module(module)
    trained: list[tuple[str, float]] = []
    real_sizes: list[int] = []
    scores: list[object] = []
    orig_train, orig_step = dpac_method.train_classifier, mod.generator_step

    def spy_train(*a, **kw):
        trained.append((kw["loss"], a[7]))
        real = a[2]

        def spy_real():
            x, y = real()
            real_sizes.append(x.shape[-4])  # [b, C, H, W], or [M, b, C, H, W] when stacked
            return x, y

        return orig_train(a[0], a[1], spy_real, *a[3:], **kw)

    def spy_step(*a, **kw):
        scores.append(kw.get("c_score"))
        return orig_step(*a, **kw)

    monkeypatch.setattr(dpac_method, "train_classifier", spy_train)
    monkeypatch.setattr(mod, "generator_step", spy_step)
    over = [f"{method}.lr=5e-4", f"{method}.classifier.loss={loss}", f"{method}.classifier.lr={lr or 'null'}",
            f"{method}.batch_size=6", f"{method}.classifier.real_batch={real_batch or 'null'}",
            f"{method}.partitions_per_iter=4"]  # every partition joins: C trains on real data at both iterations
    _, _, run = train_in_memory(method, tmp_path, *over, eps="inf")
    assert trained and set(trained) == {(loss, lr or 5e-4)}
    assert real_sizes and set(real_sizes) == {real_batch or 6}
    assert len(scores) == 4 and scores[2:] == [CLF_SCORES[loss]] * 2  # t_c = 2 of T = 4 (tests/tiny.py)


def _hp(method: str, *overrides: str):
    from hydra import compose, initialize_config_dir

    from dpgen.core.config import register_resolvers
    from dpgen.core.methods import CONFIG_DIR

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"method={method}", "dataset=fmnist", *overrides])
    return OmegaConf.to_container(cfg[cfg.method.hparams], resolve=True)["classifier"]


def test_profiles_choose_the_classifier_score():
    """The paper profile keeps the papers' score at D's rate; dpac's quick profile trains C on cross-entropy at its
    own rate; efsgd's quick profile keeps the papers' score."""
    assert {k: _hp("dpac", "profile=paper")[k] for k in ("loss", "lr")} == {"loss": "wgan", "lr": None}
    assert {k: _hp("efsgd", "profile=paper")[k] for k in ("loss", "lr")} == {"loss": "wgan", "lr": None}
    assert {k: _hp("dpac")[k] for k in ("loss", "lr")} == {"loss": "ce", "lr": 2e-3}
    assert {k: _hp("efsgd")[k] for k in ("loss", "lr")} == {"loss": "wgan", "lr": None}
    for method in ("dpac", "efsgd"):  # C's real batch is B in every profile (classifier.real_batch: research option)
        assert _hp(method, "profile=paper")["real_batch"] is None and _hp(method)["real_batch"] is None


def test_an_unknown_classifier_loss_is_refused_before_any_run_directory(tmp_path):
    from conftest import run_script

    res = run_script("train.py", "method=dpac", "dataset=digits", "dpac.classifier.loss=hinge",
                     f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == \
        "error: dpac.classifier.loss='hinge' is invalid; expected one of wgan, ce"
    assert not (tmp_path / "run").exists()


def test_runs_saved_before_the_option_read_as_the_papers_score():
    from dpgen.core.schema import LATER_KEYS

    for block in ("dpac", "efsgd"):
        assert LATER_KEYS[f"{block}.classifier.loss"] == "wgan" and LATER_KEYS[f"{block}.classifier.lr"] is None
        assert LATER_KEYS[f"{block}.classifier.real_batch"] is None
