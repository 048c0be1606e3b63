"""Inception FID (Heusel et al. 2017) and Inception Score (Salimans et al. 2016) with pytorch-fid's
network.

Network: the module tree of ``pytorch_fid.inception.fid_inception_v3`` (torchvision Inception-v3 with
1008 classes and pytorch-fid's ``FIDInception*`` blocks, a port of TF ``inception-2015-12-05``).
``fid_inception_v3()`` itself would download its weights without a timeout, so it is never called: the
architecture is assembled here and the state dict is loaded from a file,

* ``cfg.inception_weights`` if set (never downloaded), else
* ``torch.hub.get_dir()/checkpoints/<basename of pytorch_fid.inception.FID_WEIGHTS_URL>``
  (``pt_inception-2015-12-05-6726825d.pth``, where pytorch-fid's own download puts it). When it is
  missing and ``cfg.inception_download`` is true (the default), it is fetched from pytorch-fid's
  ``FID_WEIGHTS_URL`` with torch.hub's downloader (sha256 prefix checked, atomic rename) and a short
  socket timeout. ``DPGEN_OFFLINE=1`` in the environment forbids any download (the test suite sets it).

If no weights file can be had the metrics are ``None`` with a reason (offline, download failed, ...). A
network is only ever built when a complete state dict is in hand, so the metrics never come from random
weights.

Preprocessing follows pytorch-fid's ``InceptionV3(resize_input=True, normalize_input=True)`` as used by
DPImageBench: uint8 -> [0, 1], grayscale repeated to 3 channels (as DPDM, GS-WGAN and DPImageBench
do), bilinear resize to 299x299, then scaled to [-1, 1].  FID uses the 2048-d pool3 features of all
synthetic samples against up to ``fid_max_real`` images of the real TRAINING split (DPDM, DP-FETA and
DPImageBench compare with train statistics).

Inception Score: exp(E_x KL(p(y|x) || p(y))) with p(y|x) the softmax of the 1008-way ``fc`` logits
(as DPImageBench, which takes the softmax of ``fid_inception_v3().fc``).  ``is_splits`` chunks the
samples and reports mean and std over chunks: 10 splits is Salimans et al.'s original protocol,
1 split (the quick default) is DPImageBench's.
"""
from __future__ import annotations

import logging
import math
import os
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dpgen.eval import cache as _cache
from dpgen.eval.config import EvalConfig
from dpgen.eval.frechet import feature_statistics, frechet_distance_samples

INCEPTION_SIZE = 299


def weights_filename() -> str:
    """File name pytorch-fid uses for its ported TF Inception weights (from ``FID_WEIGHTS_URL``)."""
    from pytorch_fid.inception import FID_WEIGHTS_URL

    return FID_WEIGHTS_URL.rsplit("/", 1)[-1]


def default_weights_path() -> Path:
    """Where ``torch.hub`` (and hence pytorch-fid) caches the weights file."""
    return Path(torch.hub.get_dir()) / "checkpoints" / weights_filename()


DOWNLOAD_TIMEOUT_S = 20.0  # per socket operation: an offline machine fails fast, a slow link still finishes
OFFLINE_ENV = "DPGEN_OFFLINE"


def fetch_weights(timeout: float = DOWNLOAD_TIMEOUT_S) -> tuple[Path | None, str | None]:
    """Download pytorch-fid's weights into the torch hub cache as pytorch-fid would; (path, None) or (None, why).

    ``torch.hub.download_url_to_file`` writes to a temporary file, checks the sha256 prefix in the file name
    (``...-6726825d.pth``) and renames it into place, so an interrupted download leaves nothing behind.
    """
    from pytorch_fid.inception import FID_WEIGHTS_URL

    if os.environ.get(OFFLINE_ENV, "") not in ("", "0"):
        return None, f"no download attempted ({OFFLINE_ENV} is set)"
    dst = default_weights_path()
    logging.getLogger("dpgen").info("eval: downloading the Inception weights %s to %s", FID_WEIGHTS_URL, dst)
    prefix = re.search(r"-([a-f0-9]+)\.", weights_filename())
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout)  # urllib (inside torch.hub) takes no timeout argument
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        torch.hub.download_url_to_file(FID_WEIGHTS_URL, str(dst), hash_prefix=prefix.group(1) if prefix else None,
                                       progress=False)
    except Exception as e:  # noqa: BLE001 - offline, timeout, HTTP error, bad hash: all become a reason
        return None, f"download of {FID_WEIGHTS_URL} failed ({type(e).__name__}: {str(e)[:200]})"
    finally:
        socket.setdefaulttimeout(previous)
    return (dst, None) if dst.is_file() else (None, f"download of {FID_WEIGHTS_URL} left no file at {dst}")


