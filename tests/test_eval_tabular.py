"""Tabular datasets: g2r / r2g with the MLP only; image metrics are null with reason "tabular dataset"."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dpgen.data.base import ImageDataset, Split
from dpgen.eval import evaluate


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _blobs(n: int, seed: int, shift: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Three Gaussian classes in 6-D with very different feature scales (tests standardisation)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=n)
    centres = np.array([[0, 0, 0, 0, 0, 0], [3, 0, 3, 0, 0, 0], [0, 3, 0, 3, 0, 0]], dtype=np.float64)
    x = centres[y] + rng.normal(size=(n, 6)) + shift
    x *= np.array([1.0, 1.0, 100.0, 100.0, 0.01, 1.0])
    return x.astype(np.float32), y.astype(np.int64)


@pytest.fixture(scope="module")
def table() -> ImageDataset:
    xtr, ytr = _blobs(600, 0)
    xte, yte = _blobs(300, 1)
    return ImageDataset("blobs", Split(xtr, ytr), Split(xte, yte), ["a", "b", "c"], tabular=True)


CFG = dict(classifiers=["cnn", "mlp"], epochs=15, batch_size=64, lr=1e-3, patience=5)


def test_tabular_same_distribution(table, tmp_path) -> None:
    x, y = _blobs(800, 2)
    res = evaluate(x, y, table, CFG, cache_dir=tmp_path)
    json.dumps(res)
    assert res["g2r"]["cnn"] == {"accuracy": None, "reason": "tabular dataset: the CNN needs images"}
    assert res["g2r"]["mlp"]["accuracy"] > 0.85
    assert set(res["real_accuracy"]) == {"mlp"} and res["real_accuracy"]["mlp"] > 0.85
    assert abs(res["g2r"]["mlp"]["accuracy"] - res["real_accuracy"]["mlp"]) < 0.06
    assert res["r2g"]["classifier"] == "mlp" and res["r2g"]["accuracy"] > 0.85
    for metric in ("fid", "is", "cnn_fid"):
        assert res[metric] is None and "tabular dataset" in res[f"{metric}_reason"]


def test_tabular_shuffled_labels_is_chance(table) -> None:
    x, y = _blobs(600, 3)
    y = np.random.default_rng(4).permutation(y)
    res = evaluate(x, y, table, dict(CFG, classifiers=["mlp"], real_baseline=False))
    assert res["g2r"]["mlp"]["accuracy"] < 0.55
    assert res["r2g"]["accuracy"] < 0.55
    assert res["real_accuracy"] is None and "disabled" in res["real_accuracy_reason"]


def test_the_cnn_only_default_reads_the_mlp_on_tabular_data(table) -> None:
    """configs/eval/default.yaml evaluates with the CNN alone; on tabular data that is the MLP (as r2g falls back)."""
    x, y = _blobs(600, 2)
    res = evaluate(x, y, table, dict(CFG, classifiers=["cnn"], patience=None, one_training=True, r2g=False))
    assert set(res["g2r"]) == {"mlp"} and res["g2r"]["mlp"]["accuracy"] > 0.85
    assert res["g2r"]["mlp"]["fixed"]["one_training"] and set(res["real_accuracy"]) == {"mlp"}
