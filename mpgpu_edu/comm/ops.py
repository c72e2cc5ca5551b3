"""The operations a simulated rank performs, as plain records.

While a program runs on the simulator, each *actor* (a rank's host thread, lane 0, and its
communication stream, lane 1) appends what it does to its own list of ops. The lists depend
only on each rank's program and the data it receives, never on how threads interleave, so
replaying them against a cost model (``mpgpu_edu.comm.replay``) gives the same timeline on
every run, and the same run can be re-timed on another cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

HOST, STREAM = 0, 1  # lanes: the rank's program, and its communication stream


@dataclass(frozen=True)
class Compute:
    seconds: float
    kind: str
    label: str
    flops: float


@dataclass(frozen=True)
class Post:
    """A send or receive posted on channel (src, dst, tag, lane); ``seq`` numbers the
    messages on that channel, so the n-th send meets the n-th receive (MPI's ordering)."""

    op: str  # "send" or "recv"
    src: int
    dst: int
    tag: int
    lane: int
    seq: int
    nbytes: int
    blocking: bool
    handle: int

    @property
    def channel(self) -> tuple[int, int, int, int, int]:
        return (self.src, self.dst, self.tag, self.lane, self.seq)


@dataclass(frozen=True)
class Wait:
    handle: int


@dataclass(frozen=True)
class Submit:
    job: int


@dataclass(frozen=True)
class JobStart:
    job: int


@dataclass(frozen=True)
class JobEnd:
    job: int


@dataclass(frozen=True)
class WaitJob:
    job: int


@dataclass(frozen=True)
class Memory:
    category: str
    delta: int
    label: str


@dataclass(frozen=True)
class Log:
    text: str


Op = Compute | Post | Wait | Submit | JobStart | JobEnd | WaitJob | Memory | Log
