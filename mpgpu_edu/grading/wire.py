"""What crosses from a check's child process to the grader: plain data, decoded safely.

The child runs the learner's code, so everything it sends is treated as hostile: a message
with data (``computed``) is ``torch.save`` of a dict of plain data, read with
``torch.load(weights_only=True)`` (tensors, numbers, strings, lists, dicts: no code, no
learner classes) and copied again by ``plain`` (exact types, tensors detached and cloned);
every other message is JSON (so a learner's own check never imports torch in the kernel).
A message that is not such a dict, or is larger than ``MAX_MESSAGE_BYTES``, is refused.
"""

from __future__ import annotations

import io
import json
from typing import Any

MAX_MESSAGE_BYTES = 256 * 2**20


class BadMessage(ValueError):
    """The child sent something that is not a message of plain data."""


def encode(message: dict[str, Any]) -> bytes:
    if message.get("type") != "computed":
        return b"J" + json.dumps(message).encode()
    import torch

    buffer = io.BytesIO()
    torch.save(message, buffer)
    return b"T" + buffer.getvalue()


def decode(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_MESSAGE_BYTES:
        raise BadMessage(f"a message of {len(data)} bytes (at most {MAX_MESSAGE_BYTES})")
    if data[:1] == b"J":
        try:
            message = json.loads(data[1:])
        except ValueError:
            raise BadMessage("not JSON") from None
        if type(message) is dict and message.get("type") == "computed":
            raise BadMessage("data must come as plain tensors and numbers")
    elif data[:1] == b"T":
        message = _load_plain(data[1:])
    else:
        raise BadMessage("not a message")
    if type(message) is not dict or type(message.get("type")) is not str:
        raise BadMessage("not a message")
    return message


def _load_plain(data: bytes) -> Any:
    import torch

    from mpgpu_edu.grading.checks._plain import plain

    try:
        return plain(torch.load(io.BytesIO(data), weights_only=True))
    except Exception as exc:  # noqa: BLE001 - anything the bytes can make torch raise
        raise BadMessage(f"not plain data ({type(exc).__name__})") from None
