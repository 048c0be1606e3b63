"""Atomic writes and resumable training state (model/optimizer states, RNG states, ledger)."""
from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

from dpgen.errors import DpgenError



def rng_state() -> dict:
    """All RNG states as plain types (checkpoints are loaded with ``weights_only=True``)."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"key": np_state[0], "pos": int(np_state[2]), "keys": np_state[1].tolist(),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(tuple(state["python"]) if not isinstance(state["python"], tuple) else state["python"])
    s = state["numpy"]
    np.random.set_state((s["key"], np.array(s["keys"], dtype=np.uint32), s["pos"], s["has_gauss"], s["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


#: fingerprint keys (dpgen.core.pipeline.fingerprint) added after checkpoints were written, with the value that
#: describes a checkpoint (or a saved config) without them
LATER_FINGERPRINT_KEYS: dict = {"precision": "fp32"}   # issue 24: earlier runs trained in torch's default precision


def fingerprint_diff(stored: dict, current: dict) -> str | None:
    """The first differing fingerprint settings as "key: old -> new" (None when they agree); a key that a
    fingerprint predates counts with its :data:`LATER_FINGERPRINT_KEYS` value, and hyperparameters saved under a
    block that has since moved as the new block's (:func:`dpgen.core.schema.saved_fingerprint`)."""
    from dpgen.core.schema import saved_fingerprint

    stored, current = {**LATER_FINGERPRINT_KEYS, **saved_fingerprint(stored)}, {**LATER_FINGERPRINT_KEYS, **current}
    stored = _with_later_hparams(stored)
    diff = sorted(k for k in set(stored) | set(current) if stored.get(k) != current.get(k))
    return ", ".join(f"{k}: {stored.get(k)!r} -> {current.get(k)!r}" for k in diff[:3]) if diff else None


def _with_later_hparams(stored: dict) -> dict:
    """A fingerprint whose ``hparams`` predate keys of its method's block (:data:`dpgen.core.schema.LATER_KEYS`):
    those keys with the values that describe such a run, as its saved config reads."""
    from dpgen.core.methods import method_info
    from dpgen.core.schema import LATER_KEYS

    hparams = stored.get("hparams")
    try:
        block = method_info(str(stored.get("method"))).hparams
    except Exception:  # noqa: BLE001 - an unknown method: compared as stored (and refused elsewhere)
        return stored
    if not isinstance(hparams, dict):
        return stored
    filled = dict(hparams)
    for key, value in LATER_KEYS.items():
        parent, _, leaf = key.rpartition(".")
        if parent == block and leaf not in filled:
            filled[leaf] = value
    return {**stored, "hparams": filled}


def load_checkpoint(path: str | os.PathLike) -> dict:
    """Load a checkpoint written by :func:`atomic_save`; any damage becomes a one-line DpgenError.

    A checkpoint may come from elsewhere (a shared run directory), so besides ``weights_only=True`` (no pickled
    code) its structure is checked before anything uses it: the step, RNG states and generator states have
    the types and sizes dpgen writes, and the method state holds only plain values and dense tensors
    (:func:`dpgen.core.untrusted.check_plain`; shapes are checked where a method loads them into a module,
    e.g. with :func:`restore_module`). The ledger is checked by ``PrivacyLedger.load_state_dict``.
    """
    path = Path(path)
    if not path.is_file():
        raise DpgenError(f"no checkpoint at {path}: resume=<run dir> needs <run dir>/checkpoints/last.pt")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001
        raise DpgenError(f"checkpoint {path} is corrupt or unreadable ({type(exc).__name__}); nothing was changed") from None
    try:
        check_checkpoint(ckpt)
    except DpgenError as exc:
        raise DpgenError(f"checkpoint {path} is corrupt or unreadable ({exc}); nothing was changed") from None
    return ckpt


_CKPT_KEYS = {"step", "state", "streams", "ledger", "rng", "fingerprint"}
_MAX_STREAMS = 256


