"""Atomic on-disk cache of preprocessed datasets: ``<data_root>/cache/<name>.npz``."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from dpgen.data.base import ImageDataset, Split
from dpgen.io import atomic_write

# Bump when preprocessing changes so old caches are rebuilt instead of silently reused.
CACHE_VERSION = 1


def cache_path(data_root: Path, name: str, tag: str | None = None) -> Path:
    """Where the preprocessed arrays of dataset ``name`` live (``tag``: which of the name's sources, e.g. one image
    folder of ``dataset=folder``)."""
    return Path(data_root) / "cache" / (f"{name}.npz" if tag is None else f"{name}-{tag}.npz")


def _valid_split(split: Split, tabular: bool) -> bool:
    if split.y.dtype != np.int64 or split.y.ndim != 1 or len(split.y) != split.x.shape[0]:
        return False
    if tabular:
        return split.x.dtype == np.float32 and split.x.ndim == 2
    return split.x.dtype == np.uint8 and split.x.ndim == 4


def is_valid(ds: ImageDataset) -> bool:
    """Check the dtype/shape contract every loader (and every cache file) must satisfy."""
    return _valid_split(ds.train, ds.tabular) and _valid_split(ds.test, ds.tabular)


def read_cache(path: Path, name: str) -> ImageDataset | None:
    """Load a cached dataset; ``None`` if absent, unreadable, stale or for another dataset."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if int(z["version"]) != CACHE_VERSION or str(z["name"]) != name:
                return None
            ds = ImageDataset(
                name=name,
                train=Split(z["train_x"], z["train_y"]),
                test=Split(z["test_x"], z["test_y"]),
                classes=[str(c) for c in z["classes"]],
                tabular=bool(z["tabular"]),
                meta=json.loads(str(z["meta"])),
            )
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, json.JSONDecodeError):
        # A damaged cache is not the user's data: rebuild it from the source files.
        return None
    return ds if is_valid(ds) else None


def write_cache(path: Path, ds: ImageDataset) -> None:
    """Write ``ds`` to ``path`` atomically (temp file in the same dir, then ``os.replace``).

    Readers therefore never see a half-written cache, even if the process dies mid-write.
    """
    # Uncompressed: image arrays barely compress and loading stays a plain read.
    atomic_write(path, lambda f: np.savez(
        f,
        version=np.int64(CACHE_VERSION),
        name=np.str_(ds.name),
        train_x=ds.train.x,
        train_y=ds.train.y,
        test_x=ds.test.x,
        test_y=ds.test.y,
        classes=np.array(ds.classes, dtype=np.str_),
        tabular=np.bool_(ds.tabular),
        meta=np.str_(json.dumps(ds.meta)),
    ))
