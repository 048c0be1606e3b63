"""Helpers shared by the dataset loaders: error messages and fixed splits."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dpgen.errors import DpgenError

# How many missing paths to spell out before summarising; the message must stay one line.
_MAX_SHOWN = 4


def one_line(text: str) -> str:
    """Collapse newlines so a message built from file names stays on one line."""
    return " ".join(text.split("\n"))


def missing_files_error(
    dataset: str, missing: Sequence[Path | str], obtain: str, put: Path | str
) -> DpgenError:
    """The single error a loader raises when its input files are absent.

    Names the expected file(s), where to get them and where to put them.
    """
    shown = ", ".join(str(p) for p in missing[:_MAX_SHOWN])
    if len(missing) > _MAX_SHOWN:
        shown += f" (and {len(missing) - _MAX_SHOWN} more)"
    them = "it" if len(missing) == 1 and "{" not in str(missing[0]) else "them"
    return DpgenError(one_line(f"dataset {dataset!r}: missing {shown}; {obtain}; put {them} in {put}"))


def data_error(dataset: str, path: Path | str, problem: str) -> DpgenError:
    """Error for a file that exists but cannot be used (corrupt, truncated, malformed)."""
    return DpgenError(
        one_line(f"dataset {dataset!r}: {path}: {problem}; replace the file with an intact copy")
    )


def stratified_split(y: np.ndarray, test_size: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Fixed stratified train/test split; returns sorted index arrays (train, test).

    Sorting keeps the original file order inside each split, so results do not
    depend on the shuffle beyond set membership.
    """
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(y))
    tr, te = train_test_split(idx, test_size=test_size, random_state=seed, stratify=y)
    return np.sort(tr).astype(np.int64), np.sort(te).astype(np.int64)


def random_split(n: int, test_size: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Fixed seeded (unstratified) split of ``range(n)``; at least one example on each side."""
    if n < 2:
        raise ValueError("need at least 2 examples to split")
    perm = np.random.default_rng(seed).permutation(n)
    n_test = min(max(1, int(round(test_size * n))), n - 1)
    return np.sort(perm[n_test:]).astype(np.int64), np.sort(perm[:n_test]).astype(np.int64)


def read_text(dataset: str, path: Path) -> str:
    """Read a small text/metadata file; unreadable or non-text content becomes a DpgenError."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise data_error(dataset, path, f"cannot read as text ({type(e).__name__})") from None
