"""Builders for tiny datasets in the REAL on-disk formats the dpgen.data loaders read.

Images encode their label as a colour so tests can check that pixels and labels
stay aligned through cropping, resizing, filtering and splitting.
"""
from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import numpy as np
from PIL import Image

# Pure colours per class index; far apart so resize ringing cannot confuse them.
COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255)]

CELEBA_ATTRS = (
    "5_o_Clock_Shadow Arched_Eyebrows Attractive Bags_Under_Eyes Bald Bangs Big_Lips Big_Nose "
    "Black_Hair Blond_Hair Blurry Brown_Hair Bushy_Eyebrows Chubby Double_Chin Eyeglasses Goatee "
    "Gray_Hair Heavy_Makeup High_Cheekbones Male Mouth_Slightly_Open Mustache Narrow_Eyes No_Beard "
    "Oval_Face Pale_Skin Pointy_Nose Receding_Hairline Rosy_Cheeks Sideburns Smiling Straight_Hair "
    "Wavy_Hair Wearing_Earrings Wearing_Hat Wearing_Lipstick Wearing_Necklace Wearing_Necktie Young"
).split()
HAIR = ("Black_Hair", "Blond_Hair", "Brown_Hair")


def files_under(root: Path) -> set[str]:
    """Every file below ``root`` (relative paths), to check a loader wrote nothing."""
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


# ---------------------------------------------------------------- IDX (MNIST family)
def write_idx(path: Path, arr: np.ndarray, gz: bool = True) -> Path:
    """Write a uint8 array as an IDX file: 0x0000, type 0x08, ndim, big-endian dims, data."""
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    header = bytes([0, 0, 0x08, arr.ndim]) + np.asarray(arr.shape, dtype=">u4").tobytes()
    payload = header + arr.tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)
    return path


def make_idx_dir(directory: Path, n_train: int = 12, n_test: int = 5, gz: bool = True, seed: int = 0) -> dict:
    """Four MNIST-style files in ``directory``; returns the arrays written."""
    rng = np.random.default_rng(seed)
    arrays = {
        "train_x": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_y": np.arange(n_train, dtype=np.uint8) % 10,
        "test_x": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_y": (np.arange(n_test, dtype=np.uint8) * 3) % 10,
    }
    names = {
        "train_x": "train-images-idx3-ubyte",
        "train_y": "train-labels-idx1-ubyte",
        "test_x": "t10k-images-idx3-ubyte",
        "test_y": "t10k-labels-idx1-ubyte",
    }
    for key, name in names.items():
        write_idx(directory / name, arrays[key], gz=gz)
    return arrays


# ---------------------------------------------------------------- CelebA
# (partition, male, hair flags black/blond/brown)
CELEBA_ROWS = [
    (0, 1, (1, 0, 0)),
    (0, 0, (0, 1, 0)),
    (0, 0, (0, 0, 1)),
    (0, 1, (1, 1, 0)),  # two hair colours: dropped from celeba_hair64
    (0, 0, (0, 0, 0)),  # no hair colour: dropped from celeba_hair64
    (1, 1, (1, 0, 0)),  # validation partition: unused
    (2, 0, (0, 1, 0)),
    (2, 1, (0, 0, 1)),
    (2, 1, (0, 0, 0)),
]


def _celeba_image(male: int, hair: tuple[int, int, int]) -> Image.Image:
    """178×218 white frame; the central 140×140 has gender colour (left) and hair colour (right)."""
    a = np.full((218, 178, 3), 255, dtype=np.uint8)
    top, left = (218 - 140) // 2, (178 - 140) // 2
    a[top:top + 140, left:left + 70] = COLOURS[male]
    hair_colour = COLOURS[int(np.argmax(hair))] if sum(hair) == 1 else (0, 0, 0)
    a[top:top + 140, left + 70:left + 140] = hair_colour
    return Image.fromarray(a)


def make_celeba(data_root: Path, rows=CELEBA_ROWS) -> list[str]:
    """torchvision-layout CelebA under ``data_root/celeba``; returns the image file names."""
    root = data_root / "celeba"
    (root / "img_align_celeba").mkdir(parents=True, exist_ok=True)
    names = [f"{i + 1:06d}.jpg" for i in range(len(rows))]
    attr_lines = [str(len(rows)), " ".join(CELEBA_ATTRS) + " "]
    part_lines = []
    for name, (part, male, hair) in zip(names, rows):
        vals = {a: -1 for a in CELEBA_ATTRS}
        vals["Male"] = 1 if male else -1
        for a, flag in zip(HAIR, hair):
            vals[a] = 1 if flag else -1
        # The real file pads with double spaces; the parser must not care.
        attr_lines.append(name + " " + " ".join(f"{vals[a]:2d}" for a in CELEBA_ATTRS))
        part_lines.append(f"{name} {part}")
        _celeba_image(male, hair).save(root / "img_align_celeba" / name, quality=95)
    (root / "list_attr_celeba.txt").write_text("\n".join(attr_lines) + "\n")
    (root / "list_eval_partition.txt").write_text("\n".join(part_lines) + "\n")
    return names


