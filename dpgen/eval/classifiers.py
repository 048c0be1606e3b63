"""Downstream classifiers for generated-to-real (g2r) accuracy.

* :class:`DownstreamCNN` is the CNN of DPDM's ``train_downstream_classifiers.py`` (also used by
  DP-Sinkhorn's ``train_mnist_classifier.py`` and DP-FETA): unpadded 3x3 convolutions
  Conv32 -> MaxPool2 -> ReLU -> Dropout .5 -> Conv64 -> MaxPool2 -> ReLU -> Dropout .5 ->
  Conv128 -> ReLU -> Linear(flat, 128) -> ReLU -> Dropout .5 -> Linear(128, classes).
  On 28x28x1 the flatten size is 1152 as in DPDM; here it is computed for any C x H x W
  (32x32x3 gives 2048, the size of DP-GAN-DPAC's CelebA classifier).
* :class:`DownstreamMLP` is a fully connected net on flattened inputs.  DPDM's MLP has one hidden
  layer of 100 units (``mlp_hidden: [100]`` in ``configs/eval/paper.yaml``); the quick profile uses
  ``[512, 256]``.

Both take image batches already scaled to [-1, 1] (see :func:`to_model_input`), as DPDM does
(``x * 2 - 1`` on [0, 1] images).  For tabular data the MLP standardises its input with
buffers set from its own training split (:meth:`DownstreamMLP.set_standardization`).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from dpgen.errors import DpgenError


def to_model_input(xb: torch.Tensor) -> torch.Tensor:
    """uint8 images in [0, 255] -> float32 in [-1, 1] (DPDM); float (tabular) rows pass unchanged."""
    if xb.dtype == torch.uint8:
        return xb.to(torch.float32).mul_(2.0 / 255.0).sub_(1.0)
    return xb.to(torch.float32)


class DownstreamCNN(nn.Module):
    """The DPDM / DP-Sinkhorn downstream CNN (see module docstring)."""

    def __init__(self, in_shape: Sequence[int], num_classes: int, dropout: float = 0.5) -> None:
        super().__init__()
        if len(in_shape) != 3:
            raise DpgenError(f"the CNN classifier needs C x H x W images, got example shape {tuple(in_shape)}")
        c, h, w = (int(s) for s in in_shape)
        self.trunk = nn.Sequential(
            nn.Conv2d(c, 32, 3, 1),
            nn.MaxPool2d(2, 2),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Conv2d(32, 64, 3, 1),
            nn.MaxPool2d(2, 2),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Conv2d(64, 128, 3, 1),
            nn.ReLU(),
            nn.Flatten(),
        )
        fh, fw = self._out_size(h), self._out_size(w)
        if fh < 1 or fw < 1:
            raise DpgenError(f"images of {h}x{w} are too small for the downstream CNN (needs at least 18x18)")
        self.flat_dim = 128 * fh * fw
        self.embed = nn.Sequential(nn.Linear(self.flat_dim, 128), nn.ReLU())
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(128, num_classes))

    @staticmethod
    def _out_size(n: int) -> int:
        n = (n - 2) // 2  # conv3x3 (no padding), maxpool 2
        n = (n - 2) // 2
        return n - 2

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate 128-d activations (after the ReLU), used for the CNN-feature Frechet distance."""
        return self.embed(self.trunk(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class DownstreamMLP(nn.Module):
    """Fully connected classifier on flattened inputs; ``features`` is the last hidden layer."""

    def __init__(self, in_shape: Sequence[int], num_classes: int, hidden: Sequence[int] = (512, 256)) -> None:
        super().__init__()
        d = self.in_dim = int(np.prod([int(s) for s in in_shape]))
        if not hidden:
            raise DpgenError("eval config: mlp_hidden must list at least one layer width")
        layers: list[nn.Module] = [nn.Flatten()]
        for width in hidden:
            layers += [nn.Linear(d, int(width)), nn.ReLU()]
            d = int(width)
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(d, num_classes)
        self.register_buffer("shift", torch.zeros(self.in_dim))
        self.register_buffer("scale", torch.ones(self.in_dim))

    def set_standardization(self, x_train: np.ndarray) -> None:
        """Per-feature standardisation from the classifier's own training rows (tabular data only)."""
        x = np.asarray(x_train, dtype=np.float64).reshape(len(x_train), -1)
        mean = x.mean(axis=0)
        std = x.std(axis=0)
        std[~(std > 1e-8)] = 1.0
        with torch.no_grad():
            self.shift.copy_(torch.as_tensor(mean, dtype=torch.float32))
            self.scale.copy_(torch.as_tensor(std, dtype=torch.float32))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], -1)
        return self.body((x - self.shift) / self.scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def cnn_unavailable_reason(example_shape: Sequence[int], tabular: bool) -> str | None:
    """Why the downstream CNN cannot be used on this data (None if it can)."""
    if tabular or len(example_shape) != 3:
        return "tabular dataset: the CNN needs images"
    _, h, w = example_shape
    if min(DownstreamCNN._out_size(int(h)), DownstreamCNN._out_size(int(w))) < 1:
        return f"images of {h}x{w} are too small for the downstream CNN (needs at least 18x18)"
    return None


def build_classifier(
    kind: str,
    in_shape: Sequence[int],
    num_classes: int,
    seed: int,
    mlp_hidden: Sequence[int] = (512, 256),
) -> nn.Module:
    """A freshly initialised classifier; initialisation is seeded and leaves the global RNG untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if kind == "cnn":
            return DownstreamCNN(in_shape, num_classes)
        if kind == "mlp":
            return DownstreamMLP(in_shape, num_classes, hidden=mlp_hidden)
    raise DpgenError(f"unknown classifier {kind!r}; expected 'cnn' or 'mlp'")
