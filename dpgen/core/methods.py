"""Method lookup. A method is a subpackage ``dpgen.<name>`` plus ``configs/method/<name>.yaml``.

The subpackage exposes one function::

    train(hp: DictConfig, data: ImageDataset, ledger: PrivacyLedger, run: Run) -> ReleasedGenerator

It may touch ``data.train`` only through mechanisms recorded in ``ledger``; ``run`` gives it
the device, seeded RNG, progress/logging and checkpoints. Everything else (outputs, privacy
report, evaluation) is the pipeline's job.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from dpgen.errors import DpgenError

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def available(group: str) -> list[str]:
    """Names of the options in a config group (``method``, ``dataset``, ``eval``, ...)."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def load_method(module: str) -> ModuleType:
    mod = importlib.import_module(module)
    if not callable(getattr(mod, "train", None)):
        raise DpgenError(f"method module {module} has no train(hp, data, ledger, run) function")
    return mod
