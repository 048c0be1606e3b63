"""Inception FID / IS plumbing (pytorch-fid network, Heusel et al. 2017; Salimans et al. 2016).

No test here has the real Inception weights.  The production path never builds a network unless a
complete weights file is on disk; two tests below write a state dict of RANDOM weights to a temporary
file purely to exercise the loading and feature code path -- the numbers they produce are meaningless
as image-quality metrics and are only checked for internal consistency (FID of a set with itself ~ 0,
same features as pytorch-fid's own InceptionV3).
"""
from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from dpgen.data.base import ImageDataset, Split
from dpgen.eval import evaluate
from dpgen.eval import inception as inc
from dpgen.eval.config import EvalConfig


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """Fail loudly on any download attempt; point the torch hub cache at an empty folder."""
    attempts: list[str] = []

    def refuse(*args, **kwargs):
        attempts.append(repr(args[:1]))
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", refuse)
    import pytorch_fid.inception as pfi

    monkeypatch.setattr(pfi, "load_state_dict_from_url", refuse)
    hub = tmp_path / "hub"
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(hub))
    return attempts


def _tiny_images(n: int, channels: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, channels, 20, 20), dtype=np.uint8)


def test_weights_filename_comes_from_pytorch_fid() -> None:
    from pytorch_fid.inception import FID_WEIGHTS_URL

    assert inc.weights_filename() == "pt_inception-2015-12-05-6726825d.pth"
    assert FID_WEIGHTS_URL.endswith(inc.weights_filename())


def test_missing_weights_give_null_with_reason_and_no_network(no_network, monkeypatch) -> None:
    built = []
    monkeypatch.setattr(inc, "_fid_inception_architecture", lambda: built.append(1))
    x = _tiny_images(8, 1)
    data = ImageDataset("tiny", Split(x, np.zeros(8, np.int64)), Split(x, np.zeros(8, np.int64)), ["a", "b"])
    cfg = dict(classifiers=[], r2g=False, real_baseline=False, cnn_fid=False, fid=True, inception_score=True)
    res = evaluate(x, np.zeros(8, np.int64), data, cfg)
    assert res["fid"] is None and res["is"] is None
    assert "not found" in res["fid_reason"] and inc.weights_filename() in res["fid_reason"]
    assert "no download" in res["is_reason"]
    assert built == [] and no_network == []  # no network constructed, nothing fetched

    res = inc.inception_metrics(x, x, EvalConfig(inception_weights="/nonexistent/w.pth"))
    assert res["fid"] is None and "/nonexistent/w.pth" in res["fid_reason"]
    assert built == [] and no_network == []


def test_disabled_and_unsupported_inputs_have_reasons(no_network) -> None:
    res = inc.inception_metrics(_tiny_images(4, 1), _tiny_images(4, 1), EvalConfig(fid=False, inception_score=False))
    assert res["fid"] is None and "disabled" in res["fid_reason"] and "disabled" in res["is_reason"]
    res = inc.inception_metrics(_tiny_images(4, 2), _tiny_images(4, 2), EvalConfig())
    assert res["fid"] is None and "uint8 N x {1,3}" in res["fid_reason"]


def test_corrupt_weights_file_gives_reason(no_network, tmp_path) -> None:
    bad = tmp_path / "w.pth"
    torch.save({"not": torch.zeros(1)}, bad)
    model, reason = inc.load_fid_inception(bad)
    assert model is None and "do not match" in reason
    bad.write_bytes(b"garbage")
    model, reason = inc.load_fid_inception(bad)
    assert model is None and "could not read" in reason


def test_inception_score_closed_form() -> None:
    # Each sample certain of a distinct class among k: IS = k; identical predictions: IS = 1.
    k = 4
    logits = np.full((k, 1008), -1e4)
    logits[np.arange(k), np.arange(k)] = 0.0
    assert inc.inception_score(logits, 1)[0] == pytest.approx(k)
    assert inc.inception_score(np.zeros((6, 1008)), 1)[0] == pytest.approx(1.0)
    mean, std = inc.inception_score(np.tile(logits, (2, 1)), 2)
    assert mean == pytest.approx(k) and std == pytest.approx(0.0)


