"""Value checks for the structured-config schemas (:mod:`dpgen.core.schema`, :mod:`dpgen.core.hparams`).

A schema field declares its allowed values with :func:`spec`; :func:`check_block` checks a composed block
against them and then runs the schema's ``cross_check(node, key, ctx)`` for rules involving several keys,
the data (:class:`Facts`) or the method. Every error is :func:`bad`'s one line: the key as the user types
it, the value, and what is allowed.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, List

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from dpgen.errors import DpgenError


# ---- declaring fields ---------------------------------------------------------------------------

def spec(default: Any = MISSING, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
         lt: float | None = None, choices: tuple | None = None, length: int | None = None) -> Any:
    """A schema field and its allowed values (for lists: of each item; ``length``: the list's length).

    The default is MISSING: the value comes from the yaml file (``???`` if it is absent there).
    """
    meta = {k: v for k, v in dict(ge=ge, gt=gt, le=le, lt=lt, choices=choices, length=length).items()
            if v is not None}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def nested(cls: type) -> Any:
    """A nested block (a sub-dataclass) with its own fields."""
    return field(default_factory=cls)


@dataclass
class Facts:
    """What the checks may know besides the config: the training data, once loaded (None before)."""

    n_train: int | None = None
    shape: tuple[int, ...] | None = None
    tabular: bool | None = None


@dataclass
class CheckContext:
    cfg: DictConfig
    facts: Facts


def bad(key: str, value: Any, expected: str) -> DpgenError:
    """The one-line error every check raises: key as the user types it, the value, what is allowed."""
    shown = value if isinstance(value, (int, float, bool)) or value is None else OmegaConf.to_container(value) \
        if isinstance(value, (DictConfig, ListConfig)) else value
    text = repr(shown) if isinstance(shown, str) else str(shown).replace("None", "null")
    if len(text) > 80:
        text = text[:77] + "..."
    return DpgenError(f"{key}={text} is invalid; expected {expected}")


# ---- describing types (for messages) ------------------------------------------------------------

def describe_type(hint: Any) -> str:
    """``Optional[List[int]]`` -> "a list of integers or null"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        parts = [describe_type(a) for a in args if a is not type(None)]
        return " or ".join(parts) + (" or null" if type(None) in args else "")
    if origin in (list, List):
        return f"a list of {_plural(describe_type(args[0]) if args else 'values')}"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(hint, "a value") \
        if not dataclasses.is_dataclass(hint) else f"a block of {hint.__name__} keys"


def _plural(desc: str) -> str:
    word = desc.split(" ", 1)[-1]
    return {"integer": "integers", "number": "numbers", "string": "strings", "false": "booleans"}.get(word, word)


def _constraint_text(meta: dict) -> str:
    if "choices" in meta:
        return "one of " + ", ".join(str(c) for c in meta["choices"])
    parts = [f"{op} {_num(meta[k])}" for k, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")) if k in meta]
    return " and ".join(parts)


def _num(v: float) -> str:
    return str(v) if isinstance(v, int) else f"{v:g}"


def _expected(hint: Any, meta: dict) -> str:
    args = typing.get_args(hint)
    optional = type(None) in args
    inner = next((a for a in args if a is not type(None)), hint) if optional else hint
    cons = _constraint_text(meta)
    text = cons if "choices" in meta else f"{describe_type(inner)} {cons}".strip()
    return text + (", or null" if optional else "")


# ---- checking values ----------------------------------------------------------------------------

def dataclass_in(hint: Any) -> type | None:
    if dataclasses.is_dataclass(hint):
        return hint
    for a in typing.get_args(hint):
        if dataclasses.is_dataclass(a):
            return a
    return None


def _item_ok(value: Any, meta: dict) -> bool:
    if "choices" in meta:
        return value in meta["choices"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True  # non-numbers: the type check already ran
    if isinstance(value, float) and math.isnan(value):
        return False
    return (("ge" not in meta or value >= meta["ge"]) and ("gt" not in meta or value > meta["gt"])
            and ("le" not in meta or value <= meta["le"]) and ("lt" not in meta or value < meta["lt"]))


def check_block(node: Any, schema: type, key: str, ctx: CheckContext) -> None:
    """Every field of ``node`` against ``schema``'s declared ranges/choices, nested blocks, then the
    schema's ``cross_check``. ``key`` is the block's key as the user types it ("" for the top level)."""
    hints = typing.get_type_hints(schema)
    names = [f.name for f in dataclasses.fields(schema)]
    extra = sorted(str(k) for k in node.keys() if k not in names and not (k == "hydra" and not key))
    if extra:  # added with +key=value, which bypasses the schema's struct flag
        full = f"{key}.{extra[0]}" if key else extra[0]
        raise DpgenError(f"unknown key {full}; valid keys here: {', '.join(names)}")
    for f in dataclasses.fields(schema):
        full = f"{key}.{f.name}" if key else f.name
        if f.metadata.get("absent_ok") and OmegaConf.is_missing(node, f.name):
            continue
        value = node[f.name]  # resolves interpolations (types were checked by OmegaConf on the way)
        sub = dataclass_in(hints[f.name])
        if sub is not None:
            if value is not None:
                check_block(value, sub, full, ctx)
            continue
        meta = {k: v for k, v in f.metadata.items() if k != "absent_ok"}
        if not meta or value is None:
            continue
        if isinstance(value, ListConfig):
            if "length" in meta and len(value) != meta["length"]:
                raise bad(full, value, f"a list of {meta['length']} values")
            if not all(v is None or _item_ok(v, meta) for v in value):
                raise bad(full, value, f"a list of values {_constraint_text(meta)}")
        elif not _item_ok(value, meta):
            raise bad(full, value, _expected(hints[f.name], meta))
    cross = getattr(schema, "cross_check", None)
    if cross is not None:
        cross(node, key, ctx)


def int_list(value: Any) -> list[int] | None:
    """A list of integers given as a list or as a comma-separated string ("1,2,2"); None if it is neither."""
    items = str(value).split(",") if isinstance(value, (str, int)) else list(value) if isinstance(value, (list, ListConfig)) else None
    if items is None:
        return None
    try:
        return [int(str(t).strip()) for t in items if str(t).strip()]
    except ValueError:
        return None


def check_betas(node: Any, key: str) -> None:
    """Adam's (beta1, beta2): two numbers in [0, 1)."""
    b = node.betas
    if len(b) != 2 or not all(0.0 <= float(v) < 1.0 for v in b):
        raise bad(f"{key}.betas", b, "two numbers in [0, 1), e.g. [0.5, 0.999]")


def check_batch_le_n(node: Any, key: str, ctx: CheckContext, *names: str) -> None:
    """Batch-like sizes must not exceed the training set (known once the data is loaded)."""
    n = ctx.facts.n_train
    if n is None:
        return
    for name in names:
        v = node[name]
        if v is not None and int(v) > n:
            raise bad(f"{key}.{name}", v, f"an integer between 1 and N={n} (the training set size)")


def check_max_image_size(ctx: CheckContext, max_px: int, method: str) -> None:
    shape = ctx.facts.shape
    if shape is not None and (ctx.facts.tabular or len(shape) != 3 or shape[1] > max_px or shape[2] > max_px):
        raise DpgenError(f"dataset={ctx.cfg.dataset.name} is invalid for method={method}: it generates images up to "
                         f"{max_px}x{max_px}, this dataset has shape {list(shape)}")
