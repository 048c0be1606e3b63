"""``dataset=folder``: the user's own images in the ImageFolder layout (dpgen/data/folder.py, docs/own-data.md).

The fixture is a small folder of Fashion-MNIST images written as PNGs (scikit-learn's digits where Fashion-MNIST is
not installed): 10 classes x 20 training and 4 test images.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import run_script
from fixtures_data import COLOURS, files_under, make_image_folder
from inprocess import call, files_in, one_error
from dpgen.data import dataset_options, load_dataset
from dpgen.data.folder import FolderPlan, held_out, plan
from dpgen.errors import DpgenError
from dpgen.privacy import delta_below

GREY28 = {"resolution": 28, "channels": 1, "test_fraction": 0.1}


@pytest.fixture(scope="module")
def fm(tmp_path_factory) -> tuple[Path, dict]:
    """The F-MNIST PNG folder with train/ and test/ (read-only: tests that change it work on a copy)."""
    root = tmp_path_factory.mktemp("fm") / "images"
    return root, make_image_folder(root)


def _load(path: Path, data_root: Path, **opts):
    return load_dataset("folder", data_root, options={**GREY28, "path": str(path), **opts})


# ---------------------------------------------------------------- layouts, labels, pixels
def test_train_test_folders_are_read_as_given(fm, tmp_path):
    root, info = fm
    ds = _load(root, tmp_path / "data")
    assert ds.name == "folder" and ds.classes == info["sorted"] and ds.shape == (1, 28, 28)
    assert (len(ds.train), len(ds.test)) == (200, 40)
    assert ds.train.x.dtype == np.uint8 and ds.train.y.dtype == np.int64
    # label i is the i-th sorted class folder (ImageFolder), and 28 px images pass unchanged
    arr = info["arrays"]
    for part, split in (("train", ds.train), ("test", ds.test)):
        want = {(info["sorted"].index(info["names"][int(y)]), img.tobytes())
                for img, y in zip(arr[f"{part}_x"], arr[f"{part}_y"])}
        got = {(int(y), img[0].tobytes()) for img, y in zip(split.x, split.y)}
        assert got == want
    assert np.array_equal(np.bincount(ds.test.y), np.full(10, 4))


def _colour_folder(root: Path) -> None:
    """Two classes (train/ and test/), images of several sizes and modes; each a flat colour: red, blue."""
    specs = [("red", COLOURS[0], [((40, 30), "RGB", "jpg"), ((50, 50), "RGBA", "png"), ((17, 64), "P", "png"),
                                  ((33, 33), "RGB", "bmp")]),
             ("blue", COLOURS[2], [((64, 48), "RGB", "png"), ((20, 20), "RGB", "webp"), ((90, 60), "RGB", "tiff"),
                                   ((31, 29), "RGBA", "png")])]
    for cls, colour, files in specs:
        for i, (size, mode, ext) in enumerate(files):
            im = Image.new("RGB", size, colour)
            im = im.convert("P") if mode == "P" else im.convert(mode)
            d = root / ("train" if i < 2 else "test") / cls
            d.mkdir(parents=True, exist_ok=True)
            im.save(d / f"{i}.{ext}")
            (d / f"notes{i}.txt").write_text("not an image: skipped")
    (root / "train" / "red" / ".hidden.png").write_bytes(b"hidden files are skipped")


@pytest.mark.parametrize("channels", [3, 1])
def test_any_size_and_mode_is_cropped_and_resized(tmp_path, channels):
    _colour_folder(tmp_path / "img")
    ds = load_dataset("folder", tmp_path / "data", options={"path": str(tmp_path / "img"), "resolution": 32,
                                                            "channels": channels, "test_fraction": 0.1})
    assert ds.classes == ["blue", "red"] and ds.shape == (channels, 32, 32)
    x = np.concatenate([ds.train.x, ds.test.x]).astype(float)
    y = np.concatenate([ds.train.y, ds.test.y])
    assert len(y) == 8 and np.array_equal(np.bincount(y), [4, 4])
    if channels == 3:  # the class colour survives: RGB order kept, labels aligned
        means = x.mean(axis=(2, 3))
        assert np.abs(means[y == 0] - COLOURS[2]).max() < 3 and np.abs(means[y == 1] - COLOURS[0]).max() < 3
    else:  # ITU-R 601-2 luma of pure blue / red
        means = x.mean(axis=(1, 2, 3))
        assert np.abs(means[y == 0] - 29).max() < 3 and np.abs(means[y == 1] - 76).max() < 3


# ---------------------------------------------------------------- the public split
def _flat_folder(root: Path, n: int = 30) -> None:
    """Three classes of n distinct 28x28 grey images (pixels (0, 0) and (0, 1) encode the file)."""
    for c in range(3):
        for i in range(n):
            img = np.zeros((28, 28), np.uint8)
            img[0, 0], img[0, 1] = c * 80, i
            (root / f"c{c}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(img, mode="L").save(root / f"c{c}" / f"{i:03d}.png")


def _ids(split) -> set[tuple[int, int]]:
    """(class, file) of every image (28 px images pass the loader unchanged)."""
    return {(int(y), int(img[0, 0, 1])) for img, y in zip(split.x, split.y)}


def test_without_a_test_folder_a_public_hash_split_holds_images_out(tmp_path):
    root = tmp_path / "img"
    _flat_folder(root)
    p = plan({**GREY28, "path": str(root), "test_fraction": 0.3})
    expected_test = {(c, i) for c in range(3) for i in range(30) if held_out(f"c{c}/{i:03d}.png", 0.3)}
    got_test = {(y, int(path.stem)) for path, y in p.test}
    assert got_test == expected_test and 10 < len(got_test) < 45
    got_train = {(y, int(path.stem)) for path, y in p.train}
    assert not got_train & got_test and len(got_train | got_test) == 90  # the held-out part never reaches training
    assert "SHA-256" in p.split and "test_fraction=0.3" in p.split
    # no seed: the same split every time; one more file moves no other file between the splits
    assert plan({**GREY28, "path": str(root), "test_fraction": 0.3}).test == p.test
    Image.fromarray(np.zeros((8, 8), np.uint8), mode="L").save(root / "c1" / "extra.png")
    again = plan({**GREY28, "path": str(root), "test_fraction": 0.3})
    assert {t for t in again.test if t[0].name != "extra.png"} == set(p.test)
    assert {t for t in again.train if t[0].name != "extra.png"} == set(p.train)


def test_a_train_folder_without_test_is_split_the_same_way(tmp_path):
    flat, nested = tmp_path / "flat", tmp_path / "nested"
    _flat_folder(flat)
    shutil.copytree(flat, nested / "train")
    a = _load(flat, tmp_path / "d1", test_fraction=0.3)
    b = _load(nested, tmp_path / "d2", test_fraction=0.3)
    assert _ids(a.train) == _ids(b.train) and _ids(a.test) == _ids(b.test)
    assert not _ids(a.train) & _ids(a.test)


def test_held_out_is_a_fixed_function_of_the_path():
    assert held_out("a/b.png", 0.5) == held_out("a/b.png", 0.5)
    share = np.mean([held_out(f"cls/{i}.png", 0.1) for i in range(20000)])
    assert abs(share - 0.1) < 0.01


# ---------------------------------------------------------------- δ and the cache
def test_delta_defaults_below_one_over_n(fm):
    from tiny import compose_cfg

    root, _ = fm
    cfg = compose_cfg("dpgan", "dataset.channels=1", f"dataset.path={root}", dataset="folder")
    n = plan(dataset_options(cfg.dataset)).n_train
    assert n == 200 and float(cfg.delta) == delta_below(200) == 1e-3 < 1 / n
    assert cfg.dataset.resolution == 32  # dpgan's resolution; dpaf's is 64
    assert compose_cfg("dpaf", f"dataset.path={root}", dataset="folder").dataset.resolution == 64
    assert float(compose_cfg("dpgan", f"dataset.path={root}", "delta=1e-6", dataset="folder").delta) == 1e-6


def test_the_cache_is_atomic_and_names_the_folder_and_its_settings(fm, tmp_path, monkeypatch):
    root, _ = fm
    src = tmp_path / "img"
    shutil.copytree(root, src)
    data = tmp_path / "data"
    first = _load(src, data)
    cached = sorted((data / "cache").iterdir())
    assert len(cached) == 1 and cached[0].name.startswith("folder-") and cached[0].suffix == ".npz"
    assert not list((data / "cache").glob(".*"))  # no temp file left
    # read back from the cache, without decoding a single image
    monkeypatch.setattr(FolderPlan, "load", lambda self: pytest.fail("decoded although cached"))
    again = _load(src, data)
    assert np.array_equal(again.train.x, first.train.x) and np.array_equal(again.test.y, first.test.y)
    assert again.classes == first.classes and again.meta == first.meta
    monkeypatch.undo()
    # another setting, or a changed folder, is another cache file: never an old cache's images
    _load(src, data, resolution=32)
    victim = next((src / "train").rglob("*.png"))
    Image.fromarray(np.full((28, 28), 255, np.uint8), mode="L").save(victim)
    changed = _load(src, data)
    assert len(list((data / "cache").iterdir())) == 3
    assert (changed.train.x == 255).all(axis=(1, 2, 3)).sum() == 1


# ---------------------------------------------------------------- bad input: one line, exit 2, nothing written
def _bad_cases(root: Path) -> dict:
    def one_class():
        for d in (root / "train").iterdir():
            if d.name != "Bag":
                shutil.rmtree(d)
        shutil.rmtree(root / "test")

    def corrupt():
        next((root / "train" / "Coat").glob("*.png")).write_bytes(b"\x89PNG\r\n\x1a\n not really a png")

    def unreadable():
        path = next((root / "train" / "Coat").glob("*.png"))
        path.write_bytes(path.read_bytes()[:60])  # truncated

    def empty_class():
        (root / "train" / "Sock").mkdir()
        (root / "train" / "Sock" / "readme.txt").write_text("no image here")
        (root / "test" / "Sock").mkdir()

    def test_classes_differ():
        shutil.rmtree(root / "test" / "Bag")
        (root / "test" / "Hat").mkdir()
        shutil.copy(next((root / "test" / "Coat").glob("*.png")), root / "test" / "Hat" / "x.png")

    def test_without_train():
        (root / "train").rename(root / "training")

    return {
        "missing folder": (lambda: shutil.rmtree(root), "is missing"),
        "a file, not a folder": (lambda: (shutil.rmtree(root), root.write_text("x")), "is a file"),
        "one class": (one_class, "one class folder (Bag)"),
        "corrupt image": (corrupt, "cannot decode image"),
        "truncated image": (unreadable, "cannot decode image"),
        "empty class": (empty_class, "Sock"),
        "test classes differ": (test_classes_differ, "only in train/: Bag; only in test/: Hat"),
        "test without train": (test_without_train, "no train/ folder"),
    }


@pytest.mark.parametrize("case", list(_bad_cases(Path("."))))
def test_bad_folders_are_refused_before_anything_is_written(fm, tmp_path, monkeypatch, capsys, case):
    root = tmp_path / "images"
    shutil.copytree(fm[0], root)
    make, expected = _bad_cases(root)[case]
    make()
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    before = files_in(tmp_path)
    code, _, err = call(capsys, "train", "method=dpgan", "dataset=folder", f"dataset.path={root}", "dataset.channels=1",
                        f"data_root={tmp_path / 'data'}", "dpgan.batch_size=16")
    line = one_error(code, err)
    assert expected in line, line
    assert files_in(tmp_path) == before  # no run directory, no cache (and no half-written one)


def test_missing_path_and_options_of_other_datasets(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = call(capsys, "train", "dataset=folder")
    assert "dataset=folder needs dataset.path=" in one_error(code, err)
    code, _, err = call(capsys, "train", "dataset=digits", "dataset.path=/tmp")
    assert "dataset.path='/tmp' is invalid; expected null: dataset=digits does not read it" in one_error(code, err)
    (tmp_path / "img").mkdir()
    for arg, want in (("dataset.resolution=48", "dataset.resolution=48 is invalid; expected one of 28, 32, 64, 128"),
                      ("dataset.channels=4", "dataset.channels=4 is invalid"),
                      ("dataset.test_fraction=1.5", "dataset.test_fraction=1.5 is invalid")):
        code, _, err = call(capsys, "train", "dataset=folder", "dataset.path=img", arg)
        assert want in one_error(code, err)
    assert files_under(tmp_path) == {"img"}


def test_a_folder_whose_split_leaves_a_class_without_training_images(tmp_path):
    root = tmp_path / "img"
    _flat_folder(root, n=2)
    with pytest.raises(DpgenError, match="no training image"):
        plan({**GREY28, "path": str(root), "test_fraction": 0.99})
    with pytest.raises(DpgenError, match="falls in the held-out split"):
        plan({**GREY28, "path": str(root), "test_fraction": 1e-9})


# ---------------------------------------------------------------- training on the folder: dpgan and feta quick
QUICK_TINY = {
    "dpgan": ["dpgan.iters=8", "dpgan.batch_size=64", "dpgan.g_width=8", "dpgan.d_width=8"],
    "feta": ["feta.iters=2", "feta.batch_size=32", "feta.central_batch=100", "feta.num_central=10",
             "feta.warmup_iters=2", "feta.multiplicity=2", "feta.micro_batch=16", "feta.unet.nf=4",
             "feta.sampler.steps=2"],
}


@pytest.mark.parametrize("method", ["dpgan", "feta"])
def test_quick_profile_trains_on_the_folder_and_releases_a_generator(fm, tmp_path, capsys, method):
    root, info = fm
    res = run_script("train.py", f"method={method}", "profile=quick", "dataset=folder", f"dataset.path={root}",
                     "dataset.channels=1", "threads=1", "progress=false", "tensorboard=false", "samples_per_class=2",
                     "eval.num_samples=100", "eval.epochs=1", "eval.fid=false", "eval.classifiers=[cnn]",
                     "eval.r2g=false", "eval.real_baseline=false", "eval.cnn_fid=false",
                     *QUICK_TINY[method], f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    run = tmp_path / "run"
    assert (run / "generator.pt").is_file() and (run / "samples.png").is_file()
    privacy = json.loads((run / "privacy.json").read_text())
    assert privacy["delta"] == 1e-3 and 0 < privacy["epsilon"] <= 10 and privacy["valid_dp_guarantee"] is True
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["dataset"] == "folder" and metrics["num_synthetic"] == 100
    from dpgen.core.config import register_configs
    from dpgen.core.schema import load_run_config

    register_configs()
    saved = load_run_config(run)  # what scripts/evaluate.py reads back: δ listed again from the same folder
    assert saved.dataset.path == str(root) and float(saved.delta) == 1e-3 and saved.dataset.resolution == 32
    out = tmp_path / "s.npz"
    code, _, err = call(capsys, "sample", f"run={run}", "n=20", f"out={out}")
    assert code == 0, err
    with np.load(out) as z:
        assert z["x"].shape == (20, 1, 32, 32) and z["x"].dtype == np.uint8 and set(z["y"].tolist()) == set(range(10))
