"""``evaluate``: every metric for one set of labelled synthetic samples.

Protocol sources: downstream accuracy and model selection on a synthetic hold-out from DPDM
(``train_downstream_classifiers.py``) and DP-Sinkhorn (``finalize_result.py``); FID and IS with
pytorch-fid's Inception (Heusel et al. 2017; Salimans et al. 2016) against the real TRAINING split as in
DPDM / DP-FETA / DPImageBench.  See the module docstrings of :mod:`dpgen.eval.g2r`,
:mod:`dpgen.eval.inception` and :mod:`dpgen.eval.cnn_fid`.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch

from dpgen.data.base import ImageDataset
from dpgen.errors import DpgenError
from dpgen.eval import cache as _cache
from dpgen.eval.classifiers import cnn_unavailable_reason
from dpgen.eval.cnn_fid import cnn_fid
from dpgen.eval.config import EvalConfig, resolve_config
from dpgen.eval.g2r import g2r_accuracy, g2r_fixed_accuracy, g2r_one_training, r2g_accuracy, real_classifier
from dpgen.eval.inception import inception_metrics
from dpgen.eval import train_classifier as tc


def _check_inputs(x_syn: np.ndarray, y_syn: np.ndarray, data: ImageDataset) -> tuple[np.ndarray, np.ndarray]:
    if x_syn.ndim < 2 or len(x_syn) == 0:
        raise DpgenError(f"evaluate: need a non-empty N x ... sample array, got shape {x_syn.shape}")
    if tuple(x_syn.shape[1:]) != tuple(data.shape):
        raise DpgenError(f"evaluate: synthetic example shape {tuple(x_syn.shape[1:])} != dataset shape {data.shape}")
    if data.tabular:
        if not np.issubdtype(x_syn.dtype, np.number):
            raise DpgenError(f"evaluate: tabular samples must be numeric, got {x_syn.dtype}")
        x_syn = x_syn.astype(np.float32, copy=False)
    elif x_syn.dtype != np.uint8:
        raise DpgenError(f"evaluate: image samples must be uint8 N x C x H x W, got {x_syn.dtype} (convert with to_uint8 first)")
    if y_syn.ndim != 1 or len(y_syn) != len(x_syn) or not np.issubdtype(y_syn.dtype, np.integer):
        raise DpgenError(f"evaluate: labels must be an int array of length {len(x_syn)}, got {y_syn.dtype} {y_syn.shape}")
    if y_syn.min() < 0 or y_syn.max() >= data.num_classes:
        raise DpgenError(f"evaluate: labels must lie in [0, {data.num_classes}), got [{y_syn.min()}, {y_syn.max()}]")
    return x_syn, y_syn.astype(np.int64, copy=False)


def evaluate(
    x_syn: np.ndarray,
    y_syn: np.ndarray,
    data: ImageDataset,
    cfg: Mapping | EvalConfig | None,
    device: str | torch.device = "cpu",
    seed: int = 0,
    cache_dir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Evaluate labelled synthetic samples against ``data`` under the settings ``cfg`` (configs/eval).

    ``x_syn``: uint8 N x C x H x W images (float N x D rows for tabular data); ``y_syn``: int labels.
    Returns a JSON-serialisable dict::

        {"g2r": {"cnn": {"accuracy", "selected_epoch", ..., "fixed": {"accuracy", "epochs", ...},
                         "selection_gap"}, "mlp": {...}},
         "r2g": {"classifier", "accuracy"}, "real_accuracy": {"cnn": .., "mlp": ..},
         "cnn_fid": .., "fid": .., "is": .., "is_std": .., "num_synthetic": N, ...}

    ``g2r[kind]["accuracy"]`` is the paper protocol (best epoch on a synthetic hold-out); ``fixed`` the
    fixed-schedule reading (all samples, last epoch, no selection; ``eval.fixed_reading``) and
    ``selection_gap`` the first minus the second (see :mod:`dpgen.eval.g2r`).
    A metric that cannot be computed (disabled, tabular data, no local Inception weights) is ``None``
    with a ``<metric>_reason`` string; a g2r entry that cannot be computed is
    ``{"accuracy": None, "reason": ...}``.  Real-data classifiers and Inception statistics of the real
    training split are cached in ``cache_dir`` when given.
    """
    c = resolve_config(cfg)
    say = log or (lambda s: None)
    x_syn, y_syn = _check_inputs(np.asarray(x_syn), np.asarray(y_syn), data)
    t_start = time.perf_counter()
    seconds: dict[str, float] = {}
    cnn_reason = cnn_unavailable_reason(data.shape, data.tabular)
    test_reason = "the dataset's test split is empty" if len(data.test) == 0 else None
    res: dict = {"dataset": data.name, "num_synthetic": int(len(x_syn)), "seed": int(seed), "g2r": {}}

    # --- g2r: train on synthetic, select on a synthetic hold-out, test once on real test ---
    t0 = time.perf_counter()
    kinds = c.classifiers
    if cnn_reason and kinds == ("cnn",):  # a CNN-only evaluation of tabular data reads the MLP, as r2g does
        kinds = ("mlp",)
    for kind in kinds:
        reason = test_reason or (cnn_reason if kind == "cnn" else None)
        if reason:
            res["g2r"][kind] = {"accuracy": None, "reason": reason}
            continue
        say(f"eval: g2r {kind} on {len(x_syn)} synthetic samples")
        shared = c.fixed_reading and c.one_training
        g2r = g2r_one_training if shared else g2r_accuracy
        entry = res["g2r"][kind] = g2r(kind, x_syn, y_syn, data, c, device, seed)
        say(f"eval: g2r {kind} accuracy {entry['accuracy']:.4f} (epoch {entry['selected_epoch']})")
        if c.fixed_reading:
            if not shared:
                entry["fixed"] = g2r_fixed_accuracy(kind, x_syn, y_syn, data, c, device, seed)
            entry["selection_gap"] = entry["accuracy"] - entry["fixed"]["accuracy"]
            say(f"eval: g2r {kind} fixed-schedule accuracy {entry['fixed']['accuracy']:.4f} (last of "
                f"{entry['fixed']['epochs']} epochs, no selection; selection gap {entry['selection_gap']:+.4f})")
    seconds["g2r"] = round(time.perf_counter() - t0, 3)

    # --- classifiers trained on the real training split (cached) ---
    r2g_kind = "mlp" if (c.r2g_classifier == "cnn" and cnn_reason) else c.r2g_classifier
    needed: list[str] = []
    if c.real_baseline:
        needed += [k for k in kinds if not (k == "cnn" and cnn_reason)]
    if c.r2g:
        needed.append(r2g_kind)
    if c.cnn_fid and not cnn_reason:
        needed.append("cnn")
    t0 = time.perf_counter()
    real_models, real_info = {}, {}
    fingerprint = _cache.array_fingerprint(data.train.x, data.train.y) if cache_dir is not None else None
    for kind in dict.fromkeys(needed):
        real_models[kind], real_info[kind] = real_classifier(kind, data, c, device, seed, cache_dir, fingerprint, say)
    if real_info:
        res["real_classifiers"] = real_info
    seconds["real_classifiers"] = round(time.perf_counter() - t0, 3)

    if not c.real_baseline:
        res["real_accuracy"], res["real_accuracy_reason"] = None, "disabled (eval.real_baseline: false)"
    elif test_reason:
        res["real_accuracy"], res["real_accuracy_reason"] = None, test_reason
    else:
        res["real_accuracy"] = {
            k: tc.accuracy(real_models[k], data.test.x, data.test.y, device, c.eval_batch_size)
            for k in kinds if k in real_models
        }

    if c.r2g:
        acc = r2g_accuracy(real_models[r2g_kind], x_syn, y_syn, device, c.eval_batch_size)
        res["r2g"] = {"classifier": r2g_kind, "accuracy": float(acc)}
    else:
        res["r2g"], res["r2g_reason"] = None, "disabled (eval.r2g: false)"

    # --- fidelity ---
    t0 = time.perf_counter()
    if not c.cnn_fid:
        res["cnn_fid"], res["cnn_fid_reason"] = None, "disabled (eval.cnn_fid: false)"
    elif cnn_reason:
        res["cnn_fid"], res["cnn_fid_reason"] = None, cnn_reason
    elif len(x_syn) < 2:
        res["cnn_fid"], res["cnn_fid_reason"] = None, "need at least 2 synthetic samples"
    else:
        res["cnn_fid"] = cnn_fid(real_models["cnn"], x_syn, data.train.x, device, c.fid_max_real, seed, c.eval_batch_size)
    seconds["cnn_fid"] = round(time.perf_counter() - t0, 3)

    t0 = time.perf_counter()
    if data.tabular:
        res.update({"fid": None, "fid_reason": "tabular dataset", "is": None, "is_std": None, "is_reason": "tabular dataset"})
    else:
        res.update(inception_metrics(
            x_syn, data.train.x, c, device, seed, data.name, fingerprint, cache_dir, say,
        ))
    seconds["inception"] = round(time.perf_counter() - t0, 3)
    seconds["total"] = round(time.perf_counter() - t_start, 3)
    res["seconds"] = seconds
    return res
