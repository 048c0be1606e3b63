"""dpgen.data loaders against tiny fixtures in the real on-disk formats."""
from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import dpgen.data.idx as idx_mod
from dpgen.data import DATASETS, load_dataset
from dpgen.data.base import ImageDataset
from dpgen.data.torch_utils import to_float, to_uint8
from dpgen.errors import DpgenError
from fixtures_data import (
    CELEBA_ROWS, COLOURS, files_under, make_camelyon, make_celeba, make_credit, make_ffhq,
    make_idx_dir, write_idx,
)

REAL_FMNIST = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(autouse=True)
def _no_system_fmnist(monkeypatch, tmp_path):
    """Keep the fixture tests hermetic: the system Fashion-MNIST dir is opted into explicitly."""
    monkeypatch.setattr(idx_mod, "SYSTEM_FMNIST_DIRS", [tmp_path / "no-system-fmnist"])


def _assert_images(ds: ImageDataset, name: str, chw: tuple[int, int, int], classes: list[str]) -> None:
    assert ds.name == name and not ds.tabular
    assert ds.classes == classes and ds.shape == chw
    for split in (ds.train, ds.test):
        assert split.x.dtype == np.uint8 and split.x.shape[1:] == chw
        assert split.y.dtype == np.int64 and split.y.shape == (len(split),)
        assert split.y.min() >= 0 and split.y.max() < len(classes)


def _assert_same(a: ImageDataset, b: ImageDataset) -> None:
    assert a.name == b.name and a.classes == b.classes and a.tabular == b.tabular and a.meta == b.meta
    for sa, sb in ((a.train, b.train), (a.test, b.test)):
        assert sa.x.dtype == sb.x.dtype and np.array_equal(sa.x, sb.x) and np.array_equal(sa.y, sb.y)


def _assert_cached(data_root: Path, name: str, source: Path, first: ImageDataset) -> None:
    """The cache file exists, no temp files are left, and a reload works without the sources."""
    cache_dir = data_root / "cache"
    assert sorted(p.name for p in cache_dir.iterdir()) == [f"{name}.npz"]
    shutil.rmtree(source)
    _assert_same(first, load_dataset(name, data_root))


def _colour_class(img_chw: np.ndarray, n_classes: int) -> int:
    """Which of COLOURS an (interior of an) image is closest to."""
    mean = img_chw.reshape(3, -1).mean(axis=1)
    return int(np.argmin([np.abs(mean - np.array(c)).sum() for c in COLOURS[:n_classes]]))


# ---------------------------------------------------------------- registry / errors
def test_dataset_names():
    assert DATASETS == (
        "digits", "fmnist", "mnist", "celeba32", "celeba64", "celeba_hair64", "ffhq128", "camelyon", "credit",
        "folder",
    )


def test_unknown_name_lists_valid_names():
    with pytest.raises(DpgenError) as e:
        load_dataset("cifar10")
    msg = str(e.value)
    assert "\n" not in msg and "cifar10" in msg and all(n in msg for n in DATASETS)


EXPECTED_PATH = {
    "fmnist": "fashion-mnist/{train-images-idx3-ubyte",
    "mnist": "mnist/{train-images-idx3-ubyte",
    "celeba32": "celeba/list_attr_celeba.txt",
    "celeba64": "celeba/list_eval_partition.txt",
    "celeba_hair64": "celeba/img_align_celeba",
    "ffhq128": "ffhq/ffhq-features/json",
    "camelyon": "camelyon17_v1.0/metadata.csv",
    "credit": "credit/creditcard.csv",
}


@pytest.mark.parametrize("name", sorted(EXPECTED_PATH))
def test_missing_files_one_line_error_and_nothing_written(tmp_path, name):
    root = tmp_path / "data"
    with pytest.raises(DpgenError) as e:
        load_dataset(name, root)
    msg = str(e.value)
    assert "\n" not in msg
    assert str(root / EXPECTED_PATH[name]) in msg
    assert "put " in msg and ("http" in msg or "apt-get" in msg)
    assert not root.exists()

    # Same with an existing data_root: nothing gets added (no cache dir either).
    (root / "unrelated").mkdir(parents=True)
    with pytest.raises(DpgenError):
        load_dataset(name, root)
    assert files_under(root) == {"unrelated"}


# ---------------------------------------------------------------- digits (real, embedded)
def test_digits_real(tmp_path):
    root = tmp_path / "data"
    ds = load_dataset("digits", root)
    _assert_images(ds, "digits", (1, 28, 28), [str(d) for d in range(10)])
    assert (len(ds.train), len(ds.test)) == (1437, 360)
    assert ds.train.x.min() == 0 and ds.train.x.max() == 255
    # Stratified: every class holds ~20% of its examples in the test split.
    counts_tr, counts_te = np.bincount(ds.train.y, minlength=10), np.bincount(ds.test.y, minlength=10)
    assert np.all(np.abs(counts_te - 0.2 * (counts_tr + counts_te)) <= 1)
    _assert_same(ds, load_dataset("digits", root))  # fixed split
    assert not root.exists()  # embedded dataset: never cached


