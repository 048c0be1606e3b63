"""Tiny ``key=value`` argument parsing for the non-Hydra scripts (sample, evaluate, collect)."""
from __future__ import annotations

from typing import Mapping, Sequence

from dpgen.errors import DpgenError


def parse_kv(argv: Sequence[str], required: Sequence[str] = (), optional: Mapping[str, str | None] | None = None,
             allow_extra_prefix: str | None = None) -> dict:
    """Parse ``key=value`` arguments; unknown keys and missing required keys are DpgenErrors."""
    optional = dict(optional or {})
    out: dict = dict(optional)
    for arg in argv:
        if "=" not in arg:
            raise DpgenError(f"expected key=value, got {arg!r}; required: {', '.join(required)}")
        key, value = arg.split("=", 1)
        if key not in required and key not in optional and not (allow_extra_prefix and key.startswith(allow_extra_prefix)):
            raise DpgenError(f"unknown argument {key!r}; expected {', '.join([*required, *optional])}")
        out[key] = value
    missing = [k for k in required if k not in out]
    if missing:
        raise DpgenError(f"missing argument(s): {', '.join(f'{k}=...' for k in missing)}")
    return out


def parse_int(key: str, text: str, minimum: int) -> int:
    """``key=text`` as an integer >= ``minimum``, else a one-line DpgenError naming the key."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise DpgenError(f"{key}={text!r} is invalid; expected an integer >= {minimum}")
    return value
