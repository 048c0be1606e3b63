"""``celeba32``, ``celeba64``, ``celeba_hair64``: aligned CelebA in torchvision's folder layout.

Expected under ``<data_root>/celeba/``: ``img_align_celeba/*.jpg``,
``list_attr_celeba.txt`` and ``list_eval_partition.txt``.

Split: the official partition, train = 0 and test = 2. The validation partition
(1) is left out so the test set is exactly the one other papers report on.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from dpgen.data._common import data_error, missing_files_error, read_text
from dpgen.data._image import center_crop, first_missing, load_images, load_rgb, resize_square, to_chw
from dpgen.data.base import ImageDataset, Split

# Standard crop for the 178×218 aligned faces: keeps the face, drops most background.
CROP = 140
TRAIN_PART, TEST_PART = 0, 2
HAIR_ATTRS = ("Black_Hair", "Blond_Hair", "Brown_Hair")
HAIR_CLASSES = ["black", "blond", "brown"]
GENDER_CLASSES = ["female", "male"]

_OBTAIN = (
    "download Align&Cropped CelebA (img_align_celeba.zip, list_attr_celeba.txt, list_eval_partition.txt) "
    "from https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html and unzip the images"
)


def _parse_attrs(dataset: str, path: Path) -> tuple[list[str], list[str], np.ndarray]:
    """Return (file names, attribute names, int8 matrix of -1/1) from list_attr_celeba.txt."""
    lines = read_text(dataset, path).splitlines()
    if len(lines) < 2:
        raise data_error(dataset, path, "expected a count line and an attribute-name line")
    try:
        count = int(lines[0].strip())
    except ValueError:
        raise data_error(dataset, path, f"first line should be the image count, got {lines[0][:40]!r}") from None
    names = lines[1].split()
    rows = [ln.split() for ln in lines[2:] if ln.strip()]
    if len(rows) != count:
        raise data_error(dataset, path, f"header says {count} images but {len(rows)} rows follow (truncated?)")
    files = []
    values = np.empty((len(rows), len(names)), dtype=np.int8)
    for i, row in enumerate(rows):
        if len(row) != len(names) + 1:
            raise data_error(dataset, path, f"line {i + 3} has {len(row) - 1} values, expected {len(names)}")
        try:
            values[i] = [int(v) for v in row[1:]]
        except ValueError:
            raise data_error(dataset, path, f"line {i + 3} has a non-integer attribute value") from None
        files.append(row[0])
    if values.size and not np.isin(values, (-1, 1)).all():
        raise data_error(dataset, path, "attribute values must be -1 or 1")
    return files, names, values


def _parse_partition(dataset: str, path: Path) -> dict[str, int]:
    parts = {}
    for i, ln in enumerate(read_text(dataset, path).splitlines()):
        if not ln.strip():
            continue
        row = ln.split()
        if len(row) != 2 or row[1] not in ("0", "1", "2"):
            raise data_error(dataset, path, f"line {i + 1} should be '<file> 0|1|2'")
        parts[row[0]] = int(row[1])
    return parts


def _transform(dataset: str, size: int, path: Path) -> np.ndarray:
    return to_chw(resize_square(center_crop(load_rgb(dataset, path), CROP), size))


def load(data_root: Path, dataset: str, size: int, target: str) -> ImageDataset:
    """Load CelebA at ``size``×``size``; ``target`` is ``"male"`` or ``"hair"``."""
    root = Path(data_root) / "celeba"
    img_dir = root / "img_align_celeba"
    attr_file, part_file = root / "list_attr_celeba.txt", root / "list_eval_partition.txt"
    missing = [p for p in (attr_file, part_file) if not p.is_file()]
    if not img_dir.is_dir():
        missing.insert(0, img_dir / "*.jpg")
    if missing:
        raise missing_files_error(dataset, missing, _OBTAIN, root)

    files, names, values = _parse_attrs(dataset, attr_file)
    parts = _parse_partition(dataset, part_file)
    needed = ("Male",) if target == "male" else HAIR_ATTRS
    absent = [a for a in needed if a not in names]
    if absent:
        raise data_error(dataset, attr_file, f"no attribute column(s) {', '.join(absent)}")

    if target == "male":
        keep = np.ones(len(files), dtype=bool)
        labels = (values[:, names.index("Male")] == 1).astype(np.int64)
    else:
        hair = np.stack([values[:, names.index(a)] == 1 for a in HAIR_ATTRS], axis=1)
        # Only unambiguous hair colour: exactly one of the three attributes set.
        keep = hair.sum(axis=1) == 1
        labels = hair.argmax(axis=1).astype(np.int64)

    no_part = [f for f in files if f not in parts]
    if no_part:
        raise data_error(dataset, part_file, f"no partition entry for {no_part[0]} ({len(no_part)} files)")
    part_of = np.array([parts[f] for f in files], dtype=np.int64)

    splits = {}
    for split_name, part in (("train", TRAIN_PART), ("test", TEST_PART)):
        idx = np.flatnonzero(keep & (part_of == part))
        paths = [img_dir / files[i] for i in idx]
        gone = first_missing(paths)
        if gone:
            raise missing_files_error(dataset, gone, _OBTAIN + " (the image folder is incomplete)", img_dir)
        x = load_images(paths, partial(_transform, dataset, size), (3, size, size))
        splits[split_name] = Split(x, labels[idx])

    return ImageDataset(
        name=dataset,
        train=splits["train"],
        test=splits["test"],
        classes=list(GENDER_CLASSES if target == "male" else HAIR_CLASSES),
        meta={
            "source": str(root),
            "split": "official list_eval_partition: train=0, test=2, validation (1) unused",
            "preprocess": f"center crop {CROP}, Lanczos resize to {size}",
            "label": "Male attribute" if target == "male" else "exactly one of " + "/".join(HAIR_ATTRS),
        },
    )


def load_celeba32(data_root: Path) -> ImageDataset:
    """CelebA 32×32, label = Male."""
    return load(data_root, "celeba32", 32, "male")


def load_celeba64(data_root: Path) -> ImageDataset:
    """CelebA 64×64, label = Male."""
    return load(data_root, "celeba64", 64, "male")


def load_celeba_hair64(data_root: Path) -> ImageDataset:
    """CelebA 64×64, label = hair colour (black/blond/brown); ambiguous images dropped."""
    return load(data_root, "celeba_hair64", 64, "hair")
