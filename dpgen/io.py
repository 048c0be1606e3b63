"""Atomic file writes: readers see the old file or the complete new one, never half of one."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Callable


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> None:
    """Call ``write(fh)`` on a temp file beside ``path``, fsync, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` through :func:`atomic_write`."""
    import torch

    atomic_write(path, lambda fh: torch.save(obj, fh))


def atomic_write_json(obj: Any, path: str | os.PathLike) -> None:
    atomic_write(path, lambda fh: fh.write((json.dumps(obj, indent=2) + "\n").encode()))