def locate_weights(path: str | Path | None) -> tuple[Path | None, str | None]:
    """(path, None) if the weights file exists locally, else (None, reason).  Never downloads (see :func:`fetch_weights`)."""
    if path is not None:
        p = Path(path).expanduser()
        if p.is_file():
            return p, None
        return None, f"Inception weights file {str(p)!r} (eval.inception_weights) not found; no download attempted"
    p = default_weights_path()
    if p.is_file():
        return p, None
    return None, (
        f"Inception weights not found: put {weights_filename()} (pytorch-fid's FID_WEIGHTS_URL) at {p} "
        "or set eval.inception_weights"
    )


def _fid_inception_architecture() -> nn.Module:
    """The module tree of pytorch-fid's ``fid_inception_v3`` WITHOUT its weight download.

    Parameters are whatever torchvision's constructor leaves; callers must load a state dict before use.
    """
    import torchvision
    from pytorch_fid import inception as pfi

    net = torchvision.models.inception_v3(weights=None, aux_logits=False, num_classes=1008, init_weights=False)
    net.Mixed_5b = pfi.FIDInceptionA(192, pool_features=32)
    net.Mixed_5c = pfi.FIDInceptionA(256, pool_features=64)
    net.Mixed_5d = pfi.FIDInceptionA(288, pool_features=64)
    net.Mixed_6b = pfi.FIDInceptionC(768, channels_7x7=128)
    net.Mixed_6c = pfi.FIDInceptionC(768, channels_7x7=160)
    net.Mixed_6d = pfi.FIDInceptionC(768, channels_7x7=160)
    net.Mixed_6e = pfi.FIDInceptionC(768, channels_7x7=192)
    net.Mixed_7b = pfi.FIDInceptionE_1(1280)
    net.Mixed_7c = pfi.FIDInceptionE_2(2048)
    return net


