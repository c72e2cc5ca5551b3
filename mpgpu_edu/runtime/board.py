"""A board in shared memory: fixed-size text slots that workers write and the owner reads,
even while a worker is stuck inside C++ (what each rank is blocked on, for a timeout's
message). A file in a private temporary folder, mapped by every process that opens it."""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import tempfile

SLOT_BYTES = 256


class SharedBoard:
    """``slots`` slots of ``SLOT_BYTES`` bytes. The owner creates it (``create``) and removes
    it (``remove``); a worker opens it by ``path``."""

    def __init__(self, path: str, slots: int) -> None:
        self.path, self.slots = path, slots
        # a text as its slot's bytes: a rank writes the same few lines around every message
        self._slot_bytes: dict[str, bytes] = {}
        with open(path, "r+b") as handle:
            self.map = mmap.mmap(handle.fileno(), slots * SLOT_BYTES)

    @classmethod
    def create(cls, slots: int) -> SharedBoard:
        folder = tempfile.mkdtemp(prefix="mpgpu-board-",
                                  dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        path = os.path.join(folder, "board")
        with open(path, "wb") as handle:
            handle.truncate(slots * SLOT_BYTES)
        return cls(path, slots)

    def set(self, slot: int, text: str) -> None:
        data = self._slot_bytes.get(text)
        if data is None:
            if len(self._slot_bytes) >= 1024:
                self._slot_bytes.clear()
            data = self._slot_bytes[text] = text.encode()[:SLOT_BYTES - 1].ljust(SLOT_BYTES,
                                                                                 b"\0")
        start = slot * SLOT_BYTES
        self.map[start:start + SLOT_BYTES] = data

    def get(self, slot: int) -> str:
        start = slot * SLOT_BYTES
        return bytes(self.map[start:start + SLOT_BYTES]).split(b"\0", 1)[0].decode(
            errors="replace")

    def remove(self) -> None:
        with contextlib.suppress(Exception):
            self.map.close()
        shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)


class RankBoard:
    """Rank ``rank``'s two lanes (program, comm stream) on a ``SharedBoard``; the interface
    of ``comm.dist_work.OpBoard``."""

    def __init__(self, board: SharedBoard, rank: int) -> None:
        self.board, self.rank = board, rank

    def set(self, lane: int, text: str) -> None:
        self.board.set(2 * self.rank + lane, text)

    def get(self, lane: int) -> str:
        return self.board.get(2 * self.rank + lane)
