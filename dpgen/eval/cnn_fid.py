"""Offline fidelity: Frechet distance in the feature space of the CNN trained on the REAL training split.

Same formula as FID (Heusel et al. 2017), but with the 128-d penultimate features of the DPDM downstream
CNN (:class:`dpgen.eval.classifiers.DownstreamCNN`) instead of Inception pool3 features, so it needs no
downloaded weights.  Values are NOT comparable with published FIDs; they only rank models evaluated
with the same real-data CNN (same dataset, eval settings and seed).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from dpgen.eval.frechet import frechet_distance_features
from dpgen.eval.train_classifier import extract_features


def cnn_fid(
    model: nn.Module,
    x_syn: np.ndarray,
    x_real: np.ndarray,
    device: str | torch.device = "cpu",
    max_real: int | None = None,
    seed: int = 0,
    batch_size: int = 512,
) -> float:
    """Frechet distance between ``model.features`` of ``x_syn`` and of (up to ``max_real``) ``x_real``."""
    if max_real is not None and len(x_real) > max_real:
        idx = np.sort(np.random.default_rng(seed).choice(len(x_real), size=max_real, replace=False))
        x_real = x_real[idx]
    f_real = extract_features(model, x_real, device, batch_size)
    f_syn = extract_features(model, x_syn, device, batch_size)
    return frechet_distance_features(f_syn, f_real)