# ---------------------------------------------------------------- FFHQ
def make_ffhq(
    data_root: Path, genders: list[str | None], folder: str = "thumbnails128x128", size: int = 128,
    nested: bool = True, missing_json: tuple[int, ...] = (), colour_override=None,
) -> None:
    """FFHQ images ``<id5>.png`` plus ffhq-features JSON; gender None writes an empty face list.

    Image colour encodes gender (female red, male green) unless ``colour_override``.
    """
    root = data_root / "ffhq"
    jdir = root / "ffhq-features" / "json"
    jdir.mkdir(parents=True, exist_ok=True)
    for i, g in enumerate(genders):
        fid = f"{i:05d}"
        sub = root / folder / (f"{(i // 1000) * 1000:05d}" if nested else "")
        sub.mkdir(parents=True, exist_ok=True)
        colour = colour_override or (COLOURS[["female", "male"].index(g)] if g else (0, 0, 255))
        Image.new("RGB", (size, size), colour).save(sub / f"{fid}.png")
        if i in missing_json:
            continue
        faces = [] if g is None else [{"faceId": fid, "faceAttributes": {"gender": g, "age": 30.0}}]
        (jdir / f"{fid}.json").write_text(json.dumps(faces))


# ---------------------------------------------------------------- Camelyon17 (WILDS)
def make_camelyon(data_root: Path, rows: list[tuple[int, int, int, int, int, int]]) -> Path:
    """``rows`` of (patient, node, x, y, tumor, split); 96×96 patches coloured by tumor."""
    root = data_root / "camelyon17_v1.0"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "metadata.csv", "w", newline="") as f:
        w = csv.writer(f)
        # WILDS writes a pandas index as an unnamed first column.
        w.writerow(["", "patient", "node", "x_coord", "y_coord", "tumor", "slide", "center", "split"])
        for i, (p, n, x, y, t, s) in enumerate(rows):
            w.writerow([i, p, n, x, y, t, p * 5 + n, p // 20, s])
            pn = f"patient_{p:03d}_node_{n}"
            d = root / "patches" / pn
            d.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (96, 96), COLOURS[1 - t] if t in (0, 1) else (0, 0, 0)).save(
                d / f"patch_{pn}_x_{x}_y_{y}.png"
            )
    return root


# ---------------------------------------------------------------- credit card fraud
def make_credit(data_root: Path, n: int = 50, n_fraud: int = 10, seed: int = 0) -> np.ndarray:
    """Kaggle-format creditcard.csv; Amount = row index so rows can be traced. Returns the table."""
    rng = np.random.default_rng(seed)
    table = np.zeros((n, 31))
    table[:, 0] = np.arange(n) * 7.0  # Time
    table[:, 1:29] = rng.normal(size=(n, 28)).round(6)
    table[:, 29] = np.arange(n)  # Amount
    table[rng.choice(n, n_fraud, replace=False), 30] = 1
    path = data_root / "credit" / "creditcard.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = ["Time"] + [f"V{i}" for i in range(1, 29)] + ["Amount", "Class"]
    lines = [",".join(f'"{h}"' for h in header)]
    for row in table:
        # Kaggle quotes the header and the Class value.
        lines.append(",".join(repr(float(v)) for v in row[:30]) + f',"{int(row[30])}"')
    path.write_text("\n".join(lines) + "\n")
    return table


# ---------------------------------------------------------------- an image folder (dataset=folder)
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def fmnist_like(n_train: int, n_test: int) -> tuple[dict[str, np.ndarray], list[str], str]:
    """``n_train`` and ``n_test`` 28×28 grey images per class: real Fashion-MNIST read by dpgen's idx loader when the
    Debian package is installed, else scikit-learn's digits (so that CI without it runs the same tests).
    Returns ({train_x, train_y, test_x, test_y}, class names, source)."""
    from dpgen.data import idx

    if all((FASHION_MNIST / f"{stem}.gz").is_file() for stem in idx.FILES.values()):
        ds = idx._load_from_dirs("fmnist", [FASHION_MNIST], idx.FMNIST_CLASSES, "")
        source = "fashion-mnist"
    else:
        from dpgen.data import digits

        ds = digits.load()
        source = "digits"
    out = {}
    for part, split, n in (("train", ds.train, n_train), ("test", ds.test, n_test)):
        idx_ = np.concatenate([np.flatnonzero(split.y == c)[:n] for c in range(len(ds.classes))])
        out[f"{part}_x"], out[f"{part}_y"] = split.x[idx_, 0], split.y[idx_]
    return out, list(ds.classes), source


def folder_name(cls: str) -> str:
    """A class name as a folder name ("T-shirt/top" -> "T-shirt-top")."""
    return cls.replace("/", "-")


def make_image_folder(root: Path, n_train: int = 20, n_test: int = 4, test_dir: bool = True) -> dict:
    """The F-MNIST-as-PNG fixture: ``root/train/<class>/<i>.png`` (and ``root/test/<class>/<i>.png`` when
    ``test_dir``; else the test images go to train/ too). Returns the arrays, the folder class names (sorted: the
    labels the loader gives) and the source."""
    arrays, classes, source = fmnist_like(n_train, n_test)
    names = [folder_name(c) for c in classes]
    for part in ("train", "test"):
        base = root / ("test" if part == "test" and test_dir else "train")
        for i, (img, y) in enumerate(zip(arrays[f"{part}_x"], arrays[f"{part}_y"])):
            path = base / names[int(y)] / f"{part}{i:04d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img, mode="L").save(path)
    return {"arrays": arrays, "names": names, "sorted": sorted(names), "source": source}
