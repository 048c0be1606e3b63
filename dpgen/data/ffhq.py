"""``ffhq128``: FFHQ faces at 128×128 with gender labels from ffhq-features-dataset.

Expected under ``<data_root>/ffhq/``: ``thumbnails128x128/`` (preferred, already
128×128) or ``images1024x1024/`` with ``<id5>.png`` files (flat or in the official
``00000/``-style sub-folders), and ``ffhq-features/json/<id5>.json``.

Images with no JSON file, an empty face list or no male/female gender are skipped
(their count is in ``meta["skipped"]``). Split: seeded random 90/10 (seed 0).
"""
from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np

from dpgen.data._common import data_error, missing_files_error, random_split, read_text
from dpgen.data._image import load_images, load_rgb, resize_square, to_chw
from dpgen.data.base import ImageDataset, Split
from dpgen.errors import DpgenError

SIZE = 128
TEST_SIZE = 0.1
SEED = 0
CLASSES = ["female", "male"]
IMAGE_DIRS = ("thumbnails128x128", "images1024x1024")
# The GitHub repo is called ffhq-features-dataset; accept it unrenamed too.
JSON_DIRS = ("ffhq-features/json", "ffhq-features-dataset/json")

_OBTAIN = (
    "get the images (thumbnails128x128 or images1024x1024) from https://github.com/NVlabs/ffhq-dataset "
    "and the json/ folder from https://github.com/DCGM/ffhq-features-dataset (as ffhq-features/json)"
)


def _gender(dataset: str, path: Path) -> int | None:
    """Label from one features JSON: 0 female, 1 male, None when no usable face entry."""
    try:
        faces = json.loads(read_text(dataset, path))
    except json.JSONDecodeError:
        raise data_error(dataset, path, "not valid JSON") from None
    if not isinstance(faces, list) or not faces or not isinstance(faces[0], dict):
        return None
    attrs = faces[0].get("faceAttributes")
    gender = attrs.get("gender") if isinstance(attrs, dict) else None
    return CLASSES.index(gender) if gender in CLASSES else None


def _transform(dataset: str, path: Path) -> np.ndarray:
    return to_chw(resize_square(load_rgb(dataset, path), SIZE))


def load(data_root: Path) -> ImageDataset:
    """FFHQ 128×128 RGB, label = gender; fixed 90/10 split."""
    root = Path(data_root) / "ffhq"
    img_dir = next((root / d for d in IMAGE_DIRS if (root / d).is_dir()), None)
    json_dir = next((root / d for d in JSON_DIRS if (root / d).is_dir()), None)
    pngs = sorted(img_dir.rglob("*.png"), key=lambda p: p.stem) if img_dir is not None else []
    missing = []
    if not pngs:
        missing.append(root / IMAGE_DIRS[0] / "*.png")
    if json_dir is None:
        missing.append(root / JSON_DIRS[0] / "<id>.json")
    if missing:
        raise missing_files_error("ffhq128", missing, _OBTAIN, root)

    paths, labels, skipped = [], [], 0
    for png in pngs:
        js = json_dir / f"{png.stem}.json"
        label = _gender("ffhq128", js) if js.is_file() else None
        if label is None:
            skipped += 1
            continue
        paths.append(png)
        labels.append(label)
    if len(paths) < 2:
        raise DpgenError(
            f"dataset 'ffhq128': only {len(paths)} of {len(pngs)} images in {img_dir} have a gender label "
            f"in {json_dir}; check that the JSON files are named like the images (<id5>.json)"
        )

    y = np.asarray(labels, dtype=np.int64)
    tr, te = random_split(len(paths), TEST_SIZE, SEED)
    # Decode each split straight into its own array (no N-sized copy via fancy indexing).
    decode = partial(_transform, "ffhq128")
    x_tr = load_images([paths[i] for i in tr], decode, (3, SIZE, SIZE))
    x_te = load_images([paths[i] for i in te], decode, (3, SIZE, SIZE))
    return ImageDataset(
        name="ffhq128",
        train=Split(x_tr, y[tr]),
        test=Split(x_te, y[te]),
        classes=list(CLASSES),
        meta={
            "source": str(img_dir),
            "split": f"seeded random {1 - TEST_SIZE:.0%}/{TEST_SIZE:.0%}, seed {SEED}",
            "label": "faceAttributes.gender of the first face in ffhq-features JSON",
            "skipped": skipped,
        },
    )
