"""On-disk cache for evaluation artefacts that depend only on the REAL data (classifiers trained on
the real training split, Inception statistics of the real training split).

Keys hash the dataset name, a fingerprint of the array contents (so a changed split never reuses a
stale entry, a problem DPImageBench's Inception cache has), the relevant settings and the seed.
Writes are atomic: a temporary file in the same folder is renamed over the target. Reads trust nothing:
``torch.load(weights_only=True)`` / ``np.load(allow_pickle=False)``, then a structure check; an entry that
does not look like what dpgen writes is ignored (the caller recomputes it), never used.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpgen.io import atomic_save, atomic_write

CACHE_VERSION = 1


def array_fingerprint(*arrays: np.ndarray) -> str:
    """BLAKE2b of the shapes, dtypes and bytes of ``arrays``."""
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def cache_key(fields: dict[str, Any]) -> str:
    """Stable short hash of a JSON-able dict."""
    blob = json.dumps({"_v": CACHE_VERSION, **fields}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def cache_path(cache_dir: str | Path, stem: str, key: str, suffix: str) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in stem)
    return Path(cache_dir) / f"{safe}-{key}{suffix}"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda fh: fh.write(data))


def save_torch(path: Path, obj: Any) -> None:
    atomic_save(obj, path)


def load_torch(path: Path) -> Any | None:
    """The cached object, or None when absent, unreadable or not what :func:`save_torch` writes (plain values
    and dense tensors; a ``{"state_dict": ..., "info": ...}`` entry needs named tensors and plain info)."""
    from dpgen.core.untrusted import check_plain

    if not path.is_file():
        return None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
        check_plain(obj, str(path), tensors=True, max_depth=16)
    except Exception:  # noqa: BLE001 - a damaged or foreign entry (DpgenError included) is recomputed
        return None
    if isinstance(obj, dict) and "state_dict" in obj:
        sd, info = obj["state_dict"], obj.get("info", {})
        if not (isinstance(sd, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in sd.items())
                and isinstance(info, dict) and not any(isinstance(v, torch.Tensor) for v in info.values())):
            return None
    return obj


def save_arrays(path: Path, **arrays: np.ndarray) -> None:
    atomic_write(path, lambda fh: np.savez(fh, **arrays))


def load_arrays(path: Path, shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, np.ndarray] | None:
    """The cached arrays, or None when absent, unreadable, not finite numbers, or (with ``shapes``) not exactly
    the named arrays of those shapes (e.g. Inception statistics: ``{"mu": (2048,), "sigma": (2048, 2048),
    "n": ()}``)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception:  # noqa: BLE001 - a damaged entry is recomputed
        return None
    for a in arrays.values():
        if a.dtype.kind not in "biuf" or (a.dtype.kind == "f" and not np.isfinite(a).all()):
            return None
    if shapes is not None and (set(arrays) != set(shapes) or any(arrays[k].shape != tuple(v) for k, v in shapes.items())):
        return None
    return arrays