# ---------------------------------------------------------------- IDX: fmnist / mnist
@pytest.mark.parametrize("gz", [True, False])
def test_mnist_fixture(tmp_path, gz):
    root = tmp_path / "data"
    arrays = make_idx_dir(root / "mnist", gz=gz)
    ds = load_dataset("mnist", root)
    _assert_images(ds, "mnist", (1, 28, 28), [str(d) for d in range(10)])
    assert np.array_equal(ds.train.x[:, 0], arrays["train_x"]) and np.array_equal(ds.train.y, arrays["train_y"])
    assert np.array_equal(ds.test.x[:, 0], arrays["test_x"]) and np.array_equal(ds.test.y, arrays["test_y"])
    _assert_cached(root, "mnist", root / "mnist", ds)


def test_fmnist_fixture_local_dir_and_cache_flag(tmp_path):
    root = tmp_path / "data"
    arrays = make_idx_dir(root / "fashion-mnist", n_train=7, n_test=3)
    ds = load_dataset("fmnist", root, cache=False)
    assert ds.classes[0] == "T-shirt/top" and ds.classes[9] == "Ankle boot"
    assert np.array_equal(ds.test.x[:, 0], arrays["test_x"])
    assert not (root / "cache").exists()


def test_fmnist_system_dir_fallback(tmp_path, monkeypatch):
    sysdir = tmp_path / "usr-share"
    arrays = make_idx_dir(sysdir, n_train=4, n_test=2)
    monkeypatch.setattr(idx_mod, "SYSTEM_FMNIST_DIRS", [sysdir])
    ds = load_dataset("fmnist", tmp_path / "data")
    assert np.array_equal(ds.train.y, arrays["train_y"])
    assert (tmp_path / "data" / "cache" / "fmnist.npz").is_file()


