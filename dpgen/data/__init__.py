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
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping

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
# name -> (module, function(options) -> a plan with ``cache_tag`` and ``load()``): datasets the config describes
# further (``dataset.path`` ...); their cache file is named by the plan's tag, since one name covers many folders.
_CONFIGURED: dict[str, tuple[str, str]] = {
    "folder": ("dpgen.data.folder", "plan"),
}

DATASETS: tuple[str, ...] = (*_LOADERS, *_CONFIGURED)

# Embedded in scikit-learn and built in milliseconds: caching it would only
# litter ./data/cache in every working directory that loads the default dataset.
_UNCACHED = frozenset({"digits"})

__all__ = ["DATASETS", "ImageDataset", "Split", "dataset_options", "load_config_dataset", "load_dataset",
           "partition_by_record", "record_owners"]


def load_dataset(name: str, data_root: str | os.PathLike = "data", cache: bool = True,
                 options: Mapping[str, Any] | None = None) -> ImageDataset:
    """Load dataset ``name`` from ``data_root`` (see the module docstrings for file layouts); ``options``: the
    settings of ``dataset=folder`` (``path``, ``resolution``, ``channels``, ``test_fraction``).

    With ``cache=True`` the preprocessed arrays are read from / written to
    ``<data_root>/cache/<name>.npz`` (``folder-<tag>.npz`` for a folder: its settings and files' names, sizes and
    times); the cache is written atomically and only after a successful load. Delete that file after replacing
    the source data of a built-in dataset. Raises :class:`DpgenError` for an unknown name, options a dataset does
    not take, or missing/corrupt input files.
    """
    if name not in DATASETS:
        raise DpgenError(f"unknown dataset {name!r}; valid names: {', '.join(DATASETS)}")
    root = Path(data_root)
    options = dict(options or {})
    build: Callable[[], ImageDataset]
    if name in _CONFIGURED:
        module, func = _CONFIGURED[name]
        plan = getattr(importlib.import_module(module), func)(options)  # lists and checks the layout
        tag, build = plan.cache_tag, plan.load
    else:
        if options:
            raise DpgenError(f"dataset={name} takes no dataset.{', dataset.'.join(sorted(options))}; only "
                             f"{', '.join(_CONFIGURED)} reads them")
        module, func = _LOADERS[name]
        tag, build = None, partial(getattr(importlib.import_module(module), func), root)
    use_cache = cache and name not in _UNCACHED
    path = cache_path(root, name, tag)
    if use_cache:
        cached = read_cache(path, name)
        if cached is not None:
            return cached

    ds: ImageDataset = build()
    assert is_valid(ds), f"loader for {name!r} broke the dtype/shape contract"

    if use_cache:
        try:
            write_cache(path, ds)
        except OSError as e:
            # The data are loaded fine; a read-only or full disk only costs speed next time.
            warnings.warn(f"could not write dataset cache {path}: {e}", stacklevel=2)
    return ds


def dataset_options(node: Any) -> dict[str, Any]:
    """The options a config's ``dataset`` block sets (the keys of :data:`dpgen.data.folder.OPTIONS` that are not
    null), for :func:`load_dataset`."""
    from dpgen.data.folder import OPTIONS

    return {k: node.get(k) for k in OPTIONS if node.get(k) is not None}


def load_config_dataset(cfg: Any, data_root: str | os.PathLike | None = None, cache: bool = True) -> ImageDataset:
    """The dataset a run config names: ``cfg.dataset.name`` with its options, under ``data_root`` (default
    ``cfg.data_root``)."""
    return load_dataset(str(cfg.dataset.name), cfg.data_root if data_root is None else data_root, cache=cache,
                        options=dataset_options(cfg.dataset))