@pytest.fixture(scope="module")
def random_weights_file(tmp_path_factory) -> Path:
    """RANDOM weights, written only to test the plumbing; never used by the production path."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("weights") / "random-weights-for-plumbing-test.pth"
    torch.save(inc._fid_inception_architecture().state_dict(), path)
    return path


def test_plumbing_with_random_weights_fid_of_set_with_itself_is_zero(no_network, random_weights_file, tmp_path) -> None:
    x = _tiny_images(3, 1, seed=1)
    cfg = EvalConfig(inception_weights=str(random_weights_file), is_splits=1)
    res = inc.inception_metrics(x, x, cfg, dataset_name="tiny", real_fingerprint="fp", cache_dir=tmp_path)
    assert no_network == []
    assert res["fid_num_real"] == 3 and res["fid_num_syn"] == 3 and res["fid_method"] == "low_rank"
    assert abs(res["fid"]) < 1e-3
    assert res["is"] >= 1.0 - 1e-9 and np.isfinite(res["is"])
    assert len(list(tmp_path.glob("tiny-inception-real-*.npz"))) == 1  # real statistics cached


def test_features_match_pytorch_fid_inceptionv3(no_network, random_weights_file, monkeypatch) -> None:
    """Our forward pass equals pytorch-fid's InceptionV3 (block 3) given the same (random) state dict."""
    import pytorch_fid.inception as pfi

    state = torch.load(random_weights_file, weights_only=True)
    monkeypatch.setattr(pfi, "load_state_dict_from_url", lambda *a, **k: state)
    reference = pfi.InceptionV3([pfi.InceptionV3.BLOCK_INDEX_BY_DIM[2048]]).eval()
    ours, reason = inc.load_fid_inception(random_weights_file)
    assert reason is None
    x = _tiny_images(3, 3, seed=2)
    with torch.no_grad():
        ref = reference(torch.from_numpy(x).float() / 255.0)[0].flatten(1)
        pool, logits = ours(torch.from_numpy(x))
    assert logits.shape == (3, 1008)
    torch.testing.assert_close(pool, ref, rtol=1e-4, atol=1e-5)


# ---- eval.inception_download: fetch the weights the way pytorch-fid does (the network itself is mocked) ----
@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty torch hub cache, downloads allowed by the environment, and no socket may connect."""

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.delenv(inc.OFFLINE_ENV, raising=False)
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    return tmp_path / "hub" / "checkpoints" / inc.weights_filename()


def test_missing_weights_are_downloaded_into_the_hub_cache(hub, random_weights_file, monkeypatch) -> None:
    import shutil

    from pytorch_fid.inception import FID_WEIGHTS_URL

    calls = []

    def download(url, dst, hash_prefix=None, progress=True):
        calls.append((url, dst, hash_prefix, socket.getdefaulttimeout()))
        shutil.copy(random_weights_file, dst)  # stands in for the real file

    monkeypatch.setattr(torch.hub, "download_url_to_file", download)
    x = _tiny_images(3, 1, seed=1)
    res = inc.inception_metrics(x, x, EvalConfig(is_splits=1))
    assert calls == [(FID_WEIGHTS_URL, str(hub), "6726825d", inc.DOWNLOAD_TIMEOUT_S)]  # pytorch-fid's URL and file
    assert socket.getdefaulttimeout() is None  # the short timeout is put back
    assert abs(res["fid"]) < 1e-3 and "fid_reason" not in res and hub.is_file()
    inc.inception_metrics(x, x, EvalConfig(is_splits=1))
    assert len(calls) == 1  # present now: not fetched again


def test_offline_download_gives_null_with_the_reason(hub, monkeypatch) -> None:
    import urllib.error

    def offline(url, dst, hash_prefix=None, progress=True):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    built = []
    monkeypatch.setattr(inc, "_fid_inception_architecture", lambda: built.append(1))
    res = inc.inception_metrics(_tiny_images(4, 1), _tiny_images(4, 1), EvalConfig())
    assert res["fid"] is None and res["is"] is None and built == [] and not hub.exists()
    for key in ("fid_reason", "is_reason"):
        assert "not found" in res[key] and "download of https://" in res[key] and "name resolution" in res[key]


def test_no_download_when_off_offline_or_given_a_path(hub, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("download attempted")

    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse)
    x = _tiny_images(4, 1)
    res = inc.inception_metrics(x, x, EvalConfig(inception_download=False))
    assert res["fid"] is None and "no download attempted (eval.inception_download: false)" in res["fid_reason"]
    res = inc.inception_metrics(x, x, EvalConfig(inception_weights="/nonexistent/w.pth"))
    assert res["fid"] is None and "/nonexistent/w.pth" in res["fid_reason"]
    monkeypatch.setenv(inc.OFFLINE_ENV, "1")
    res = inc.inception_metrics(x, x, EvalConfig())
    assert res["fid"] is None and f"no download attempted ({inc.OFFLINE_ENV} is set)" in res["fid_reason"]


def test_inception_download_key_defaults_to_true_and_is_checked() -> None:
    from dpgen.errors import DpgenError
    from dpgen.eval.config import resolve_config

    assert resolve_config({}).inception_download is True  # absent from an older eval config: on
    assert resolve_config({"inception_download": False}).inception_download is False
    with pytest.raises(DpgenError, match="inception_download"):
        resolve_config({"inception_download": "sometimes"})
