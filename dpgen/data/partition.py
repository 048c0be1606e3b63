"""Seeded disjoint partitions of a training set (discriminator / teacher ensembles)."""
from __future__ import annotations

import numpy as np

from dpgen.errors import DpgenError


def partition_indices(n: int, k: int, seed: int) -> list[np.ndarray]:
    """Split ``range(n)`` into ``k`` disjoint, covering parts whose sizes differ by at most 1.

    The assignment is a seeded random permutation, so it is the same for the same
    ``(n, k, seed)`` on every machine. Each part is a sorted int64 array.
    """
    n, k = int(n), int(k)
    if k < 1:
        raise DpgenError(f"cannot partition data into {k} parts; the number of parts must be >= 1")
    if n < k:
        # Empty parts would give teachers/discriminators with no data to train on.
        raise DpgenError(
            f"cannot partition {n} examples into {k} non-empty parts; use at most {n} parts or more data"
        )
    perm = np.random.default_rng(seed).permutation(n)
    return [np.sort(part).astype(np.int64) for part in np.array_split(perm, k)]
