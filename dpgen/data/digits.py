"""``digits``: scikit-learn's embedded 8×8 handwritten digits, upsampled to 28×28.

The data ship inside scikit-learn, so this loader needs no files and works offline.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from dpgen.data._common import stratified_split
from dpgen.data.base import ImageDataset, Split
from dpgen.data.torch_utils import to_uint8

SIZE = 28
TEST_SIZE = 0.2
SEED = 0
# load_digits stores pixel intensities as integers 0..16.
_MAX_VALUE = 16.0


def load(data_root: Path | None = None) -> ImageDataset:
    """1797 digits as uint8 N×1×28×28; fixed stratified 80/20 split (seed 0)."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    imgs = torch.from_numpy(bunch.images.astype(np.float32) / _MAX_VALUE).unsqueeze(1)
    # Bilinear upsampling keeps the strokes smooth; 28×28 matches the MNIST-family nets.
    up = F.interpolate(imgs, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
    x = to_uint8(up)
    y = bunch.target.astype(np.int64)
    tr, te = stratified_split(y, TEST_SIZE, SEED)
    return ImageDataset(
        name="digits",
        train=Split(x[tr], y[tr]),
        test=Split(x[te], y[te]),
        classes=[str(d) for d in range(10)],
        meta={
            "source": "sklearn.datasets.load_digits",
            "split": f"stratified {1 - TEST_SIZE:.0%}/{TEST_SIZE:.0%}, seed {SEED}",
        },
    )
