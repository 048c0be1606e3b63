"""Disjoint partitions of a training set for discriminator / teacher ensembles.

Each record's part is a keyed hash of the record's own bytes, not a random permutation of
``range(N)``: with a permutation, adding or removing one record reshuffles the others, so
one record could change every part. With a per-record assignment it changes exactly one
part — the disjointness that the PATE / GS-WGAN sensitivity arguments assume.
"""
from __future__ import annotations

import hashlib

import numpy as np

from dpgen.errors import DpgenError


def record_owners(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Part index (0..k-1, int64) of every record: blake2b(record bytes, key=seed) mod k."""
    k = int(k)
    if k < 1:
        raise DpgenError(f"cannot partition data into {k} parts; the number of parts must be >= 1")
    rows = np.ascontiguousarray(np.asarray(x)).reshape(len(x), -1)
    key = int(seed).to_bytes(8, "little", signed=True)
    return np.fromiter(
        (int.from_bytes(hashlib.blake2b(r.tobytes(), digest_size=8, key=key).digest(), "little") % k for r in rows),
        dtype=np.int64, count=len(rows),
    )


def partition_by_record(x: np.ndarray, k: int, seed: int, allow_empty: bool = False) -> list[np.ndarray]:
    """Indices of the records in each of the ``k`` parts (sorted int64 arrays).

    Part sizes are random (≈ N/k). An empty part is a one-line error unless ``allow_empty``:
    a discriminator with no data cannot be trained.
    """
    owners = record_owners(x, k, seed)
    parts = [np.flatnonzero(owners == j).astype(np.int64) for j in range(int(k))]
    empty = sum(len(p) == 0 for p in parts)
    if empty and not allow_empty:
        raise DpgenError(f"{empty} of {k} partitions of {len(owners)} records are empty; use fewer parts")
    return parts
