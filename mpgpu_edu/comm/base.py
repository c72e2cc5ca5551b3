"""The communicator: the one interface every strategy is written against.

A strategy is an SPMD function ``fn(comm, *args)`` that every rank runs with its own ``comm``.
Point-to-point messages are the only primitive; every collective in the course is built on
``send``/``recv`` (see ``mpgpu_edu.collectives``), so bytes per link are counted by construction.

Two backends implement this interface: the simulator (``mpgpu_edu.comm.sim``) and
``torch.distributed`` (``mpgpu_edu.comm.dist``).
"""

from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

# Tags at or above this value are reserved for the package's own messages (barrier).
RESERVED_TAG = 1 << 20


class Work(ABC):
    """Handle of an asynchronous operation (``isend``, ``irecv``, ``run_async``)."""

    @abstractmethod
    def wait(self) -> Any:
        """Block until the operation is done; returns the result of a ``run_async`` job."""


@dataclass
class CommStats:
    """Messages and bytes one rank sent and received, in total and per peer (global ranks)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0
    sent_to: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    received_from: dict[int, int] = field(default_factory=lambda: defaultdict(int))

    def record_send(self, dst: int, nbytes: int, messages: int = 1) -> None:
        self.bytes_sent += nbytes
        self.messages_sent += messages
        self.sent_to[dst] += nbytes

    def record_recv(self, src: int, nbytes: int, messages: int = 1) -> None:
        self.bytes_received += nbytes
        self.messages_received += messages
        self.received_from[src] += nbytes

    def to_dict(self) -> dict:
        return {"bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
                "messages_sent": self.messages_sent,
                "messages_received": self.messages_received,
                "sent_to": dict(self.sent_to), "received_from": dict(self.received_from)}


def nbytes_of(tensor: torch.Tensor) -> int:
    """Bytes a tensor's elements occupy (works for meta tensors, which hold no data)."""
    return tensor.numel() * tensor.element_size()


