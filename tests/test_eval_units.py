"""Unit tests for dpgen.eval: classifier shapes (DPDM / DP-Sinkhorn CNN), training loop, config, cache."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dpgen.data.base import ImageDataset, Split
from dpgen.errors import DpgenError
from dpgen.eval import EvalConfig, evaluate, resolve_config
from dpgen.eval import cache as ec
from dpgen.eval import train_classifier as tc
from dpgen.eval.classifiers import (
    DownstreamCNN,
    DownstreamMLP,
    build_classifier,
    cnn_unavailable_reason,
    to_model_input,
)
from dpgen.eval.g2r import real_classifier


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("shape,flat", [((1, 28, 28), 1152), ((3, 32, 32), 2048), ((3, 64, 64), 128 * 12 * 12)])
def test_cnn_flatten_size_and_features(shape, flat) -> None:
    m = DownstreamCNN(shape, 10).eval()
    assert m.flat_dim == flat  # 1152 on MNIST as in DPDM's train_downstream_classifiers.py
    x = torch.zeros(2, *shape)
    assert m(x).shape == (2, 10) and m.features(x).shape == (2, 128)


def test_cnn_layer_sequence_matches_dpdm() -> None:
    m = DownstreamCNN((1, 28, 28), 10)
    kinds = [type(l).__name__ for l in m.trunk] + [type(l).__name__ for l in m.embed] + [type(l).__name__ for l in m.head]
    assert kinds == ["Conv2d", "MaxPool2d", "ReLU", "Dropout", "Conv2d", "MaxPool2d", "ReLU", "Dropout",
                     "Conv2d", "ReLU", "Flatten", "Linear", "ReLU", "Dropout", "Linear"]
    convs = [l for l in m.trunk if isinstance(l, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [32, 64, 128] and all(c.padding == (0, 0) for c in convs)


def test_too_small_images_and_tabular_reasons() -> None:
    with pytest.raises(DpgenError):
        DownstreamCNN((1, 16, 16), 10)
    assert cnn_unavailable_reason((1, 17, 17), False) is not None
    assert cnn_unavailable_reason((1, 18, 18), False) is None
    assert "tabular" in cnn_unavailable_reason((5,), True)


def test_to_model_input_range() -> None:
    x = to_model_input(torch.tensor([0, 255], dtype=torch.uint8))
    assert x.tolist() == [-1.0, 1.0]
    f = torch.tensor([0.3, -2.0])
    assert torch.equal(to_model_input(f), f)


def test_build_is_seeded_and_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    a = build_classifier("cnn", (1, 28, 28), 10, seed=7)
    assert torch.equal(torch.rand(1), expected)
    b = build_classifier("cnn", (1, 28, 28), 10, seed=7)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    with pytest.raises(DpgenError):
        build_classifier("resnet", (1, 28, 28), 10, seed=0)


def test_mlp_standardisation_roundtrip() -> None:
    x = np.random.default_rng(0).normal(5.0, 3.0, size=(100, 4)).astype(np.float32)
    m = DownstreamMLP((4,), 2, hidden=(8,))
    m.set_standardization(x)
    m2 = DownstreamMLP((4,), 2, hidden=(8,))
    m2.load_state_dict(m.state_dict())
    assert torch.allclose(m2.shift, torch.tensor(x.mean(0)), atol=1e-5)


def test_split_train_val_stratified_disjoint() -> None:
    y = np.repeat(np.arange(4), [50, 30, 20, 1])
    tr, va = tc.split_train_val(y, 0.1, seed=0)
    assert len(np.intersect1d(tr, va)) == 0 and len(tr) + len(va) == len(y)
    assert [int(np.sum(y[va] == c)) for c in range(4)] == [5, 3, 2, 0]
    tr2, va2 = tc.split_train_val(y, 0.1, seed=0)
    assert np.array_equal(va, va2)
    tr, va = tc.split_train_val(y, 0.0, seed=0)
    assert len(va) == 0 and len(tr) == len(y)


def _separable(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=n)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    x[:, 0] += 4 * y
    return x, y.astype(np.int64)


def test_fit_selects_on_validation_and_early_stops() -> None:
    x, y = _separable(200, 0)
    cfg = EvalConfig(epochs=30, batch_size=32, lr=1e-2, patience=2, mlp_hidden=(8,))
    m = build_classifier("mlp", (3,), 2, seed=0, mlp_hidden=(8,))
    m, info = tc.fit(m, x[:150], y[:150], x[150:], y[150:], cfg, "cpu", 0)
    assert info["epochs_run"] < 30 and info["epochs_run"] - info["selected_epoch"] == 2
    assert tc.accuracy(m, x[150:], y[150:]) == pytest.approx(info["val_accuracy"])
    assert info["val_accuracy"] > 0.9 and not m.training
    # no validation split: the last epoch is kept
    m = build_classifier("mlp", (3,), 2, seed=0, mlp_hidden=(8,))
    _, info = tc.fit(m, x, y, x[:0], y[:0], EvalConfig(epochs=3, mlp_hidden=(8,)), "cpu", 0)
    assert info["selected_epoch"] == 3 and info["val_accuracy"] is None


def test_config_validation() -> None:
    assert resolve_config(None) == EvalConfig()
    assert resolve_config({"classifiers": ["mlp"], "patience": None}).patience is None
    for bad in ({"epoch": 3}, {"classifiers": ["resnet"]}, {"classifiers": "cnn"}, {"val_fraction": 1.0},
                {"epochs": 0}, {"lr": -1}, {"fid": "yes"}, {"r2g_classifier": "svm"}, {"mlp_hidden": [0]}):
        with pytest.raises(DpgenError):
            resolve_config(bad)


def test_shipped_configs_load() -> None:
    import pathlib

    import yaml

    root = pathlib.Path(__file__).resolve().parents[1] / "configs" / "eval"
    default = resolve_config(yaml.safe_load((root / "default.yaml").read_text()))
    paper = resolve_config(yaml.safe_load((root / "paper.yaml").read_text()))
    assert default.epochs == 10 and default.num_samples == 10000
    assert paper.num_samples == 60000 and paper.epochs == 50 and paper.patience is None and paper.mlp_hidden == (100,)


def test_evaluate_rejects_bad_inputs() -> None:
    x = np.zeros((4, 1, 28, 28), np.uint8)
    data = ImageDataset("t", Split(x, np.zeros(4, np.int64)), Split(x, np.zeros(4, np.int64)), ["a", "b"])
    with pytest.raises(DpgenError):
        evaluate(x.astype(np.float32), np.zeros(4, np.int64), data, {})
    with pytest.raises(DpgenError):
        evaluate(x, np.full(4, 2), data, {})
    with pytest.raises(DpgenError):
        evaluate(np.zeros((4, 1, 32, 32), np.uint8), np.zeros(4, np.int64), data, {})
    with pytest.raises(DpgenError):
        evaluate(x, np.zeros(3, np.int64), data, {})


def test_atomic_write_and_fingerprint(tmp_path) -> None:
    p = tmp_path / "sub" / "f.bin"
    ec.atomic_write_bytes(p, b"abc")
    ec.atomic_write_bytes(p, b"defg")
    assert p.read_bytes() == b"defg" and [q.name for q in p.parent.iterdir()] == ["f.bin"]
    a = np.arange(6, dtype=np.uint8)
    assert ec.array_fingerprint(a) == ec.array_fingerprint(a.copy())
    assert ec.array_fingerprint(a) != ec.array_fingerprint(a.reshape(2, 3))
    assert ec.array_fingerprint(a) != ec.array_fingerprint(a[::-1])
    assert ec.cache_key({"a": 1, "b": [1, 2]}) == ec.cache_key({"b": [1, 2], "a": 1})


def test_real_classifier_cache_reuse_and_invalidation(tmp_path) -> None:
    xtr, ytr = _separable(120, 1)
    xte, yte = _separable(60, 2)
    data = ImageDataset("sep", Split(xtr, ytr), Split(xte, yte), ["a", "b"], tabular=True)
    cfg = EvalConfig(epochs=3, batch_size=32, mlp_hidden=(8,))
    m1, i1 = real_classifier("mlp", data, cfg, "cpu", 0, tmp_path)
    m2, i2 = real_classifier("mlp", data, cfg, "cpu", 0, tmp_path)
    assert not i1["cached"] and i2["cached"] and i2["selected_epoch"] == i1["selected_epoch"]
    assert all(torch.equal(p, q) for p, q in zip(m1.state_dict().values(), m2.state_dict().values()))
    assert len(list(tmp_path.glob("*.pt"))) == 1
    # a different seed, setting or data is a different entry
    assert not real_classifier("mlp", data, cfg, "cpu", 1, tmp_path)[1]["cached"]
    assert not real_classifier("mlp", data, EvalConfig(epochs=4, batch_size=32, mlp_hidden=(8,)), "cpu", 0, tmp_path)[1]["cached"]
    changed = ImageDataset("sep", Split(xtr + 1, ytr), Split(xte, yte), ["a", "b"], tabular=True)
    assert not real_classifier("mlp", changed, cfg, "cpu", 0, tmp_path)[1]["cached"]
    # a corrupt entry is retrained, not fatal
    for f in tmp_path.glob("*.pt"):
        f.write_bytes(b"corrupt")
    assert not real_classifier("mlp", data, cfg, "cpu", 0, tmp_path)[1]["cached"]


def test_disabled_metrics_have_reasons() -> None:
    x = np.random.default_rng(0).integers(0, 256, size=(40, 1, 28, 28), dtype=np.uint8)
    y = np.arange(40) % 2
    data = ImageDataset("t", Split(x, y), Split(x[:10], y[:10]), ["a", "b"])
    cfg = dict(classifiers=["mlp"], epochs=1, r2g=False, real_baseline=False, cnn_fid=False, fid=False, inception_score=False)
    res = evaluate(x, y, data, cfg)
    assert res["g2r"]["mlp"]["accuracy"] is not None
    for metric in ("r2g", "real_accuracy", "cnn_fid", "fid", "is"):
        assert res[metric] is None and "disabled" in res[f"{metric}_reason"]
    assert "real_classifiers" not in res
