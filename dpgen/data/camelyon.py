"""``camelyon``: Camelyon17 tumour patches in the WILDS ``camelyon17_v1.0`` layout, at 32×32.

Expected under ``<data_root>/camelyon17_v1.0/``: ``metadata.csv`` (columns include
patient, node, x_coord, y_coord, tumor, split) and 96×96 PNG patches at
``patches/patient_PPP_node_N/patch_patient_PPP_node_N_x_X_y_Y.png``.

Split: the csv's own ``split`` column, train = 0 and test = 1 (patches from all
hospitals). This is not WILDS's hospital-based out-of-distribution split: the
papers reproduced here measure in-distribution utility. Rows with other split
values are ignored.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from dpgen.data._common import data_error, missing_files_error, read_text
from dpgen.data._image import first_missing, load_images, load_rgb, resize_square, to_chw
from dpgen.data.base import ImageDataset, Split

SIZE = 32
CLASSES = ["normal", "tumor"]
TRAIN_SPLIT, TEST_SPLIT = 0, 1
COLUMNS = ("patient", "node", "x_coord", "y_coord", "tumor", "split")

_OBTAIN = (
    "download camelyon17_v1.0 from https://wilds.stanford.edu/datasets/ "
    "(e.g. `python -m wilds.download --datasets camelyon17` on a machine with internet) and unpack it"
)


def patch_path(root: Path, patient: int, node: int, x: int, y: int) -> Path:
    """Path of one patch in the WILDS folder layout."""
    pn = f"patient_{patient:03d}_node_{node}"
    return root / "patches" / pn / f"patch_{pn}_x_{x}_y_{y}.png"


def _transform(path: Path) -> np.ndarray:
    return to_chw(resize_square(load_rgb("camelyon", path), SIZE))


def _read_metadata(path: Path) -> dict[str, np.ndarray]:
    reader = csv.DictReader(io.StringIO(read_text("camelyon", path)))
    absent = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if absent:
        raise data_error("camelyon", path, f"missing column(s) {', '.join(absent)}")
    cols: dict[str, list[int]] = {c: [] for c in COLUMNS}
    for lineno, row in enumerate(reader, start=2):
        try:
            for c in COLUMNS:
                # Some exports write integers as "12.0"; the values are integral either way.
                cols[c].append(int(float(row[c])))
        except (TypeError, ValueError):
            raise data_error("camelyon", path, f"line {lineno}: non-numeric value in {c!r}") from None
    return {c: np.asarray(v, dtype=np.int64) for c, v in cols.items()}


def load(data_root: Path) -> ImageDataset:
    """Camelyon17 patches as uint8 N×3×32×32, label = tumor."""
    root = Path(data_root) / "camelyon17_v1.0"
    meta_file = root / "metadata.csv"
    missing = [] if meta_file.is_file() else [meta_file]
    if not (root / "patches").is_dir():
        missing.append(root / "patches" / "patient_*_node_*" / "*.png")
    if missing:
        raise missing_files_error("camelyon", missing, _OBTAIN, root)

    md = _read_metadata(meta_file)
    bad = ~np.isin(md["tumor"], (0, 1))
    if bad.any():
        raise data_error("camelyon", meta_file, f"tumor must be 0 or 1 (row {int(np.flatnonzero(bad)[0]) + 2})")

    splits = {}
    for name, code in (("train", TRAIN_SPLIT), ("test", TEST_SPLIT)):
        idx = np.flatnonzero(md["split"] == code)
        paths = [
            patch_path(root, md["patient"][i], md["node"][i], md["x_coord"][i], md["y_coord"][i]) for i in idx
        ]
        gone = first_missing(paths)
        if gone:
            raise missing_files_error("camelyon", gone, _OBTAIN + " (the patches folder is incomplete)", root)
        splits[name] = Split(load_images(paths, _transform, (3, SIZE, SIZE)), md["tumor"][idx])

    return ImageDataset(
        name="camelyon",
        train=splits["train"],
        test=splits["test"],
        classes=list(CLASSES),
        meta={
            "source": str(root),
            "split": "metadata.csv split column: train=0, test=1 (not the WILDS hospital split)",
            "preprocess": f"Lanczos resize 96 -> {SIZE}",
        },
    )
