"""What both backends say and check about one message, before anything is posted: its
arguments (``check_peer``, ``check_sources``) and its description in words (``describe``,
``kind_of``), used in deadlock, mismatch and timeout reports."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mpgpu_edu.comm.base import RESERVED_TAG, nbytes_of


def check_peer(rank: int, world_size: int, op: str, tensor: torch.Tensor, peer: int) -> None:
    """The peer exists and is not this rank, and ``tensor`` is a tensor."""
    if not 0 <= peer < world_size:
        raise ValueError(f"rank {rank}: peer {peer} does not exist (world size "
                         f"{world_size}, ranks 0..{world_size - 1})")
    if peer == rank:
        raise ValueError(f"rank {rank} tries to {op} to/from itself: a rank already "
                         "has its own data, skip the message")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{op} needs a torch.Tensor, got {type(tensor).__name__}")


def check_sources(rank: int, sources: Sequence[int]) -> None:
    """``recv_any``'s sources: a non-empty list of distinct ranks."""
    if not sources or len(set(sources)) != len(sources):
        raise ValueError(f"rank {rank}: recv_any needs a list of distinct source "
                         f"ranks, got {list(sources)}")


def describe(op: str, tensor: torch.Tensor, peer: int, tag: int,
             on_stream: bool = False) -> str:
    """``"recv from rank 0, tag 0, 16 bytes (float32 [4])"``: a pending message, in words."""
    what = f"send to rank {peer}" if op == "send" else f"recv from rank {peer}"
    dtype = str(tensor.dtype).replace("torch.", "")
    tag_text = f"barrier round {tag - RESERVED_TAG}" if tag >= RESERVED_TAG else f"tag {tag}"
    return (f"{what}, {tag_text}, {nbytes_of(tensor)} bytes ({dtype} {list(tensor.shape)})"
            + (", on its comm stream" if on_stream else ""))


def kind_of(t: torch.Tensor) -> str:
    """``"meta float32 [4] (16 bytes)"``: what a message carries, in words."""
    dtype = str(t.dtype).replace("torch.", "")
    return f"{'meta ' if t.is_meta else ''}{dtype} {list(t.shape)} ({nbytes_of(t)} bytes)"
