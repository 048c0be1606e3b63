"""The evaluation settings (``configs/eval/*.yaml``), checked once, with defaults.

The defaults follow DPDM's downstream-classifier protocol (``train_downstream_classifiers.py``:
Adam lr 3e-4, batch 128, inputs in [-1, 1], best epoch chosen on a *synthetic* validation set),
shortened to 10 epochs so that the quick profile runs on a CPU.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpgen.errors import DpgenError

CLASSIFIER_KINDS = ("cnn", "mlp")


@dataclass(frozen=True)
class EvalConfig:
    """Validated evaluation settings; see ``configs/eval/default.yaml`` for what each key means."""

    num_samples: int = 10000
    classifiers: tuple[str, ...] = ("cnn", "mlp")
    epochs: int = 10
    batch_size: int = 128
    lr: float = 3.0e-4
    val_fraction: float = 0.1
    patience: int | None = 5
    fixed_reading: bool = True  # also train on ALL samples for fixed_epochs epochs and report the last epoch
    fixed_epochs: int | None = None  # null: the same as epochs
    one_training: bool = False  # both readings from one training (train split, all epochs): best and last epoch
    mlp_hidden: tuple[int, ...] = (512, 256)
    r2g: bool = True
    r2g_classifier: str = "cnn"
    real_baseline: bool = True
    cnn_fid: bool = True
    fid: bool = True
    inception_score: bool = True
    is_splits: int = 1
    inception_weights: str | None = None
    inception_download: bool = True  # fetch pytorch-fid's weights into the torch hub cache when missing
    fid_max_real: int | None = 10000
    fid_max_syn: int | None = None
    inception_batch_size: int = 50
    eval_batch_size: int = 512

    def hash_fields(self, *names: str) -> dict[str, Any]:
        """The named settings as a plain dict (for cache keys)."""
        return {n: _plain(getattr(self, n)) for n in names}

    @property
    def fixed_schedule_epochs(self) -> int:
        """Epochs of the fixed-schedule g2r reading (``fixed_epochs``, else ``epochs``)."""
        return self.epochs if self.fixed_epochs is None else self.fixed_epochs


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def _fail(key: str, value: Any, want: str) -> DpgenError:
    return DpgenError(f"eval.{key}={value!r} is invalid; expected {want}")  # the key as the user types it


def _as_int(key: str, v: Any, minimum: int, allow_none: bool = False) -> int | None:
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < minimum:
        want = f"an integer >= {minimum}" + (" or null" if allow_none else "")
        raise _fail(key, v, want)
    return int(v)


def _as_bool(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise _fail(key, v, "true or false")
    return v


def _as_seq(key: str, v: Any) -> tuple:
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence):
        raise _fail(key, v, "a list")
    return tuple(v)


def resolve_config(cfg: Mapping | EvalConfig | None) -> EvalConfig:
    """Turn a user mapping (dict, OmegaConf DictConfig) into an :class:`EvalConfig`.

    Missing keys take the defaults above; unknown keys raise :class:`DpgenError` so that a
    typo never silently falls back to a default.
    """
    if cfg is None:
        return EvalConfig()
    if isinstance(cfg, EvalConfig):
        return cfg
    if not isinstance(cfg, Mapping):
        raise DpgenError(f"eval config must be a mapping, got {type(cfg).__name__}")
    known = {f.name for f in dataclasses.fields(EvalConfig)}
    unknown = sorted(str(k) for k in cfg.keys() if k not in known)
    if unknown:
        raise DpgenError(f"eval config: unknown key(s) {unknown}; valid keys are {sorted(known)}")
    vals = {**dataclasses.asdict(EvalConfig()), **{str(k): cfg[k] for k in cfg.keys()}}

    classifiers = _as_seq("classifiers", vals["classifiers"])
    for c in classifiers:
        if c not in CLASSIFIER_KINDS:
            raise _fail("classifiers", list(classifiers), f"a list drawn from {list(CLASSIFIER_KINDS)}")
    if len(set(classifiers)) != len(classifiers):
        raise _fail("classifiers", list(classifiers), "a list without repeats")
    if vals["r2g_classifier"] not in CLASSIFIER_KINDS:
        raise _fail("r2g_classifier", vals["r2g_classifier"], f"one of {list(CLASSIFIER_KINDS)}")
    mlp_hidden = tuple(_as_int("mlp_hidden", h, 1) for h in _as_seq("mlp_hidden", vals["mlp_hidden"]))
    lr = vals["lr"]
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise _fail("lr", lr, "a positive number")
    vf = vals["val_fraction"]
    if isinstance(vf, bool) or not isinstance(vf, (int, float)) or not 0.0 <= vf < 1.0:
        raise _fail("val_fraction", vf, "a number in [0, 1)")
    if vals["one_training"] is True:
        if vals["patience"] is not None:
            raise _fail("patience", vals["patience"], "null with eval.one_training: true (the fixed reading is the "
                        "last of all epochs)")
        if vals["fixed_epochs"] not in (None, vals["epochs"]):
            raise _fail("fixed_epochs", vals["fixed_epochs"], "null with eval.one_training: true (one training, "
                        "eval.epochs long)")
    weights = vals["inception_weights"]
    if weights is not None and not isinstance(weights, str):
        weights = str(weights)

    return EvalConfig(
        num_samples=_as_int("num_samples", vals["num_samples"], 1),
        classifiers=tuple(str(c) for c in classifiers),
        epochs=_as_int("epochs", vals["epochs"], 1),
        batch_size=_as_int("batch_size", vals["batch_size"], 1),
        lr=float(lr),
        val_fraction=float(vf),
        patience=_as_int("patience", vals["patience"], 1, allow_none=True),
        fixed_reading=_as_bool("fixed_reading", vals["fixed_reading"]),
        fixed_epochs=_as_int("fixed_epochs", vals["fixed_epochs"], 1, allow_none=True),
        one_training=_as_bool("one_training", vals["one_training"]),
        mlp_hidden=mlp_hidden,  # type: ignore[arg-type]
        r2g=_as_bool("r2g", vals["r2g"]),
        r2g_classifier=str(vals["r2g_classifier"]),
        real_baseline=_as_bool("real_baseline", vals["real_baseline"]),
        cnn_fid=_as_bool("cnn_fid", vals["cnn_fid"]),
        fid=_as_bool("fid", vals["fid"]),
        inception_score=_as_bool("inception_score", vals["inception_score"]),
        is_splits=_as_int("is_splits", vals["is_splits"], 1),
        inception_weights=weights,
        inception_download=_as_bool("inception_download", vals["inception_download"]),
        fid_max_real=_as_int("fid_max_real", vals["fid_max_real"], 2, allow_none=True),
        fid_max_syn=_as_int("fid_max_syn", vals["fid_max_syn"], 2, allow_none=True),
        inception_batch_size=_as_int("inception_batch_size", vals["inception_batch_size"], 1),
        eval_batch_size=_as_int("eval_batch_size", vals["eval_batch_size"], 1),
    )
