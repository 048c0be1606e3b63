"""``folder``: the user's own images, one sub-folder per class (torchvision's ImageFolder layout).

Layouts (``dataset.path``; docs/own-data.md):

- ``<path>/train/<class>/...`` and ``<path>/test/<class>/...``: the two splits as given;
- ``<path>/train/<class>/...`` alone, or ``<path>/<class>/...``: a public split of each class's files
  (:func:`held_out`).

Class names are the sub-folder names, sorted (label i is the i-th name, as ImageFolder); an image is any file
with one of :data:`IMAGE_EXTENSIONS` below a class folder (nested folders included, hidden files skipped).
Each image is decoded with Pillow, converted to RGB (``channels=3``) or grayscale (``channels=1``), centre-cropped
to its largest central square and resized to ``resolution`` x ``resolution`` with Lanczos.

``resolution`` and ``channels`` are settings, never read off the images: a released generator's shape must not
depend on the training data. The class names and N are treated as public (docs/own-data.md, "What the guarantee
covers").
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from PIL import Image, UnidentifiedImageError

from dpgen.data._common import data_error, one_line
from dpgen.data._image import center_crop, load_images, resize_square
from dpgen.data.base import ImageDataset, Split
from dpgen.errors import DpgenError

NAME = "folder"
#: torchvision.datasets.folder.IMG_EXTENSIONS (compared lower-case)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
#: the image sizes every method's networks are built for (the built-in datasets' sizes)
RESOLUTIONS = (28, 32, 64, 128)
CHANNELS = (1, 3)
TRAIN_DIR, TEST_DIR = "train", "test"
#: the options ``dataset=folder`` reads (the ``dataset.*`` keys of configs/dataset/folder.yaml besides name, delta)
OPTIONS = ("path", "resolution", "channels", "test_fraction")

_DOC = "docs/own-data.md"
_SHOWN = 4  # class names spelled out in a message before it summarises


def held_out(relpath: str, fraction: float) -> bool:
    """Whether the file ``<class>/<name>`` (``relpath``, with ``/``) is a held-out test image when the folder has
    no ``test/``: the first 8 bytes of SHA-256 of the path, read as a number in [0, 1), fall below ``fraction``.

    Public and fixed: no seed and nothing read from the images, so anyone can recompute the split, and adding or
    removing one file moves no other file between the splits.
    """
    digest = hashlib.sha256(relpath.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def _error(problem: str) -> DpgenError:
    return DpgenError(one_line(f"dataset 'folder': {problem}"))


def _class_dirs(root: Path) -> list[Path]:
    try:
        return sorted((p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")), key=lambda p: p.name)
    except OSError as e:
        raise _error(f"cannot list {root} ({e.strerror or type(e).__name__})") from None


def _images(class_dir: Path) -> list[Path]:
    """Every image file below ``class_dir`` (recursively, as ImageFolder; hidden files and folders skipped)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(class_dir, followlinks=True, onerror=_raise_walk):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found += [Path(dirpath) / f for f in sorted(filenames)
                  if not f.startswith(".") and f.lower().endswith(IMAGE_EXTENSIONS)]
    return found


def _raise_walk(e: OSError) -> None:
    raise _error(f"cannot list {e.filename} ({e.strerror or type(e).__name__})")


def _shown(names: list[str]) -> str:
    return ", ".join(names[:_SHOWN]) + (f" (and {len(names) - _SHOWN} more)" if len(names) > _SHOWN else "")


def _scan_classes(root: Path, what: str) -> dict[str, list[Path]]:
    """class name -> its image files under ``root``; every class folder must hold at least one image."""
    classes = {d.name: _images(d) for d in _class_dirs(root)}
    empty = [c for c, files in classes.items() if not files]
    if empty:
        raise _error(f"class folder(s) {_shown(empty)} in {root} hold no image ({what}; images are files ending in "
                     f"{', '.join(IMAGE_EXTENSIONS)}); add images or remove the folder")
    return classes


