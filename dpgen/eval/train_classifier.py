"""Train a downstream classifier with model selection on a held-out split of its OWN training data.

Protocol (DPDM ``train_downstream_classifiers.py``): Adam lr 3e-4, batch 128, cross-entropy; after
every epoch the accuracy on a held-out *synthetic* validation set is measured and the weights of the
best epoch are kept (strict improvement, so the earliest best epoch wins).  DP-Sinkhorn
(``finalize_result.py``) uses the same 90/10 synthetic split plus early stopping with a patience;
``patience: null`` disables early stopping (DPDM runs all epochs).

Nothing here ever sees the real test split: :func:`fit` only receives a train and a validation
split, and the caller evaluates the returned model on the test split once, with :func:`accuracy`.
"""
from __future__ import annotations

import copy
import time
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from dpgen.eval.classifiers import to_model_input
from dpgen.eval.config import EvalConfig, resolve_config

# Move a whole split to an accelerator up to this size; stream batches from host memory above it.
_DEVICE_RESIDENT_BYTES = 1 << 30


def split_train_val(y: np.ndarray, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Stratified random split of ``range(len(y))`` into (train_idx, val_idx).

    Each class contributes ``round(n_c * val_fraction)`` examples to validation, but always leaves
    at least one in training.  Returns sorted index arrays.
    """
    y = np.asarray(y)
    if val_fraction <= 0.0 or len(y) < 2:
        return np.arange(len(y)), np.arange(0)
    rng = np.random.default_rng(seed)
    val_parts = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        n_val = min(int(round(len(idx) * val_fraction)), len(idx) - 1)
        if n_val > 0:
            val_parts.append(rng.choice(idx, size=n_val, replace=False))
    val_idx = np.sort(np.concatenate(val_parts)) if val_parts else np.arange(0)
    mask = np.ones(len(y), dtype=bool)
    mask[val_idx] = False
    return np.flatnonzero(mask), val_idx


def _as_tensor(x: np.ndarray, device: torch.device) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(x))
    if device.type != "cpu" and t.numel() * t.element_size() <= _DEVICE_RESIDENT_BYTES:
        t = t.to(device)
    return t


@torch.no_grad()
def predict_logits(model: nn.Module, x: np.ndarray, device: str | torch.device = "cpu", batch_size: int = 512) -> np.ndarray:
    """Logits (float32, N x classes) of ``model`` in eval mode."""
    return _map_batches(model, x, device, batch_size, lambda m, xb: m(xb))


@torch.no_grad()
def extract_features(model: nn.Module, x: np.ndarray, device: str | torch.device = "cpu", batch_size: int = 512) -> np.ndarray:
    """Penultimate features (``model.features``) in eval mode, float64 N x D."""
    return _map_batches(model, x, device, batch_size, lambda m, xb: m.features(xb)).astype(np.float64)


def _map_batches(model: nn.Module, x: np.ndarray, device: str | torch.device, batch_size: int, fn) -> np.ndarray:
    device = torch.device(device)
    was_training = model.training
    model.eval()
    xt = _as_tensor(x, device)
    outs = []
    for i in range(0, len(xt), batch_size):
        xb = to_model_input(xt[i : i + batch_size].to(device, non_blocking=True))
        outs.append(fn(model, xb).float().cpu())
    model.train(was_training)
    if not outs:
        return np.zeros((0, 0), dtype=np.float32)
    return torch.cat(outs).numpy()


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray, device: str | torch.device = "cpu", batch_size: int = 512) -> float:
    """Top-1 accuracy of ``model`` on (x, y)."""
    if len(y) == 0:
        raise ValueError("accuracy of an empty set is undefined")
    pred = predict_logits(model, x, device, batch_size).argmax(axis=1)
    return float(np.mean(pred == np.asarray(y)))


def fit(
    model: nn.Module,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_val: np.ndarray,
    y_val: np.ndarray,
    cfg: Mapping | EvalConfig,
    device: str | torch.device = "cpu",
    seed: int = 0,
    last: nn.Module | None = None,
) -> tuple[nn.Module, dict]:
    """Train ``model`` with Adam on (x_train, y_train); keep the epoch with the best accuracy on
    (x_val, y_val), stopping after ``cfg.patience`` epochs without improvement.

    With an empty validation split the last epoch is kept.  Uses ``cfg.epochs``, ``cfg.batch_size``,
    ``cfg.lr``, ``cfg.patience``.  Returns the model (best weights loaded, eval mode) and an info dict
    ``{selected_epoch, val_accuracy, epochs_run, train_loss, num_train, num_val, seconds}``.
    ``last`` (a module of the same architecture) receives the weights of the LAST epoch run, so one
    training gives both the selected and the unselected reading (``eval.one_training``).
    The global torch RNG is left untouched; shuffling and dropout are seeded by ``seed``.
    """
    c = resolve_config(cfg)
    device = torch.device(device)
    if len(y_train) == 0:
        raise ValueError("cannot train a classifier on an empty training set")
    t0 = time.perf_counter()
    model.to(device)
    xt, yt = _as_tensor(x_train, device), _as_tensor(np.asarray(y_train, dtype=np.int64), device)
    has_val = len(y_val) > 0
    opt = torch.optim.Adam(model.parameters(), lr=c.lr)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(seed)
    best_acc, best_epoch, best_state = -1.0, 0, None
    since_best, epoch, mean_loss = 0, 0, float("nan")
    fork_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(seed)
        for epoch in range(1, c.epochs + 1):
            model.train()
            perm = torch.randperm(len(yt), generator=gen)
            total, count = 0.0, 0
            for i in range(0, len(perm), c.batch_size):
                idx = perm[i : i + c.batch_size].to(xt.device)
                xb = to_model_input(xt[idx].to(device, non_blocking=True))
                yb = yt[idx].to(device, non_blocking=True)
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model(xb), yb)
                loss.backward()
                opt.step()
                total += float(loss.detach()) * len(idx)
                count += len(idx)
            mean_loss = total / max(count, 1)
            if not has_val:
                best_epoch = epoch
                continue
            acc = accuracy(model, x_val, y_val, device)
            if acc > best_acc:
                best_acc, best_epoch, since_best = acc, epoch, 0
                best_state = copy.deepcopy(model.state_dict())
            else:
                since_best += 1
                if c.patience is not None and since_best >= c.patience:
                    break
    if last is not None:
        last.load_state_dict(model.state_dict())
        last.to(device).eval()
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    info = {
        "selected_epoch": int(best_epoch),
        "val_accuracy": float(best_acc) if has_val else None,
        "epochs_run": int(epoch),
        "train_loss": float(mean_loss),
        "num_train": int(len(y_train)),
        "num_val": int(len(y_val)),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    return model, info
