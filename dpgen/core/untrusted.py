"""Checks for data read back from files dpgen did not necessarily write (generator.pt, checkpoints).

``torch.load(weights_only=True)`` already refuses pickled code; these checks make sure that what it
returns has the plain shape the caller expects before anything is built from it or loaded into it.
"""
from __future__ import annotations

import collections.abc
import inspect
import math
import types
import typing
from typing import Any

import torch
from torch import nn

from dpgen.errors import DpgenError

#: limits on plain values from an untrusted file (constructor arguments, metadata)
MAX_DEPTH = 6
MAX_ITEMS = 4096
MAX_STR = 4096
MAX_INT = 2**40


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_plain(value: Any, what: str, tensors: bool = False, max_depth: int = MAX_DEPTH, _depth: int = 0) -> None:
    """``value`` is built from None, bool, int, float, str, lists/tuples and str- or int-keyed dicts only (and
    dense tensors if ``tensors``), within ``max_depth`` / :data:`MAX_ITEMS` (not for tensor containers) /
    :data:`MAX_STR` / :data:`MAX_INT`."""
    if _depth > max_depth:
        raise DpgenError(f"{what} is nested more than {max_depth} levels deep")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if abs(value) > MAX_INT:
            raise DpgenError(f"{what}={_show(value)} is out of range (|v| <= 2**40)")
        return
    if isinstance(value, float):
        return
    if isinstance(value, str):
        if len(value) > MAX_STR:
            raise DpgenError(f"{what} is a string of {len(value)} characters (at most {MAX_STR})")
        return
    if tensors and isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_quantized:
            raise DpgenError(f"{what} is a {value.layout} tensor; only dense tensors are accepted")
        return
    if isinstance(value, (list, tuple, dict)):
        if len(value) > MAX_ITEMS and not tensors:
            raise DpgenError(f"{what} has {len(value)} entries (at most {MAX_ITEMS})")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            if isinstance(value, dict) and not isinstance(k, (str, int)):
                raise DpgenError(f"{what} has a key of type {type(k).__name__}")
            check_plain(v, f"{what}[{_show(k)}]", tensors, max_depth, _depth + 1)
        return
    raise DpgenError(f"{what} holds a {type(value).__name__}; only plain values{' and tensors' if tensors else ''} are accepted")


def conforms(value: Any, hint: Any) -> bool:
    """Whether a plain value has the annotated type: int, float, str, bool, Any, X | None, list[X],
    tuple[X, ...], dict[K, V] (an int is a float; a bool is neither)."""
    if hint is Any:
        return True
    if hint is type(None) or hint is None:
        return value is None
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, a) for a in args)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if origin in (list, tuple, typing.Sequence, collections.abc.Sequence) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        item = args[0] if args else Any
        return all(conforms(v, item) for v in value)
    if origin in (dict, typing.Mapping, collections.abc.Mapping) or hint is dict:
        if not isinstance(value, dict):
            return False
        kh, vh = args if args else (Any, Any)
        return all(conforms(k, kh) and conforms(v, vh) for k, v in value.items())
    return False  # any other annotation (a class, a tensor): never accepted from a file


def check_kwargs(cls: type, kwargs: Any) -> dict:
    """Constructor arguments read from a file: plain values that bind to ``cls.__init__`` and match its
    annotations. Returns them as a dict; a DpgenError names the first argument that does not fit."""
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise DpgenError(f"constructor arguments must be a dict with string keys, got {type(kwargs).__name__}")
    check_plain(kwargs, "kwargs")
    sig = inspect.signature(cls.__init__)
    params = [p for name, p in sig.parameters.items() if name != "self"]
    if any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in params):
        raise DpgenError(f"{cls.__name__} takes **kwargs; it cannot be rebuilt from a file")  # a registry bug
    names = [p.name for p in params]
    unknown = sorted(set(kwargs) - set(names))
    missing = [p.name for p in params if p.default is p.empty and p.name not in kwargs]
    if unknown or missing:
        raise DpgenError(f"arguments do not fit {cls.__name__}({', '.join(names)}): "
                         + "; ".join(s for s in (f"unknown {unknown}" if unknown else "",
                                                 f"missing {missing}" if missing else "") if s))
    hints = typing.get_type_hints(cls.__init__)
    for name, value in kwargs.items():
        hint = hints.get(name, Any)
        if not conforms(value, hint):
            raise DpgenError(f"argument {name}={_show(value)} of {cls.__name__} is not of type {_hint_name(hint)}")
    return dict(kwargs)


def _hint_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) if isinstance(hint, type) else str(hint).replace("typing.", "")


def check_state_dict(module: nn.Module, state: Any, what: str) -> None:
    """``state`` holds exactly ``module``'s parameter/buffer names, each a dense tensor of the same shape and
    dtype; checked before ``load_state_dict`` so a crafted file cannot reshape or retype the network."""
    expected = module.state_dict()
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise DpgenError(f"{what} must be a dict of named tensors, got {type(state).__name__}")
    missing, unknown = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unknown:
        raise DpgenError(f"{what} do not fit {type(module).__name__}: missing {missing[:3]}, unexpected {unknown[:3]}")
    for name, ref in expected.items():
        t = state[name]
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.is_quantized:
            raise DpgenError(f"{what}[{name!r}] is a {type(t).__name__}, not a dense tensor")
        if tuple(t.shape) != tuple(ref.shape) or t.dtype != ref.dtype:
            raise DpgenError(f"{what}[{name!r}] has shape {tuple(t.shape)} {t.dtype}; "
                             f"{type(module).__name__} needs {tuple(ref.shape)} {ref.dtype}")