class Communicator(ABC):
    """What one rank can do: point-to-point messages, timed compute regions, memory records."""

    rank: int
    world_size: int
    stats: CommStats
    backend: str = "sim"  # "sim", or torch.distributed's backend ("gloo", "nccl")

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """Where this rank's tensors live (``cpu`` on the simulator and gloo)."""

    @property
    def collectives_at_once(self) -> int:
        """How many collectives torch's process group for this backend runs at the same
        time, so that code engineered as torch's (``dp.ddp_step_overlapped``) can do the
        same: 1 on the simulator, which models NCCL (a communicator's collectives run one
        after another on its stream), 2 on gloo (``ProcessGroupGloo`` runs its work on two
        threads: ``ProcessGroupGloo._Options()._threads``)."""
        return 1

    @property
    def global_rank(self) -> int:
        """This rank's id in the whole job (differs from ``rank`` in a sub-group)."""
        return self.rank

    def global_rank_of(self, rank: int) -> int:
        """Global rank of a rank of this communicator."""
        return rank

    @abstractmethod
    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        """Send ``tensor`` to ``dst``; returns once the message is delivered."""

    @abstractmethod
    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> None:
        """Receive from ``src`` into ``tensor`` (same shape and dtype as the one sent)."""

    @abstractmethod
    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Work:
        """Start sending; do not modify ``tensor`` before ``wait()`` returns."""

    @abstractmethod
    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Work:
        """Start receiving into ``tensor``; read it only after ``wait()`` returns."""

    def recv_any(self, tensor: torch.Tensor, sources: Sequence[int], tag: int = 0) -> int:
        """Receive the first message (tag ``tag``) to arrive from any rank of ``sources``
        into ``tensor``; returns the rank it came from. Messages from one rank still arrive
        in the order they were sent (MPI's ``MPI_ANY_SOURCE``)."""
        raise NotImplementedError(f"{type(self).__name__} has no recv_any")

    def wait_any(self, works: Sequence[Work]) -> int:
        """Block until the first of ``works`` (from ``isend``/``irecv``) completes; returns
        its index. The others stay in flight: wait on them (or pass them again) later."""
        raise NotImplementedError(f"{type(self).__name__} has no wait_any")

    @abstractmethod
    def compute(self, kind: str = "compute", label: str = "",
                seconds: float | None = None) -> contextlib.AbstractContextManager:
        """A timed compute region: ``with comm.compute("forward", "layer 1"): ...``."""

    @abstractmethod
    def run_async(self, fn: Callable[..., Any], *args: Any) -> Work:
        """Run ``fn(*args)`` on this rank's communication stream, after earlier jobs (FIFO)."""

    @property
    @abstractmethod
    def memory(self) -> MemoryRecorder:
        """This rank's memory records (see ``MemoryRecorder``)."""

    @abstractmethod
    def log(self, text: str) -> None:
        """One line in this rank's log (the launcher collects every rank's log)."""

    def barrier(self) -> None:
        """Every rank waits until all have arrived: dissemination barrier, ceil(log2 N) rounds
        of empty messages. Cost: ceil(log2 N) * alpha."""
        n = self.world_size
        token_out, token_in = torch.zeros(0), torch.zeros(0)
        for r in range(math.ceil(math.log2(n)) if n > 1 else 0):
            step = 1 << r
            send = self.isend(token_out, (self.rank + step) % n, RESERVED_TAG + r)
            self.recv(token_in, (self.rank - step) % n, RESERVED_TAG + r)
            send.wait()

    def group(self, ranks: Sequence[int]) -> Communicator:
        """A communicator over a subset of this one's ranks, renumbered 0..len(ranks)-1.

        Every rank in ``ranks`` must call it (with the same list); this rank must be in it."""
        return SubCommunicator(self, ranks)

    def sized_by(self, tensor: torch.Tensor, send_to: int, recv_from: int,
                 tag: int = 0) -> contextlib.AbstractContextManager:
        """For code whose every message size both sides derive from one tensor (a ring's
        plan cut from its tensor's size): inside, messages skip the backend's check of each
        message's size, and the tensors themselves are compared once instead (``send_to``
        learns this rank's, ``recv_from``'s is checked against it; a mismatch raises
        ``MessageMismatchError``). The simulator checks every message as it matches, for
        free: here nothing changes."""
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def neighbours(self, tensor: torch.Tensor, send_to: int, recv_from: int,
                   tag: int = 0) -> Iterator[tuple[Callable[[torch.Tensor], Work],
                                                   Callable[[torch.Tensor], Work]]]:
        """``sized_by``, for code that only ever sends to ``send_to`` and receives from
        ``recv_from`` on ``tag`` (a ring): yields ``(isend, irecv)``, each taking just the
        tensor. Every message is still an ``isend``/``irecv``, counted and drawn like any
        other; a backend may check the arguments once here instead of at every message
        (``DistCommunicator`` does: the fast ring's rounds then cost less Python). The
        receives must be posted in the order ``recv_from`` sends (a ring's are): a backend may
        deal the messages out over several connections, the i-th send and the i-th receive
        on the same one (``DistCommunicator`` does, on gloo). A message the caller left
        unwaited is waited on the way out."""
        posted: list[_Once] = []

        def isend(t: torch.Tensor) -> Work:
            posted.append(_Once(self.isend(t, send_to, tag)))
            return posted[-1]

        def irecv(t: torch.Tensor) -> Work:
            posted.append(_Once(self.irecv(t, recv_from, tag)))
            return posted[-1]

        with self.sized_by(tensor, send_to, recv_from, tag):
            yield isend, irecv
            for work in posted:
                work.wait()