def _corrupt_cases(d: Path) -> dict:
    img = np.zeros((3, 28, 28), np.uint8)
    return {
        "bad magic": lambda: (d / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x01" + bytes(100)),
        "truncated payload": lambda: (d / "train-images-idx3-ubyte").write_bytes(
            bytes([0, 0, 8, 3]) + np.asarray([3, 28, 28], ">u4").tobytes() + bytes(100)
        ),
        "truncated gzip": lambda: (d / "train-images-idx3-ubyte.gz").write_bytes(
            gzip.compress(bytes([0, 0, 8, 3]) + np.asarray([3, 28, 28], ">u4").tobytes() + img.tobytes())[:-20]
        ),
        "not gzip": lambda: (d / "train-images-idx3-ubyte.gz").write_bytes(b"plain text, not gzip"),
        "label count": lambda: write_idx(d / "train-labels-idx1-ubyte", np.zeros(5, np.uint8), gz=False),
        "label range": lambda: write_idx(d / "train-labels-idx1-ubyte", np.full(12, 10, np.uint8), gz=False),
    }


@pytest.mark.parametrize("case", list(_corrupt_cases(Path("."))))
def test_idx_corrupt_files(tmp_path, case):
    root = tmp_path / "data"
    d = root / "mnist"
    make_idx_dir(d, n_train=12)
    for p in d.glob("train-*"):  # the case writes its own version of one train file
        if case in ("label count", "label range") and "images" in p.name:
            continue
        if case not in ("label count", "label range") and "labels" in p.name:
            continue
        p.unlink()
    _corrupt_cases(d)[case]()
    before = files_under(root)
    with pytest.raises(DpgenError) as e:
        load_dataset("mnist", root)
    assert "\n" not in str(e.value) and "mnist/train-" in str(e.value)
    assert files_under(root) == before


@pytest.mark.skipif(
    not all((REAL_FMNIST / f"{s}.gz").is_file() for s in idx_mod.FILES.values()),
    reason="real Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)
def test_fmnist_real(tmp_path, monkeypatch):
    monkeypatch.setattr(idx_mod, "SYSTEM_FMNIST_DIRS", [REAL_FMNIST])
    root = tmp_path / "data"
    ds = load_dataset("fmnist", root)
    _assert_images(ds, "fmnist", (1, 28, 28), idx_mod.FMNIST_CLASSES)
    assert (len(ds.train), len(ds.test)) == (60000, 10000)
    assert np.array_equal(np.bincount(ds.train.y), np.full(10, 6000))
    assert np.array_equal(np.bincount(ds.test.y), np.full(10, 1000))
    assert (root / "cache" / "fmnist.npz").is_file()
    # Second load must come from the cache, not the source files.
    monkeypatch.setattr(idx_mod, "SYSTEM_FMNIST_DIRS", [tmp_path / "gone"])
    _assert_same(ds, load_dataset("fmnist", root))


# ---------------------------------------------------------------- CelebA
def _celeba_expected(target: str):
    out = {}
    for part in (0, 2):
        labels = []
        for p, male, hair in CELEBA_ROWS:
            if p != part:
                continue
            if target == "male":
                labels.append(male)
            elif sum(hair) == 1:
                labels.append(int(np.argmax(hair)))
        out[part] = labels
    return out


@pytest.mark.parametrize(
    "name,size,target,classes",
    [
        ("celeba32", 32, "male", ["female", "male"]),
        ("celeba64", 64, "male", ["female", "male"]),
        ("celeba_hair64", 64, "hair", ["black", "blond", "brown"]),
    ],
)
def test_celeba(tmp_path, name, size, target, classes):
    root = tmp_path / "data"
    make_celeba(root)
    ds = load_dataset(name, root)
    _assert_images(ds, name, (3, size, size), classes)
    exp = _celeba_expected(target)
    assert ds.train.y.tolist() == exp[0] and ds.test.y.tolist() == exp[2]  # validation (1) unused
    q = size // 4
    for split in (ds.train, ds.test):
        for img, label in zip(split.x, split.y):
            # Centre crop 140 of 178×218: no white frame may survive anywhere.
            assert img.astype(int).sum(axis=0).max() < 3 * 230
            # Left half carries the gender colour, right half the hair colour.
            half = img[:, q:-q, 2:q] if target == "male" else img[:, q:-q, -q:-2]
            assert _colour_class(half, len(classes)) == label
    _assert_cached(root, name, root / "celeba", ds)


def test_celeba_missing_partition_file_and_image(tmp_path):
    root = tmp_path / "data"
    names = make_celeba(root)
    (root / "celeba" / "list_eval_partition.txt").unlink()
    before = files_under(root)
    with pytest.raises(DpgenError, match="list_eval_partition.txt") as e:
        load_dataset("celeba32", root)
    missing_part = str(e.value).split(";")[0]  # "dataset '...': missing <paths>"
    assert "list_eval_partition.txt" in missing_part and "list_attr_celeba" not in missing_part
    assert files_under(root) == before

    make_celeba(root)
    (root / "celeba" / "img_align_celeba" / names[1]).unlink()
    before = files_under(root)
    with pytest.raises(DpgenError, match=names[1]):
        load_dataset("celeba64", root)
    assert files_under(root) == before


def test_celeba_malformed_attr_file(tmp_path):
    root = tmp_path / "data"
    make_celeba(root)
    attr = root / "celeba" / "list_attr_celeba.txt"
    attr.write_text("\n".join(attr.read_text().splitlines()[:-2]) + "\n")  # drop two rows
    with pytest.raises(DpgenError, match="truncated"):
        load_dataset("celeba32", root)
    assert not (root / "cache").exists()


# ---------------------------------------------------------------- FFHQ
def test_ffhq_thumbnails_preferred_and_labels(tmp_path):
    root = tmp_path / "data"
    genders = ["female", "male"] * 9 + [None, "male"]  # index 18: no face; 19: no JSON file
    make_ffhq(root, genders, missing_json=(19,))
    # A full-resolution folder with a different colour must be ignored.
    make_ffhq(root, genders, folder="images1024x1024", size=64, missing_json=(19,), colour_override=(0, 0, 0))
    ds = load_dataset("ffhq128", root)
    _assert_images(ds, "ffhq128", (3, 128, 128), ["female", "male"])
    assert (len(ds.train), len(ds.test)) == (16, 2)  # 18 labelled, 90/10
    assert ds.meta["skipped"] == 2
    for split in (ds.train, ds.test):
        for img, label in zip(split.x, split.y):
            assert _colour_class(img, 2) == label and img.max() == 255
    assert ds.train.y.sum() + ds.test.y.sum() == 9
    _assert_cached(root, "ffhq128", root / "ffhq", ds)


def test_ffhq_full_resolution_flat(tmp_path):
    root = tmp_path / "data"
    make_ffhq(root, ["male", "female", "female"], folder="images1024x1024", size=256, nested=False)
    ds = load_dataset("ffhq128", root, cache=False)
    assert ds.shape == (3, 128, 128) and (len(ds.train), len(ds.test)) == (2, 1)
    assert not (root / "cache").exists()


# ---------------------------------------------------------------- Camelyon17
def test_camelyon(tmp_path):
    root = tmp_path / "data"
    rows = [
        (4, 0, 3328, 21792, 1, 0), (4, 0, 3200, 21600, 0, 0), (10, 3, 640, 96, 0, 0),
        (10, 3, 736, 96, 1, 1), (39, 1, 9000, 12000, 0, 1), (39, 1, 9096, 12000, 1, 0),
    ]
    make_camelyon(root, rows)
    ds = load_dataset("camelyon", root)
    _assert_images(ds, "camelyon", (3, 32, 32), ["normal", "tumor"])
    assert ds.train.y.tolist() == [r[4] for r in rows if r[5] == 0]
    assert ds.test.y.tolist() == [r[4] for r in rows if r[5] == 1]
    for split in (ds.train, ds.test):
        for img, label in zip(split.x, split.y):
            # normal -> green patch (COLOURS[1]), tumor -> red (COLOURS[0])
            assert _colour_class(img, 2) == 1 - label
    _assert_cached(root, "camelyon", root / "camelyon17_v1.0", ds)


def test_camelyon_missing_patch(tmp_path):
    root = tmp_path / "data"
    src = make_camelyon(root, [(4, 0, 3328, 21792, 1, 0), (4, 0, 3200, 21600, 0, 1)])
    gone = src / "patches" / "patient_004_node_0" / "patch_patient_004_node_0_x_3200_y_21600.png"
    gone.unlink()
    with pytest.raises(DpgenError) as e:
        load_dataset("camelyon", root)
    assert str(gone) in str(e.value) and "\n" not in str(e.value)
    assert not (root / "cache").exists()


# ---------------------------------------------------------------- credit (tabular)
def test_credit(tmp_path):
    root = tmp_path / "data"
    table = make_credit(root)
    ds = load_dataset("credit", root)
    assert ds.tabular and ds.classes == ["legit", "fraud"] and ds.shape == (29,)
    assert ds.meta["feature_names"] == [f"V{i}" for i in range(1, 29)] + ["Amount"]
    assert (len(ds.train), len(ds.test)) == (40, 10)
    assert (ds.train.y.sum(), ds.test.y.sum()) == (8, 2)  # stratified
    for split in (ds.train, ds.test):
        assert split.x.dtype == np.float32 and split.y.dtype == np.int64
        rows = split.x[:, -1].astype(int)  # Amount = original row index
        np.testing.assert_allclose(split.x, table[rows, 1:30].astype(np.float32))  # raw, Time dropped
        assert np.array_equal(split.y, table[rows, 30].astype(np.int64))
    assert set(ds.train.x[:, -1].astype(int)).isdisjoint(ds.test.x[:, -1].astype(int))
    _assert_cached(root, "credit", root / "credit", ds)


def test_credit_bad_header(tmp_path):
    root = tmp_path / "data"
    make_credit(root)
    path = root / "credit" / "creditcard.csv"
    path.write_text(path.read_text().replace('"Class"', '"Label"', 1))
    with pytest.raises(DpgenError, match="Class"):
        load_dataset("credit", root)
    assert not (root / "cache").exists()


# ---------------------------------------------------------------- cache robustness
def test_corrupt_cache_is_rebuilt(tmp_path):
    root = tmp_path / "data"
    make_idx_dir(root / "mnist")
    (root / "cache").mkdir(parents=True)
    (root / "cache" / "mnist.npz").write_bytes(b"not a zip file")
    ds = load_dataset("mnist", root)
    assert len(ds.train) == 12
    _assert_cached(root, "mnist", root / "mnist", ds)


def test_cache_for_another_dataset_is_ignored(tmp_path):
    root = tmp_path / "data"
    make_idx_dir(root / "mnist", n_train=6)
    make_idx_dir(root / "fashion-mnist", n_train=9)
    load_dataset("mnist", root)
    shutil.copy(root / "cache" / "mnist.npz", root / "cache" / "fmnist.npz")
    ds = load_dataset("fmnist", root)
    assert ds.name == "fmnist" and len(ds.train) == 9


# ---------------------------------------------------------------- torch_utils
def test_to_float_to_uint8_roundtrip():
    x = np.arange(256, dtype=np.uint8).reshape(4, 1, 8, 8)
    f = to_float(x)
    assert f.dtype == torch.float32 and float(f.min()) == 0.0 and float(f.max()) == 1.0
    assert np.array_equal(to_uint8(f), x)
    assert np.array_equal(to_uint8(to_float(torch.from_numpy(x))), x)
    t = torch.tensor([-0.5, 0.0, 0.2, 1.0, 1.7], requires_grad=True)
    out = to_uint8(t)
    assert out.dtype == np.uint8 and out.tolist() == [0, 0, 51, 255, 255]
    with pytest.raises(TypeError):
        to_float(np.zeros(3, dtype=np.float32))
