"""Datasets: local-file loaders with an atomic preprocessed-array cache.

``load_dataset(name)`` returns an :class:`ImageDataset` with uint8 N×C×H×W images
(float32 N×D for the tabular ``credit``) and int64 labels. Loaders read local files
only and never download; a missing input gives one :class:`DpgenError` saying what
to fetch and where to put it.
"""
from __future__ import annotations

import importlib
import os
import warnings
from pathlib import Path

from dpgen.data.base import ImageDataset, Split
from dpgen.data.cache import cache_path, is_valid, read_cache, write_cache
from dpgen.data.partition import partition_by_record, record_owners
from dpgen.errors import DpgenError

# name -> (module, function). Modules are imported on first use so that
# `import dpgen.data` stays cheap and one loader's imports cannot break another.
_LOADERS: dict[str, tuple[str, str]] = {
    "digits": ("dpgen.data.digits", "load"),
    "fmnist": ("dpgen.data.idx", "load_fmnist"),
    "mnist": ("dpgen.data.idx", "load_mnist"),
    "celeba32": ("dpgen.data.celeba", "load_celeba32"),
    "celeba64": ("dpgen.data.celeba", "load_celeba64"),
    "celeba_hair64": ("dpgen.data.celeba", "load_celeba_hair64"),
    "ffhq128": ("dpgen.data.ffhq", "load"),
    "camelyon": ("dpgen.data.camelyon", "load"),
    "credit": ("dpgen.data.credit", "load"),
}

DATASETS: tuple[str, ...] = tuple(_LOADERS)

# Embedded in scikit-learn and built in milliseconds: caching it would only
# litter ./data/cache in every working directory that loads the default dataset.
_UNCACHED = frozenset({"digits"})

__all__ = ["DATASETS", "ImageDataset", "Split", "load_dataset", "partition_by_record", "record_owners"]


def load_dataset(name: str, data_root: str | os.PathLike = "data", cache: bool = True) -> ImageDataset:
    """Load dataset ``name`` from ``data_root`` (see the module docstrings for file layouts).

    With ``cache=True`` the preprocessed arrays are read from / written to
    ``<data_root>/cache/<name>.npz``; the cache is written atomically and only after a
    successful load. Delete that file after replacing the source data. Raises
    :class:`DpgenError` for an unknown name or missing/corrupt input files.
    """
    if name not in _LOADERS:
        raise DpgenError(f"unknown dataset {name!r}; valid names: {', '.join(DATASETS)}")
    root = Path(data_root)
    use_cache = cache and name not in _UNCACHED
    path = cache_path(root, name)
    if use_cache:
        cached = read_cache(path, name)
        if cached is not None:
            return cached

    module, func = _LOADERS[name]
    ds: ImageDataset = getattr(importlib.import_module(module), func)(root)
    assert is_valid(ds), f"loader for {name!r} broke the dtype/shape contract"

    if use_cache:
        try:
            write_cache(path, ds)
        except OSError as e:
            # The data are loaded fine; a read-only or full disk only costs speed next time.
            warnings.warn(f"could not write dataset cache {path}: {e}", stacklevel=2)
    return ds
