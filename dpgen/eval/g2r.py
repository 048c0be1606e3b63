"""Generated-to-real (g2r) and real-to-generated (r2g) classification accuracy.

* g2r ("train on synthetic, test on real", the downstream accuracy of DPDM, DP-Sinkhorn, DP-FETA and
  DPImageBench), read two ways:

  - the paper protocol (:func:`g2r_accuracy`): the synthetic set is split into train / validation by
    ``val_fraction`` (DP-Sinkhorn's ``finalize_result.py`` uses 90/10; DPImageBench 55k/5k), the classifier
    is trained on the first part with model selection on the second (DPDM
    ``train_downstream_classifiers.py``), and the selected model is evaluated ONCE on the real test split.
    The real test split never influences training or selection (unlike G-PATE's "max eval acc" over
    epochs on the test set);
  - the fixed-schedule reading (:func:`g2r_fixed_accuracy`): the same classifier trained on ALL synthetic
    samples for a fixed number of epochs, the last epoch tested once: no selection at all, what an
    independent user who trains one classifier on the released samples would see. A selected accuracy far
    above it (``selection_gap``) means the figure depends on the selection, not only on the samples.
* real classifier: the same architecture trained on the real TRAIN split, with selection on its own
  held-out part of the real train split.  It provides the real-data reference accuracy
  (``real_accuracy``), the r2g accuracy (its accuracy on the labelled synthetic samples: do samples
  look like their label to a classifier of real data?) and the features for ``cnn_fid``.
  It depends only on real data, so it is cached in ``cache_dir``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dpgen.data.base import ImageDataset
from dpgen.eval import cache as _cache
from dpgen.eval import train_classifier as tc
from dpgen.eval.classifiers import DownstreamMLP, build_classifier
from dpgen.eval.config import EvalConfig


def _new_model(kind: str, data: ImageDataset, cfg: EvalConfig, seed: int, x_train: np.ndarray) -> nn.Module:
    model = build_classifier(kind, data.shape, data.num_classes, seed, mlp_hidden=cfg.mlp_hidden)
    if data.tabular and isinstance(model, DownstreamMLP):
        model.set_standardization(x_train)
    return model


def train_with_selection(
    kind: str, x: np.ndarray, y: np.ndarray, data: ImageDataset, cfg: EvalConfig, device: str | torch.device, seed: int,
    last: nn.Module | None = None,
) -> tuple[nn.Module, dict]:
    """Split (x, y) into train / validation by ``cfg.val_fraction`` and :func:`~dpgen.eval.train_classifier.fit`
    (``last``: receives the last epoch's weights)."""
    tr, va = tc.split_train_val(y, cfg.val_fraction, seed)
    model = _new_model(kind, data, cfg, seed, x[tr])
    return tc.fit(model, x[tr], y[tr], x[va], y[va], cfg, device, seed, last=last)


def g2r_accuracy(
    kind: str, x_syn: np.ndarray, y_syn: np.ndarray, data: ImageDataset, cfg: EvalConfig,
    device: str | torch.device = "cpu", seed: int = 0,
) -> dict:
    """Train ``kind`` on synthetic data (selection on a synthetic hold-out); accuracy on the real test split.

    Returns ``{"accuracy", "selected_epoch", "val_accuracy", "epochs_run", "num_train", "num_val", ...}``.
    """
    model, info = train_with_selection(kind, x_syn, y_syn, data, cfg, device, seed)
    acc = tc.accuracy(model, data.test.x, data.test.y, device, cfg.eval_batch_size)
    return {"accuracy": acc, **info}


def g2r_one_training(
    kind: str, x_syn: np.ndarray, y_syn: np.ndarray, data: ImageDataset, cfg: EvalConfig,
    device: str | torch.device = "cpu", seed: int = 0,
) -> dict:
    """Both readings from ONE training (``eval.one_training``): the classifier trains all ``cfg.epochs`` on the
    synthetic train split (no early stopping); the paper reading is its best epoch on the synthetic hold-out, the
    fixed reading its last epoch (no selection). Half the cost of :func:`g2r_accuracy` plus
    :func:`g2r_fixed_accuracy`; the fixed reading then trains on ``1 - val_fraction`` of the samples, not all.

    Returns :func:`g2r_accuracy`'s dict with ``fixed`` = ``{"accuracy", "epochs", "num_train", "one_training"}``.
    """
    last = _new_model(kind, data, cfg, seed, x_syn)
    model, info = train_with_selection(kind, x_syn, y_syn, data, cfg, device, seed, last=last)
    acc = tc.accuracy(model, data.test.x, data.test.y, device, cfg.eval_batch_size)
    fixed = tc.accuracy(last, data.test.x, data.test.y, device, cfg.eval_batch_size)
    return {"accuracy": acc, **info,
            "fixed": {"accuracy": fixed, "epochs": info["epochs_run"], "num_train": info["num_train"],
                      "one_training": True}}


def g2r_fixed_accuracy(
    kind: str, x_syn: np.ndarray, y_syn: np.ndarray, data: ImageDataset, cfg: EvalConfig,
    device: str | torch.device = "cpu", seed: int = 0,
) -> dict:
    """Train ``kind`` on ALL synthetic samples for ``cfg.fixed_schedule_epochs`` epochs (no validation split, no
    early stopping, no selection); accuracy of the last epoch on the real test split.

    Returns ``{"accuracy", "epochs", "num_train", "seconds"}``.
    """
    fixed = dataclasses.replace(cfg, epochs=cfg.fixed_schedule_epochs, patience=None)
    model = _new_model(kind, data, fixed, seed, x_syn)
    empty = np.arange(0)
    model, info = tc.fit(model, x_syn, y_syn, x_syn[empty], y_syn[empty], fixed, device, seed)
    acc = tc.accuracy(model, data.test.x, data.test.y, device, cfg.eval_batch_size)
    return {"accuracy": acc, "epochs": info["epochs_run"], "num_train": info["num_train"], "seconds": info["seconds"]}


def _real_cache_file(kind: str, data: ImageDataset, cfg: EvalConfig, seed: int, fingerprint: str, cache_dir) -> Path:
    fields = {
        "what": "real_classifier", "kind": kind, "dataset": data.name, "data": fingerprint, "seed": seed,
        "num_classes": data.num_classes,
        **cfg.hash_fields("epochs", "batch_size", "lr", "val_fraction", "patience"),
    }
    if kind == "mlp":
        fields.update(cfg.hash_fields("mlp_hidden"))
    return _cache.cache_path(cache_dir, f"{data.name}-real-{kind}", _cache.cache_key(fields), ".pt")


def real_classifier(
    kind: str, data: ImageDataset, cfg: EvalConfig, device: str | torch.device = "cpu", seed: int = 0,
    cache_dir: str | Path | None = None, fingerprint: str | None = None,
    log: Callable[[str], None] = lambda s: None,
) -> tuple[nn.Module, dict]:
    """Classifier trained on the real training split (selection on a held-out part of it), cached.

    ``fingerprint`` identifies the real training arrays (:func:`dpgen.eval.cache.array_fingerprint`);
    it is computed here if not given.  ``info["cached"]`` says whether the weights came from the cache.
    """
    path = None
    if cache_dir is not None:
        fp = fingerprint or _cache.array_fingerprint(data.train.x, data.train.y)
        path = _real_cache_file(kind, data, cfg, seed, fp, cache_dir)
        entry = _cache.load_torch(path)
        if isinstance(entry, dict) and "state_dict" in entry:
            model = build_classifier(kind, data.shape, data.num_classes, seed, mlp_hidden=cfg.mlp_hidden)
            try:
                model.load_state_dict(entry["state_dict"])
            except RuntimeError:
                log(f"eval: ignoring unusable cache entry {path}")
            else:
                log(f"eval: real-data {kind} loaded from cache {path.name}")
                return model.to(device).eval(), {**entry.get("info", {}), "cached": True}
    log(f"eval: training {kind} on the real training split ({len(data.train)} examples)")
    model, info = train_with_selection(kind, data.train.x, data.train.y, data, cfg, device, seed)
    if path is not None:
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        _cache.save_torch(path, {"state_dict": state, "info": info})
    return model, {**info, "cached": False}


def r2g_accuracy(
    model: nn.Module, x_syn: np.ndarray, y_syn: np.ndarray, device: str | torch.device = "cpu", batch_size: int = 512
) -> float:
    """Accuracy of a real-data classifier on the labelled synthetic samples."""
    return tc.accuracy(model, x_syn, y_syn, device, batch_size)
