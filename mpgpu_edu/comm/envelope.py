"""Message envelopes on torch.distributed: what a receive checks before it takes the data.

On gloo a receive into a larger buffer than was sent completes without a word (the rest of
the buffer keeps its old values), and one into a smaller buffer fails deep inside gloo. The
simulator refuses both with ``MessageMismatchError``; so does this backend: every message is
preceded by a small envelope (dtype, shape, bytes) on the same channel, and the receiver
compares it with its own buffer before it reads the data.

The cost is one extra message of ``ENVELOPE_NUMEL`` int64 (96 bytes) per message: on gloo
between processes of one machine about one message latency (tens of microseconds), which
matters only for very small messages. ``MPGPU_EDU_CHECK_MESSAGES=0`` in the launcher's
environment turns the envelopes off (the launcher reads it at every launch; under torchrun
each rank reads it at start). The benchmarks in ``benchmarks/`` measure the default, checked
mode, which is what a learner runs; ``allreduce_vs_torch.py`` also times the fast ring with
the envelopes off (``ring_fast_unchecked``), so the check's own cost is shown.

Inside a block checked once (``Communicator.neighbours``, ``sized_by``) the messages carry no
envelope of their own, and a receive is posted before the block's one envelope has arrived:
a faster ring. There each message travels under ``sized_tag``, its tag with its size folded
in, so a message only ever meets a receive of its own size (up to ``SIZE_CODES``): one of
another size is not taken into a buffer that does not fit it (gloo aborts the whole process
then, with no way to catch it) while the block's envelope names the mismatch.
"""

from __future__ import annotations

import os

import torch

from mpgpu_edu.comm.base import RESERVED_TAG, nbytes_of
from mpgpu_edu.comm.errors import MessageMismatchError

CHECK_ENV = "MPGPU_EDU_CHECK_MESSAGES"
MAX_DIMS = 8
ENVELOPE_NUMEL = 4 + MAX_DIMS  # dtype, number of dims (-1: more than MAX_DIMS), bytes, numel
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
           torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64,
           torch.complex128]


SIZED_TAG_BIT = 1 << 30  # torch's tags are C ints: bits 0-19 the caller's, 20-29 the size
SIZE_CODES = 1021  # a prime below 2**10: sizes that differ by a multiple of it share a code


def sized_tag(tag: int, nbytes: int) -> int:
    """The torch tag of a message of ``nbytes`` inside a block checked once: ``tag`` with the
    size folded in (``tag`` itself from ``RESERVED_TAG`` on, where no bits are free)."""
    if tag >= RESERVED_TAG:
        return tag
    return SIZED_TAG_BIT | (nbytes % SIZE_CODES) << 20 | tag


def block_check_tag(tag: int) -> int | None:
    """The torch tag of a ``neighbours`` block's envelope: a size code no message size has
    (``SIZE_CODES``), so that nothing else meets the receive posted for it ahead of time;
    ``None`` from ``RESERVED_TAG`` on."""
    if tag >= RESERVED_TAG:
        return None
    return SIZED_TAG_BIT | SIZE_CODES << 20 | tag


def checking_from_env() -> bool:
    """Whether envelopes are on: anything but ``0``/``false``/``no``/``off`` means yes."""
    return os.environ.get(CHECK_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES)


def envelope(tensor: torch.Tensor) -> torch.Tensor:
    """The envelope of ``tensor`` as an int64 tensor on the tensor's device."""
    shape = list(tensor.shape)
    dims = len(shape) if len(shape) <= MAX_DIMS else -1
    values = [_dtype_code(tensor.dtype), dims, nbytes_of(tensor), tensor.numel()]
    values += (shape if dims >= 0 else []) + [0] * (MAX_DIMS - max(dims, 0))
    return torch.tensor(values, dtype=torch.int64, device=tensor.device)


def empty_envelope(device: torch.device) -> torch.Tensor:
    return torch.zeros(ENVELOPE_NUMEL, dtype=torch.int64, device=device)


def _kind(values: list[int]) -> str:
    code, dims, nbytes = values[0], values[1], values[2]
    dtype = str(_DTYPES[code]).replace("torch.", "") if code < len(_DTYPES) else "other dtype"
    shape = values[4:4 + dims] if dims >= 0 else f"<{values[3]} elements>"
    return f"{dtype} {shape} ({nbytes} bytes)"


def check_envelope(received: torch.Tensor, buffer: torch.Tensor, src: int, dst: int,
                   tag: int, expected: torch.Tensor | None = None) -> None:
    """Raise ``MessageMismatchError`` (worded as the simulator's) unless the message that
    ``received`` describes fits ``buffer`` exactly: same dtype, shape and bytes.
    ``expected``: ``envelope(buffer)`` if the caller has it already (one comparison then)."""
    if expected is not None and torch.equal(received, expected):
        return
    got = [int(v) for v in received.tolist()]
    want = [int(v) for v in envelope(buffer).tolist()]
    if got != want:
        raise MessageMismatchError(
            f"message mismatch on tag {tag}: rank {src} sends {_kind(got)} but rank {dst} "
            f"receives into {_kind(want)}; make both sides use the same shape and dtype")


def check_same_tensor(received: torch.Tensor, tensor: torch.Tensor, src: int, dst: int,
                      expected: torch.Tensor) -> None:
    """``Communicator.sized_by``'s one check: rank ``src``'s tensor (its envelope,
    ``received``) is like rank ``dst``'s ``tensor``, else ``MessageMismatchError``."""
    if torch.equal(received, expected):
        return
    got = [int(v) for v in received.tolist()]
    raise MessageMismatchError(
        f"rank {src} runs this collective on {_kind(got)} but rank {dst} on "
        f"{_kind([int(v) for v in expected.tolist()])}: every rank must pass a tensor of the "
        "same shape and dtype")
