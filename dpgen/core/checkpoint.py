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


def load_checkpoint(path: str | os.PathLike) -> dict:
    """Load a checkpoint written by :func:`atomic_save`; any damage becomes a one-line DpgenError."""
    path = Path(path)
    if not path.is_file():
        raise DpgenError(f"no checkpoint at {path}: resume=<run dir> needs <run dir>/checkpoints/last.pt")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(ckpt, dict) or "step" not in ckpt or "ledger" not in ckpt:
            raise ValueError("missing step/ledger")
    except Exception as exc:  # noqa: BLE001
        raise DpgenError(f"checkpoint {path} is corrupt or unreadable ({type(exc).__name__}); nothing was changed") from None
    return ckpt
