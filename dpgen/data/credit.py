"""``credit``: the Kaggle credit-card fraud table (tabular, not images).

Expected: ``<data_root>/credit/creditcard.csv`` with header
``Time,V1,...,V28,Amount,Class``.

Features are returned RAW (float32, ``Time`` dropped). Standardising with
train-split statistics would itself be a non-private release of the sensitive
data, and no fixed public bounds exist for V1..V28/Amount, so any scaling or
clipping must happen inside the DP mechanism that consumes ``train.x``.
Split: stratified 80/20, seed 0.
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from dpgen.data._common import data_error, missing_files_error, stratified_split
from dpgen.data.base import ImageDataset, Split

CLASSES = ["legit", "fraud"]
TEST_SIZE = 0.2
SEED = 0
LABEL, DROPPED = "Class", ("Time",)

_OBTAIN = "download creditcard.csv from https://www.kaggle.com/datasets/mlg-ulb/creditcardfraud"


def _header(path: Path) -> list[str]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError) as e:
        raise data_error("credit", path, f"cannot read ({type(e).__name__})") from None


def load(data_root: Path) -> ImageDataset:
    """Credit-card fraud: x float32 N×D raw features, y int64 (1 = fraud)."""
    path = Path(data_root) / "credit" / "creditcard.csv"
    if not path.is_file():
        raise missing_files_error("credit", [path], _OBTAIN, path.parent)

    header = [h.strip() for h in _header(path)]
    if LABEL not in header:
        raise data_error("credit", path, f"header has no {LABEL!r} column (expected Time,V1..V28,Amount,Class)")
    features = [i for i, h in enumerate(header) if h not in (LABEL, *DROPPED)]
    if not features:
        raise data_error("credit", path, "no feature columns besides Time/Class")
    try:
        # numpy's C parser; the Kaggle file quotes the Class values ("0"/"1").
        table = np.loadtxt(path, delimiter=",", skiprows=1, quotechar='"', dtype=np.float64, ndmin=2)
    except ValueError as e:
        raise data_error("credit", path, f"malformed CSV ({str(e).splitlines()[0][:120]})") from None
    if table.shape[0] < 10 or table.shape[1] != len(header):
        raise data_error(
            "credit", path, f"expected >= 10 rows of {len(header)} columns, got shape {tuple(table.shape)}"
        )
    raw_y = table[:, header.index(LABEL)]
    if not np.isin(raw_y, (0, 1)).all():
        raise data_error("credit", path, f"{LABEL} must be 0 or 1")
    y = raw_y.astype(np.int64)
    x = table[:, features].astype(np.float32)
    if not np.isfinite(x).all():
        raise data_error("credit", path, "contains NaN or infinite feature values")

    try:
        tr, te = stratified_split(y, TEST_SIZE, SEED)
    except ValueError:
        raise data_error("credit", path, "too few rows of each class for a stratified 80/20 split") from None
    return ImageDataset(
        name="credit",
        train=Split(np.ascontiguousarray(x[tr]), y[tr]),
        test=Split(np.ascontiguousarray(x[te]), y[te]),
        classes=list(CLASSES),
        tabular=True,
        meta={
            "source": str(path),
            "feature_names": [header[i] for i in features],
            "scaling": "none: features are raw; scale or clip inside the DP mechanism",
            "split": f"stratified {1 - TEST_SIZE:.0%}/{TEST_SIZE:.0%}, seed {SEED}",
        },
    )
