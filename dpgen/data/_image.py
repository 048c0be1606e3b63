"""PIL helpers for the image-folder loaders: decode, crop, resize, batch in threads."""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from dpgen.data._common import data_error

# Files per thread-pool task: big enough to amortise scheduling, small enough to
# keep both cores busy on a few thousand images.
_CHUNK = 256


def load_rgb(dataset: str, path: Path) -> Image.Image:
    """Decode ``path`` as an RGB image; a corrupt file becomes a one-line DpgenError."""
    try:
        with Image.open(path) as im:
            im.load()
            return im.convert("RGB")
    except (OSError, UnidentifiedImageError, ValueError) as e:
        raise data_error(dataset, path, f"cannot decode image ({type(e).__name__})") from None


def center_crop(im: Image.Image, size: int) -> Image.Image:
    """Central ``size``×``size`` crop (clipped to the image if it is smaller)."""
    w, h = im.size
    s = min(size, w, h)
    left, top = (w - s) // 2, (h - s) // 2
    return im.crop((left, top, left + s, top + s))


def resize_square(im: Image.Image, size: int) -> Image.Image:
    """Resize to ``size``×``size`` with Lanczos (antialiased when shrinking)."""
    if im.size == (size, size):
        return im
    return im.resize((size, size), Image.Resampling.LANCZOS)


def to_chw(im: Image.Image) -> np.ndarray:
    """PIL RGB image -> uint8 3×H×W array."""
    return np.asarray(im, dtype=np.uint8).transpose(2, 0, 1)


def load_images(
    paths: Sequence[Path], transform: Callable[[Path], np.ndarray], shape: tuple[int, int, int]
) -> np.ndarray:
    """Apply ``transform`` (path -> uint8 C×H×W) to every path into one N×C×H×W array.

    Uses threads because Pillow releases the GIL while decoding and resizing.
    """
    out = np.empty((len(paths), *shape), dtype=np.uint8)
    if not paths:
        return out

    def work(start: int) -> None:
        for i in range(start, min(start + _CHUNK, len(paths))):
            out[i] = transform(paths[i])

    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        # list() re-raises the first worker exception here.
        list(pool.map(work, range(0, len(paths), _CHUNK)))
    return out


def first_missing(paths: Sequence[Path]) -> list[Path]:
    """The subset of ``paths`` that does not exist as a file (in order)."""
    return [p for p in paths if not p.is_file()]