def check_checkpoint(ckpt: object) -> None:
    """The structure :meth:`dpgen.core.run.Run.save_checkpoint` writes (see :func:`load_checkpoint`)."""
    from dpgen.core.untrusted import check_plain

    if isinstance(ckpt, dict) and "generators" in ckpt and "streams" not in ckpt:
        raise DpgenError("it predates secret randomness (its noise streams were seeded from the public seed, so "
                         "the run it continues has no DP guarantee); start a new run")
    if not isinstance(ckpt, dict) or set(ckpt) != _CKPT_KEYS:
        keys = sorted(map(str, ckpt)) if isinstance(ckpt, dict) else type(ckpt).__name__
        raise DpgenError(f"expected keys {sorted(_CKPT_KEYS)}, got {keys}")
    step = ckpt["step"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise DpgenError(f"step must be a non-negative integer, got {type(step).__name__}")
    if not isinstance(ckpt["ledger"], dict) or not isinstance(ckpt["fingerprint"], dict):
        raise DpgenError("ledger and fingerprint must be dicts")
    check_plain(ckpt["fingerprint"], "fingerprint")
    check_plain(ckpt["state"], "state", tensors=True, max_depth=16)
    _check_streams(ckpt["streams"])
    _check_rng(ckpt["rng"])


def _check_streams(state: object) -> None:
    """The structure :meth:`dpgen.core.streams.RandomStreams.state_dict` writes."""
    from dpgen.core.streams import NAME_PATTERN, ROOT_PATTERN

    if not isinstance(state, dict) or set(state) != {"root", "public", "secret"}:
        raise DpgenError("streams must hold root, public and secret")
    if not isinstance(state["root"], str) or not ROOT_PATTERN.fullmatch(state["root"]):
        raise DpgenError("streams.root is not a secret root (64 hex digits)")
    for kind in ("public", "secret"):
        d = state[kind]
        if not isinstance(d, dict) or len(d) > _MAX_STREAMS or not all(
                isinstance(k, str) and NAME_PATTERN.fullmatch(k) and _is_rng_tensor(v) for k, v in d.items()):
            raise DpgenError(f"streams.{kind} must map stream names to uint8 generator states")


def _is_rng_tensor(t: object, size: int | None = None) -> bool:
    return (isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1 and t.layout == torch.strided
            and (t.numel() <= 2**16 if size is None else t.numel() == size))


def _check_rng(rng: object) -> None:
    """The states :func:`rng_state` writes, so that :func:`set_rng_state` cannot fail half-way."""
    def ints(v, n, hi):
        return isinstance(v, (list, tuple)) and len(v) == n and all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= hi for x in v)

    if not isinstance(rng, dict) or not {"python", "numpy", "torch"} <= set(rng) <= {"python", "numpy", "torch", "cuda"}:
        raise DpgenError("rng must hold the python, numpy and torch states")
    py = rng["python"]
    if not (isinstance(py, (list, tuple)) and len(py) == 3 and py[0] == 3 and ints(py[1], 625, 2**32)
            and (py[2] is None or isinstance(py[2], float))):
        raise DpgenError("rng.python is not a Mersenne Twister state")
    npy = rng["numpy"]
    if not (isinstance(npy, dict) and set(npy) == {"key", "pos", "keys", "has_gauss", "cached_gaussian"}
            and npy["key"] == "MT19937" and ints(npy["keys"], 624, 2**32 - 1) and ints([npy["pos"]], 1, 624)
            and npy["has_gauss"] in (0, 1) and isinstance(npy["cached_gaussian"], float)):
        raise DpgenError("rng.numpy is not a Mersenne Twister state")
    if not _is_rng_tensor(rng["torch"], torch.get_rng_state().numel()):
        raise DpgenError("rng.torch is not a CPU generator state")
    cuda = rng.get("cuda", [])
    if not isinstance(cuda, (list, tuple)) or len(cuda) > 64 or not all(_is_rng_tensor(t) for t in cuda):
        raise DpgenError("rng.cuda is not a list of CUDA generator states")


def restore_module(module: torch.nn.Module, state: object, what: str) -> None:
    """``module.load_state_dict(state)`` after checking names, shapes and dtypes (a one-line DpgenError
    naming ``what`` otherwise): for methods restoring networks from an untrusted checkpoint."""
    from dpgen.core.untrusted import check_state_dict

    check_state_dict(module, state, what)
    module.load_state_dict(state)