@dataclass(frozen=True)
class FolderPlan:
    """What :func:`plan` found: the classes and the files of each split (labels = sorted class index)."""

    root: Path
    resolution: int
    channels: int
    test_fraction: float
    classes: list[str]
    train: list[tuple[Path, int]]
    test: list[tuple[Path, int]]
    split: str

    @property
    def n_train(self) -> int:
        return len(self.train)

    @property
    def cache_tag(self) -> str:
        """Names the cache file: the settings and every file's path, size and modification time, so that a changed
        folder or setting is read afresh rather than served from an old cache."""
        h = hashlib.sha256(json.dumps([str(self.root), self.resolution, self.channels, self.test_fraction,
                                       self.split, self.classes]).encode())
        for part, files in (("train", self.train), ("test", self.test)):
            for path, label in files:
                try:
                    st = path.stat()
                except OSError as e:  # removed or made unreadable since the folder was listed
                    raise _error(f"cannot read {path} ({e.strerror or type(e).__name__})") from None
                h.update(f"{part}\0{path.relative_to(self.root)}\0{label}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return h.hexdigest()[:16]

    def load(self) -> ImageDataset:
        """Decode, crop and resize every image (a file that cannot be decoded: a one-line DpgenError)."""
        shape = (self.channels, self.resolution, self.resolution)
        decode = partial(_decode, self.channels, self.resolution)
        splits = {}
        for part, files in (("train", self.train), ("test", self.test)):
            x = load_images([p for p, _ in files], decode, shape)
            splits[part] = Split(x, np.asarray([y for _, y in files], dtype=np.int64))
        return ImageDataset(
            name=NAME, train=splits["train"], test=splits["test"], classes=list(self.classes),
            meta={"source": str(self.root), "split": self.split,
                  "preprocess": f"{'RGB' if self.channels == 3 else 'grayscale'}, central square crop, Lanczos "
                                f"resize to {self.resolution}"},
        )


def _decode(channels: int, size: int, path: Path) -> np.ndarray:
    try:
        with Image.open(path) as im:
            im.load()
            im = im.convert("RGB" if channels == 3 else "L")
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as e:
        raise data_error(NAME, path, f"cannot decode image ({type(e).__name__})") from None
    w, h = im.size
    arr = np.asarray(resize_square(center_crop(im, min(w, h)), size), dtype=np.uint8)
    return arr[None] if channels == 1 else arr.transpose(2, 0, 1)


def check_options(options: Mapping[str, Any]) -> tuple[Path, int, int, float]:
    """``dataset.path``, ``resolution``, ``channels``, ``test_fraction`` as typed values (one-line errors naming the
    key: :func:`plan` may be called without the config schema, from Python)."""
    from dpgen.core.checks import bad

    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise _error(f"unknown option(s) {', '.join(unknown)}; valid: {', '.join(OPTIONS)}")
    path = options.get("path")
    if path in (None, ""):
        raise DpgenError("dataset=folder needs dataset.path=<folder of images, one sub-folder per class> "
                         f"({_DOC})")
    resolution, channels, fraction = options.get("resolution"), options.get("channels"), options.get("test_fraction")
    if isinstance(resolution, bool) or resolution not in RESOLUTIONS:
        raise bad("dataset.resolution", resolution, "one of " + ", ".join(map(str, RESOLUTIONS)))
    if isinstance(channels, bool) or channels not in CHANNELS:
        raise bad("dataset.channels", channels, "1 (grayscale) or 3 (RGB)")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < float(fraction) < 1.0:
        raise bad("dataset.test_fraction", fraction, "a number between 0 and 1 (exclusive)")
    return Path(str(path)).expanduser(), int(resolution), int(channels), float(fraction)


def plan(options: Mapping[str, Any]) -> FolderPlan:
    """List the folder ``options["path"]`` and split it (nothing is decoded or written). Bad layouts are one-line
    DpgenErrors: no such folder, fewer than two classes, an empty class, ``test/`` classes that differ from
    ``train/``'s, a class with no training image or no held-out image at all."""
    root, resolution, channels, fraction = check_options(options)
    if not root.is_dir():
        what = "a file" if root.exists() else "missing"
        raise _error(f"dataset.path={root} is {what}; it must be a folder with one sub-folder of images per class "
                     f"({_DOC})")
    root = root.resolve()
    train_root, test_root = root / TRAIN_DIR, root / TEST_DIR
    if test_root.is_dir() and not train_root.is_dir():
        raise _error(f"{root} has a {TEST_DIR}/ folder but no {TRAIN_DIR}/ folder; put the training images in "
                     f"{train_root}/<class>/")
    base = train_root if train_root.is_dir() else root
    train = _scan_classes(base, "training images")
    classes = sorted(train)
    if len(classes) < 2:
        found = f"one class folder ({classes[0]})" if classes else "no class folder"
        raise _error(f"{base} holds {found}; a class-conditional generator needs at least 2 classes, one sub-folder "
                     f"of images each ({_DOC})")
    if test_root.is_dir():
        test = _scan_classes(test_root, "test images")
        if sorted(test) != classes:
            only_train, only_test = sorted(set(classes) - set(test)), sorted(set(test) - set(classes))
            diff = "; ".join(s for s in (f"only in {TRAIN_DIR}/: {_shown(only_train)}" if only_train else "",
                                         f"only in {TEST_DIR}/: {_shown(only_test)}" if only_test else "") if s)
            raise _error(f"the class folders of {test_root} and {train_root} differ ({diff}); both need the same "
                         "classes")
        pairs = {"train": [(p, i) for i, c in enumerate(classes) for p in train[c]],
                 "test": [(p, i) for i, c in enumerate(classes) for p in test[c]]}
        split = f"the folder's own {TRAIN_DIR}/ and {TEST_DIR}/"
    else:
        pairs = {"train": [], "test": []}
        for i, c in enumerate(classes):
            for p in train[c]:
                rel = p.relative_to(base).as_posix()
                pairs["test" if held_out(rel, fraction) else "train"].append((p, i))
        split = (f"public hash split: <class>/<file> held out when the first 8 bytes of its SHA-256, as a number in "
                 f"[0, 1), are below test_fraction={fraction:g}")
        counts = np.bincount([y for _, y in pairs["train"]], minlength=len(classes))
        starved = [classes[i] for i in np.flatnonzero(counts == 0)]
        if starved:
            raise _error(f"class(es) {_shown(starved)} keep no training image after holding out "
                         f"test_fraction={fraction:g} of each class's files; add images or give a {TEST_DIR}/ folder")
        if not pairs["test"]:
            raise _error(f"no image of {base} falls in the held-out split (test_fraction={fraction:g}); raise "
                         f"dataset.test_fraction or give a {TEST_DIR}/ folder with one sub-folder per class")
    return FolderPlan(root, resolution, channels, fraction, classes, pairs["train"], pairs["test"], split)


def default_delta(options: Mapping[str, Any]) -> float:
    """δ for the folder's training set (``dataset.delta``'s default): :func:`dpgen.privacy.delta_below`."""
    from dpgen.privacy import delta_below

    return delta_below(plan(options).n_train)


def load(data_root: Path, **options: Any) -> ImageDataset:
    """The folder ``options["path"]`` as an :class:`ImageDataset` (``data_root`` is only where the cache lives)."""
    return plan(options).load()

