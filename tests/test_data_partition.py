"""partition_indices: seeded, disjoint, covering, balanced."""
from __future__ import annotations

import numpy as np
import pytest

from dpgen.data import partition_indices
from dpgen.errors import DpgenError


@pytest.mark.parametrize("n,k", [(103, 10), (10, 10), (1000, 7), (5, 1), (60000, 250)])
def test_disjoint_covering_balanced(n, k):
    parts = partition_indices(n, k, seed=3)
    assert len(parts) == k
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    allidx = np.concatenate(parts)
    assert len(allidx) == n and np.array_equal(np.sort(allidx), np.arange(n))  # disjoint + covering
    for p in parts:
        assert p.dtype == np.int64 and np.all(np.diff(p) > 0)


def test_deterministic_per_seed():
    a, b = partition_indices(500, 8, seed=1), partition_indices(500, 8, seed=1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    c = partition_indices(500, 8, seed=2)
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_random_not_contiguous():
    # Contiguous blocks would put sorted-by-class data into single-class teachers.
    parts = partition_indices(100, 4, seed=0)
    assert not np.array_equal(parts[0], np.arange(25))


@pytest.mark.parametrize("n,k", [(5, 0), (5, -1), (3, 4)])
def test_invalid(n, k):
    with pytest.raises(DpgenError) as e:
        partition_indices(n, k, seed=0)
    assert "\n" not in str(e.value)
