"""Plain data: what may cross from code that is not trusted (a check's *compute* half to its
*judge* half, a rank process of ``comm.apart`` to its launcher).

``plain(value)`` rebuilds ``value`` from exact built-in types: ``torch.Tensor`` (detached
copies, subclasses stripped), ``bool``, ``int``, ``float``, ``str``, ``None``, ``list``
(tuples become lists) and ``dict``. Anything else becomes ``{"__unplain__": type name}``, so
the judge can say "expected a tensor, got MyList" and a learner's object can never reach
the verdict (a ``list`` whose ``__eq__`` is always true arrives as a real ``list``).
"""

from __future__ import annotations

from typing import Any

import torch

MAX_DEPTH = 32
UNPLAIN = "__unplain__"


def plain(value: Any, _depth: int = 0) -> Any:
    """A copy of ``value`` made of exact plain types (see the module's docstring)."""
    if _depth > MAX_DEPTH:
        return {UNPLAIN: "nesting deeper than 32 levels"}
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, torch.Tensor):
        return _tensor(value)
    if isinstance(value, bool):
        return bool(int.__int__(value))
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (list, tuple)):
        items = list.__iter__(value) if isinstance(value, list) else tuple.__iter__(value)
        return [plain(item, _depth + 1) for item in items]
    if isinstance(value, dict):
        return {_key(k): plain(v, _depth + 1) for k, v in dict.items(value)}
    return {UNPLAIN: type(value).__name__}


def _tensor(value: torch.Tensor) -> torch.Tensor:
    with torch._C.DisableTorchFunctionSubclass():
        base = torch.Tensor.as_subclass(value, torch.Tensor)
        return base.detach().clone()


def _key(key: Any) -> Any:
    if type(key) in (str, int, bool) or key is None:
        return key
    if isinstance(key, tuple):
        return tuple(_key(k) for k in tuple.__iter__(key))
    if isinstance(key, (int, str)):
        return plain(key)
    return f"<{type(key).__name__}>"


def type_name(value: Any) -> str:
    """The learner-facing type name of a plain value (``"MyList"`` for an unplain one)."""
    if isinstance(value, dict) and UNPLAIN in value and len(value) == 1:
        return str(value[UNPLAIN])
    return type(value).__name__


def is_tensor(value: Any) -> bool:
    return type(value) is torch.Tensor