class MemoryRecorder(ABC):
    """Records what a rank holds in device memory, by category (see ``trace.CATEGORIES``)."""

    @abstractmethod
    def alloc(self, category: str, nbytes: int, label: str = "") -> int:
        """Record an allocation; returns a token for ``free``."""

    @abstractmethod
    def free(self, token: int) -> None:
        """Record that the allocation of ``token`` is released."""

    def alloc_tensor(self, tensor: torch.Tensor, category: str, label: str = "") -> int:
        return self.alloc(category, nbytes_of(tensor), label)

    @contextlib.contextmanager
    def hold(self, category: str, nbytes: int, label: str = "") -> Iterator[None]:
        token = self.alloc(category, nbytes, label)
        try:
            yield
        finally:
            self.free(token)


class _Once(Work):
    """A work waited at most once (``neighbours`` waits on the way out what the caller
    left): a second ``wait`` returns at once."""

    __slots__ = ("work", "done")

    def __init__(self, work: Work) -> None:
        self.work, self.done = work, False

    def wait(self) -> Any:
        if not self.done:
            self.done = True
            return self.work.wait()
        return None


class SubCommunicator(Communicator):
    """A process group: ranks of a parent communicator, renumbered. Messages travel through
    the parent, so byte counts and timing are the parent's."""

    def __init__(self, parent: Communicator, ranks: Sequence[int]) -> None:
        ranks = list(ranks)
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"group ranks {ranks} contain duplicates: list each rank once")
        bad = [r for r in ranks if not 0 <= r < parent.world_size]
        if bad:
            raise ValueError(f"group ranks {bad} do not exist: ranks are 0..{parent.world_size - 1}")
        if parent.rank not in ranks:
            raise ValueError(f"rank {parent.rank} is not in group {ranks}: only members call "
                             "group(), or pass a list that contains this rank")
        self.parent, self.ranks = parent, ranks
        self.rank, self.world_size = ranks.index(parent.rank), len(ranks)
        self.stats = parent.stats

    @property
    def device(self) -> torch.device:
        return self.parent.device

    @property
    def backend(self) -> str:  # type: ignore[override]
        return self.parent.backend

    @property
    def collectives_at_once(self) -> int:
        return self.parent.collectives_at_once

    @property
    def global_rank(self) -> int:
        return self.parent.global_rank

    def global_rank_of(self, rank: int) -> int:
        return self.parent.global_rank_of(self.ranks[rank])

    def _peer(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is not in this group of {self.world_size} "
                             f"(ranks 0..{self.world_size - 1})")
        return self.ranks[rank]

    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        self.parent.send(tensor, self._peer(dst), tag)

    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> None:
        self.parent.recv(tensor, self._peer(src), tag)

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Work:
        return self.parent.isend(tensor, self._peer(dst), tag)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Work:
        return self.parent.irecv(tensor, self._peer(src), tag)

    def recv_any(self, tensor: torch.Tensor, sources: Sequence[int], tag: int = 0) -> int:
        src = self.parent.recv_any(tensor, [self._peer(s) for s in sources], tag)
        return self.ranks.index(src)

    def wait_any(self, works: Sequence[Work]) -> int:
        return self.parent.wait_any(works)

    def sized_by(self, tensor: torch.Tensor, send_to: int, recv_from: int,
                 tag: int = 0) -> contextlib.AbstractContextManager:
        return self.parent.sized_by(tensor, self._peer(send_to), self._peer(recv_from), tag)

    def neighbours(self, tensor: torch.Tensor, send_to: int, recv_from: int,
                   tag: int = 0) -> contextlib.AbstractContextManager:
        return self.parent.neighbours(tensor, self._peer(send_to), self._peer(recv_from), tag)

    def compute(self, kind: str = "compute", label: str = "",
                seconds: float | None = None) -> contextlib.AbstractContextManager:
        return self.parent.compute(kind, label, seconds)

    def run_async(self, fn: Callable[..., Any], *args: Any) -> Work:
        return self.parent.run_async(fn, *args)

    @property
    def memory(self) -> MemoryRecorder:
        return self.parent.memory

    def log(self, text: str) -> None:
        self.parent.log(text)
