"""Per-record partitions: disjoint, covering, seeded, and stable under adding/removing a record."""
from __future__ import annotations

import numpy as np
import pytest

from dpgen.data import partition_by_record, record_owners
from dpgen.errors import DpgenError


def _records(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 1, 4, 4), dtype=np.uint8)


@pytest.mark.parametrize("n,k", [(500, 10), (2000, 7), (5, 1)])
def test_disjoint_covering_roughly_balanced(n, k):
    parts = partition_by_record(_records(n), k, seed=3)
    assert len(parts) == k
    allidx = np.concatenate(parts)
    assert len(allidx) == n and np.array_equal(np.sort(allidx), np.arange(n))
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= 1 and sizes.max() <= 2 * n / k
    assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts)


def test_deterministic_per_seed():
    x = _records(500)
    assert np.array_equal(record_owners(x, 8, seed=1), record_owners(x, 8, seed=1))
    assert not np.array_equal(record_owners(x, 8, seed=1), record_owners(x, 8, seed=2))


def test_removing_a_record_changes_exactly_one_part():
    """The neighbouring-dataset property the ensemble sensitivity arguments need."""
    x = _records(300)
    full = partition_by_record(x, 10, seed=0)
    drop = 123
    smaller = partition_by_record(np.delete(x, drop, axis=0), 10, seed=0)
    # map the smaller dataset's indices back to the original ones
    back = [np.where(p >= drop, p + 1, p) for p in smaller]
    changed = [j for j in range(10) if not np.array_equal(full[j], back[j])]
    assert len(changed) == 1 and drop in full[changed[0]]
    assert np.array_equal(np.sort(np.append(back[changed[0]], drop)), full[changed[0]])


def test_empty_part_and_bad_k_are_one_line_errors():
    with pytest.raises(DpgenError) as e:
        partition_by_record(_records(3), 50, seed=0)
    assert "empty" in str(e.value) and "\n" not in str(e.value)
    assert sum(len(p) == 0 for p in partition_by_record(_records(3), 50, seed=0, allow_empty=True)) >= 47
    with pytest.raises(DpgenError):
        record_owners(_records(5), 0, seed=0)