class FIDInception(nn.Module):
    """Maps uint8 images (N x {1,3} x H x W) to (pool3 features N x 2048, logits N x 1008)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dtype == torch.uint8:
            x = x.to(torch.float32) / 255.0
        if x.shape[1] == 1:
            x = x.repeat(1, 3, 1, 1)
        x = F.interpolate(x, size=(INCEPTION_SIZE, INCEPTION_SIZE), mode="bilinear", align_corners=False)
        x = 2.0 * x - 1.0
        n = self.net
        for layer in (
            n.Conv2d_1a_3x3, n.Conv2d_2a_3x3, n.Conv2d_2b_3x3, n.maxpool1, n.Conv2d_3b_1x1, n.Conv2d_4a_3x3,
            n.maxpool2, n.Mixed_5b, n.Mixed_5c, n.Mixed_5d, n.Mixed_6a, n.Mixed_6b, n.Mixed_6c, n.Mixed_6d,
            n.Mixed_6e, n.Mixed_7a, n.Mixed_7b, n.Mixed_7c, n.avgpool,
        ):
            x = layer(x)
        pool = torch.flatten(x, 1)
        return pool, n.fc(pool)


def load_fid_inception(path: str | Path | None, download: bool = False) -> tuple[FIDInception | None, str | None]:
    """Load the FID Inception from a weights file; (None, reason) if absent or unusable.

    ``download``: fetch the default file (:func:`fetch_weights`) when ``path`` is None and it is missing.
    """
    p, reason = locate_weights(path)
    if p is None and path is None:
        p, why = fetch_weights() if download else (None, "no download attempted (eval.inception_download: false)")
        reason = f"{reason}; {why}"
    if p is None:
        return None, reason
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is reported, not raised
        return None, f"could not read Inception weights {str(p)!r}: {type(e).__name__}: {e}"
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        return None, f"Inception weights {str(p)!r} is not a state dict of tensors"
    net = _fid_inception_architecture()
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as e:
        return None, f"Inception weights {str(p)!r} do not match pytorch-fid's FID Inception: {str(e).splitlines()[0]}"
    for prm in net.parameters():
        prm.requires_grad_(False)
    return FIDInception(net).eval(), None


@torch.no_grad()
def inception_outputs(
    model: FIDInception, x: np.ndarray, device: str | torch.device = "cpu", batch_size: int = 50
) -> tuple[np.ndarray, np.ndarray]:
    """(pool3 features, logits) as float64 arrays for uint8 images ``x``."""
    device = torch.device(device)
    model = model.to(device).eval()
    pools, logits = [], []
    for i in range(0, len(x), batch_size):
        xb = torch.from_numpy(np.ascontiguousarray(x[i : i + batch_size])).to(device)
        p, lg = model(xb)
        pools.append(p.double().cpu())
        logits.append(lg.double().cpu())
    return torch.cat(pools).numpy(), torch.cat(logits).numpy()


def inception_score(logits: np.ndarray, splits: int = 1) -> tuple[float, float]:
    """Salimans et al. 2016: exp(E_x KL(p(y|x) || p(y))) per split; returns (mean, std) over splits."""
    logits = np.asarray(logits, dtype=np.float64)
    logp = logits - logits.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    p = np.exp(logp)
    splits = max(1, min(int(splits), len(p)))
    scores = []
    for part_p, part_logp in zip(np.array_split(p, splits), np.array_split(logp, splits)):
        log_py = np.log(part_p.mean(axis=0) + 1e-300)
        kl = (part_p * (part_logp - log_py)).sum(axis=1).mean()
        scores.append(math.exp(kl))
    return float(np.mean(scores)), float(np.std(scores))


def _subset(x: np.ndarray, n_max: int | None, seed: int) -> np.ndarray:
    if n_max is None or len(x) <= n_max:
        return x
    idx = np.sort(np.random.default_rng(seed).choice(len(x), size=n_max, replace=False))
    return x[idx]


def inception_metrics(
    x_syn: np.ndarray,
    x_real: np.ndarray,
    cfg: EvalConfig,
    device: str | torch.device = "cpu",
    seed: int = 0,
    dataset_name: str = "",
    real_fingerprint: str | None = None,
    cache_dir: str | Path | None = None,
    log: Callable[[str], None] = lambda s: None,
) -> dict:
    """FID of ``x_syn`` against ``x_real`` (real training split) and IS of ``x_syn``.

    Returns ``{"fid", "is", "is_std", ...}`` with ``None`` plus ``fid_reason``/``is_reason`` where a
    metric cannot be computed (disabled, no local weights, unsupported channel count).
    Real-split statistics are cached in ``cache_dir`` when ``real_fingerprint`` is given.
    """
    want_fid, want_is = cfg.fid, cfg.inception_score
    out: dict = {"fid": None, "is": None, "is_std": None}
    if not want_fid:
        out["fid_reason"] = "disabled (eval.fid: false)"
    if not want_is:
        out["is_reason"] = "disabled (eval.inception_score: false)"
    if not (want_fid or want_is):
        return out

    def fail(reason: str) -> dict:
        if want_fid:
            out["fid_reason"] = reason
        if want_is:
            out["is_reason"] = reason
        return out

    if x_syn.ndim != 4 or x_syn.shape[1] not in (1, 3) or x_syn.dtype != np.uint8:
        return fail(f"Inception metrics need uint8 N x {{1,3}} x H x W images, got {x_syn.dtype} {tuple(x_syn.shape)}")
    if len(x_syn) < 2 or len(x_real) < 2:
        return fail("Inception metrics need at least 2 synthetic and 2 real images")
    model, reason = load_fid_inception(cfg.inception_weights, download=cfg.inception_download)
    if model is None:
        return fail(str(reason))
    weights_path, _ = locate_weights(cfg.inception_weights)
    t0 = time.perf_counter()
    xs = _subset(x_syn, cfg.fid_max_syn, seed + 1)
    log(f"eval: Inception features of {len(xs)} synthetic images")
    syn_pool, syn_logits = inception_outputs(model, xs, device, cfg.inception_batch_size)
    if want_is:
        out["is"], out["is_std"] = inception_score(syn_logits, cfg.is_splits)
        out["is_splits"] = int(min(cfg.is_splits, len(xs)))
    if want_fid:
        stats = None
        path = None
        if cache_dir is not None and real_fingerprint is not None:
            key = _cache.cache_key({
                "what": "inception_real_stats", "dataset": dataset_name, "data": real_fingerprint,
                "fid_max_real": cfg.fid_max_real, "seed": seed, "weights": weights_path.name,
                "weights_size": weights_path.stat().st_size,
            })
            path = _cache.cache_path(cache_dir, f"{dataset_name}-inception-real", key, ".npz")
            stats = _cache.load_arrays(path)
        if stats is None:
            xr = _subset(x_real, cfg.fid_max_real, seed)
            log(f"eval: Inception features of {len(xr)} real training images")
            real_pool, _ = inception_outputs(model, xr, device, cfg.inception_batch_size)
            mu, sigma = feature_statistics(real_pool)
            stats = {"mu": mu, "sigma": sigma, "n": np.array(len(xr))}
            if path is not None:
                _cache.save_arrays(path, **stats)
        out["fid"], out["fid_method"] = frechet_distance_samples(syn_pool, stats["mu"], stats["sigma"])
        out["fid_num_real"] = int(stats["n"])
        out["fid_num_syn"] = int(len(xs))
    out["inception_seconds"] = round(time.perf_counter() - t0, 3)
    return out
