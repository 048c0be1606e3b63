"""The in-memory dataset type every loader returns."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Split:
    """One split: ``x`` uint8 N×C×H×W (or N×D float32 for tabular data), ``y`` int64 N."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return int(self.x.shape[0])


@dataclass
class ImageDataset:
    """A labelled dataset with train/test splits.

    The training split is the sensitive data: methods may only touch it through
    mechanisms that the privacy ledger records.
    """

    name: str
    train: Split
    test: Split
    classes: list[str]
    tabular: bool = False
    meta: dict = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of one example: (C, H, W) for images, (D,) for tabular data."""
        return tuple(self.train.x.shape[1:])
