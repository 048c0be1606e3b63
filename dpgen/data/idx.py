"""``fmnist`` and ``mnist``: the IDX file format, parsed with numpy.

IDX layout: two zero bytes, a type code (0x08 = unsigned byte), the number of
dimensions, then each dimension as a big-endian uint32, then the raw data.
"""
from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from dpgen.data._common import data_error, missing_files_error
from dpgen.data.base import ImageDataset, Split

FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}

FMNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]
MNIST_CLASSES = [str(d) for d in range(10)]

# Debian/Ubuntu package `dataset-fashion-mnist` installs the four .gz files here.
# A module-level list so tests (and unusual installs) can redirect it.
SYSTEM_FMNIST_DIRS: list[Path] = [Path("/usr/share/datasets/fashion-mnist")]

_UBYTE = 0x08


def parse_idx(dataset: str, path: Path, ndim: int) -> np.ndarray:
    """Read one IDX file (optionally gzip-compressed) as a uint8 array with ``ndim`` dims."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        # gzip.BadGzipFile is an OSError; a truncated stream raises EOFError.
        raise data_error(dataset, path, f"cannot read ({type(e).__name__}: {e})") from None
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise data_error(dataset, path, "file too short for an IDX header")
    if raw[0] != 0 or raw[1] != 0 or raw[2] != _UBYTE or raw[3] != ndim:
        raise data_error(
            dataset, path,
            f"bad IDX magic number {raw[:4].hex()} (expected 0000{_UBYTE:02x}{ndim:02x})",
        )
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(dims, dtype=np.int64))
    if len(raw) - header != expected:
        raise data_error(
            dataset, path,
            f"IDX payload is {len(raw) - header} bytes but the header {dims} needs {expected} (truncated?)",
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims).copy()


def _find(directory: Path, stem: str) -> Path | None:
    """Uncompressed file first (faster to read), then the .gz."""
    for cand in (directory / stem, directory / f"{stem}.gz"):
        if cand.is_file():
            return cand
    return None


def _read_dir(dataset: str, files: dict[str, Path], classes: list[str], meta: dict) -> ImageDataset:
    arrays = {}
    for key, path in files.items():
        arr = parse_idx(dataset, path, 3 if key.endswith("_x") else 1)
        arrays[key] = arr
    for part in ("train", "test"):
        x, y = arrays[f"{part}_x"], arrays[f"{part}_y"]
        if x.shape[0] != y.shape[0]:
            raise data_error(
                dataset, files[f"{part}_y"],
                f"{y.shape[0]} labels but {x.shape[0]} images in {files[f'{part}_x'].name}",
            )
        if y.size and int(y.max()) >= len(classes):
            raise data_error(dataset, files[f"{part}_y"], f"label {int(y.max())} out of range 0..{len(classes) - 1}")
    return ImageDataset(
        name=dataset,
        train=Split(arrays["train_x"][:, None], arrays["train_y"].astype(np.int64)),
        test=Split(arrays["test_x"][:, None], arrays["test_y"].astype(np.int64)),
        classes=list(classes),
        meta=meta,
    )


def _load_from_dirs(dataset: str, dirs: list[Path], classes: list[str], obtain: str) -> ImageDataset:
    for d in dirs:
        found = {k: _find(d, stem) for k, stem in FILES.items()}
        if all(found.values()):
            return _read_dir(dataset, found, classes, {"source": str(d), "split": "official train/t10k"})
    # Name the files relative to the user's own directory, which is where they should go.
    expected = f"{dirs[0]}/{{{','.join(FILES.values())}}}.gz"
    searched = f" (searched {', '.join(str(d) for d in dirs)}; uncompressed files also accepted)"
    raise missing_files_error(dataset, [expected + searched], obtain, dirs[0])


def load_fmnist(data_root: Path) -> ImageDataset:
    """Fashion-MNIST from ``<data_root>/fashion-mnist`` or the Debian package's directory."""
    return _load_from_dirs(
        "fmnist",
        [Path(data_root) / "fashion-mnist", *SYSTEM_FMNIST_DIRS],
        FMNIST_CLASSES,
        "install them with `apt-get install dataset-fashion-mnist` or download them from "
        "https://github.com/zalandoresearch/fashion-mnist",
    )


def load_mnist(data_root: Path) -> ImageDataset:
    """MNIST from ``<data_root>/mnist``."""
    return _load_from_dirs(
        "mnist",
        [Path(data_root) / "mnist"],
        MNIST_CLASSES,
        "download them from https://yann.lecun.com/exdb/mnist/ "
        "(mirror: https://ossci-datasets.s3.amazonaws.com/mnist/)",
    )
