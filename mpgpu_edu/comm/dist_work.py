"""The parts of a ``DistCommunicator`` rank: its process groups (``Lanes``), the board where
it writes what it waits for, its messages in flight (``DistWork``), its comm-stream thread and
its memory records. ``mpgpu_edu.comm.dist`` puts them together."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from mpgpu_edu.cluster.ledger import MemoryLedger
from mpgpu_edu.comm.base import MemoryRecorder, Work
from mpgpu_edu.comm.envelope import check_envelope
from mpgpu_edu.comm.message import check_peer, describe
from mpgpu_edu.cluster.trace import MemoryEvent

MAIN, STREAM = 0, 1  # lanes: the rank's program, and its communication stream
POLL_S = 1e-4  # wait_any polls its works this often
GLOO_CHANNELS = 2  # pairs of connections per lane on gloo (``Lanes``)


@dataclass
class Lanes:
    """The process groups of one process: ``main`` for the rank's program (``None``: the
    default group) and ``stream`` for its communication stream; and the rank's device.
    Made once per process, by every rank at the same point (``init_lanes``).

    On gloo each lane also has a second group, ``main_down`` and ``stream_down``: a second
    TCP connection between every two ranks, which ``neighbours`` uses for its messages to a
    lower rank (``between``). gloo's connection to a peer holds one lock for both directions, and
    a rank writing a segment into it cannot read the segment its peer is sending until the
    write is done: on two ranks, whose ring's two links join the same two processes, the
    two directions took turns instead of running at once. ``None`` (nccl, or a process
    made without them): one connection, both directions.

    And on gloo each lane has ``GLOO_CHANNELS`` such pairs of connections in all (the
    pairs after the first in ``main_more`` and ``stream_more``): ``neighbours`` deals its
    messages out over them in turn (``channels``), so that one message can move while the
    one posted before it still holds its connection, each connection with its own gloo
    thread reading it (NCCL's socket transport opens several sockets per peer for the same
    reason: ``NCCL_NSOCKS_PERTHREAD``, ``NCCL_SOCKET_NTHREADS``)."""

    main: Any
    stream: Any
    device: torch.device
    main_down: Any = None
    stream_down: Any = None
    main_more: tuple = ()  # ((up, down), ...): the lane's further channels (gloo)
    stream_more: tuple = ()
    # (lane, peer, tag) -> (torch work, envelope): the receive of the size check of the next
    # ``neighbours`` block from that peer, posted once the last one's check passed
    # (``dist._Head``). Kept here, with the process groups: it outlives a job's communicator.
    checks: dict = field(default_factory=dict)

    def between(self, lane: int, src: int, dst: int) -> Any:
        """The group a ``neighbours`` message from rank ``src`` to rank ``dst`` goes on, on
        ``lane`` (``MAIN`` or ``STREAM``): the lane's second one toward a lower rank, where
        there is one. Sender and receiver both ask, with the same two ranks."""
        own, down = ((self.stream, self.stream_down) if lane == STREAM
                     else (self.main, self.main_down))
        return down if dst < src and down is not None else own

    def channels(self, lane: int, src: int, dst: int) -> list[Any]:
        """The groups that ``neighbours`` deals the messages from rank ``src`` to rank
        ``dst`` out over, in turn: ``between``'s first, then one per further channel."""
        more = self.stream_more if lane == STREAM else self.main_more
        return [self.between(lane, src, dst)] + [down if dst < src else up for up, down in more]


def init_lanes(backend: str) -> Lanes:
    """After ``dist.init_process_group``: pick the device and make the stream's group (and,
    on gloo, each lane's second connection: ``Lanes``)."""
    device = torch.device("cpu")
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count()))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        return Lanes(None, dist.new_group(backend=backend), device)
    stream = dist.new_group(backend=backend)
    main_down, stream_down = dist.new_group(backend=backend), dist.new_group(backend=backend)
    more = [tuple((dist.new_group(backend=backend), dist.new_group(backend=backend))
                  for _ in range(GLOO_CHANNELS - 1)) for _lane in (MAIN, STREAM)]
    return Lanes(None, stream, device, main_down, stream_down, more[MAIN], more[STREAM])


class OpBoard:
    """Where a rank writes what it is blocked on, so that its launcher can read it while the
    rank is stuck inside C++. The default keeps it in this process; pool workers use shared
    memory (``mpgpu_edu.runtime.board.SharedBoard``)."""

    def __init__(self) -> None:
        self.slots = ["", ""]

    def set(self, lane: int, text: str) -> None:
        self.slots[lane] = text

    def get(self, lane: int) -> str:
        return self.slots[lane]


class DistWork(Work):
    """An ``isend``/``irecv`` in flight; its event spans from the post to the end of ``wait``.
    ``works`` are torch's works in order (the envelope's first, when messages are checked);
    ``envelope`` is the received envelope a receive checks before its data counts."""

    def __init__(self, comm: Any, works: list[Any], op: str, tensor: torch.Tensor,
                 peer: int, tag: int, start: float, envelope: torch.Tensor | None = None,
                 text: tuple[str, str] | None = None) -> None:
        self.comm, self.works, self.op, self.tensor = comm, works, op, tensor
        self.peer, self.tag, self.start, self.done = peer, tag, start, False
        self.envelope = envelope
        self.lane = comm.lane
        # what wait() waits for, in words and as a board line (``comm.message_text``)
        self.text = text or comm.message_text(op, tensor, peer, tag, "waiting for its ")
        # wait_any: gloo's works do not report completion before wait(), so a thread waits
        # (made by wait_in_background, only for the works that wait_any is given)
        self.waiter: threading.Thread | None = None
        self.completed: threading.Event | None = None
        self.error: BaseException | None = None

    def wait_in_background(self) -> None:
        """Start a thread that waits for this work and sets ``completed`` (once)."""
        if self.waiter is not None or self.done:
            return
        self.completed = threading.Event()

        def run() -> None:
            try:
                for work in self.works:
                    work.wait()
            except BaseException as exc:  # noqa: BLE001 - raised again by wait()
                self.error = exc
            self.completed.set()

        self.waiter = threading.Thread(target=run, daemon=True, name="wait-any")
        self.waiter.start()

    def wait(self) -> None:
        if self.done:
            return
        comm = self.comm
        if self.op == "recv" and self.envelope is None:
            comm.check_size_first()  # inside sized_by: the other rank's tensor first
        with comm.waiting(*self.text):
            if self.waiter is None:
                for index, work in enumerate(self.works):
                    work.wait()
                    if index == 0:
                        self._check()
            else:
                self.waiter.join()
                if self.error is not None:
                    raise self.error
                self._check()
            comm.sync()
        self.done = True
        comm.record_message(self.op, self.tensor, self.peer, self.tag, self.start)
        with comm.lock:
            comm.in_flight.discard(self)

    def _check(self) -> None:
        if self.envelope is not None:
            check_envelope(self.envelope, self.tensor, self.peer, self.comm.rank, self.tag,
                           self.comm.envelope_of(self.tensor))


class QuickWork(Work):
    """A message posted inside ``DistCommunicator.neighbours``: one torch work, checked
    (``head``: the burst's size check, for a receive) when first waited, and recorded by
    the block when it ends, with the time the wait returned (``end``)."""

    __slots__ = ("comm", "work", "op", "tensor", "peer", "tag", "start", "head", "done",
                 "end", "nbytes")

    def __init__(self, comm: Any, work: Any, op: str, tensor: torch.Tensor, peer: int,
                 tag: int, start: float, head: Any, nbytes: int) -> None:
        self.comm, self.work, self.op, self.tensor = comm, work, op, tensor
        self.peer, self.tag, self.start, self.head, self.done = peer, tag, start, head, False
        self.end, self.nbytes = 0.0, nbytes

    def wait(self) -> None:
        if self.done:
            return
        if self.head is not None:
            self.head.check()  # the other rank's tensor first (``sized_by``)
        self.work.wait()
        comm = self.comm
        comm.sync()
        self.end, self.done = comm.now(), True


def check_args(rank: int, world_size: int, device: torch.device, op: str,
           tensor: torch.Tensor, peer: int, tag: int) -> None:
    """The arguments of a send or receive, checked before anything is posted."""
    check_peer(rank, world_size, op, tensor, peer)
    if tensor.is_meta:
        raise ValueError(f"{op} of a meta tensor: meta tensors hold no data, so they only "
                         "travel on the simulator (backend='sim')")
    if tensor.device != device:
        raise ValueError(f"rank {rank}: {op} of a tensor on {tensor.device}, but this "
                         f"backend's tensors live on {device}: use "
                         "tensor.to(comm.device)")
    if op == "recv" and not tensor.is_contiguous():
        raise ValueError("recv needs a contiguous tensor to fill: pass tensor.contiguous() "
                         "and copy the result back")
    if tag < 0:
        raise ValueError(f"tag must be >= 0, got {tag}")


def wait_first(comm: Any, works: Sequence[Work]) -> int:
    """``comm.wait_any``: the index of the first of ``works`` to complete, waited on."""
    works = list(works)
    if not works or not all(isinstance(w, DistWork) for w in works):
        raise TypeError("wait_any needs a non-empty list of works from isend/irecv")
    for work in works:
        work.wait_in_background()
    with comm.blocked("waiting for the first of " + "; ".join(
            describe(w.op, w.tensor, w.peer, w.tag, w.lane == STREAM) for w in works)):
        while True:
            for index, work in enumerate(works):
                if work.done or (work.completed is not None and work.completed.is_set()):
                    break
            else:
                time.sleep(POLL_S)
                continue
            break
    works[index].wait()
    return index


class JobWork(Work):
    """A job on the comm stream (``run_async``)."""

    def __init__(self, comm: Any, future: Future) -> None:
        self.comm, self.future = comm, future

    def wait(self) -> Any:
        with self.comm.blocked("waiting for a job on its comm stream"):
            return self.future.result()


class DistMemory(MemoryRecorder):
    """Memory records on a real device, with the wall-clock time of each change."""

    def __init__(self, comm: Any, ledger: MemoryLedger) -> None:
        self.comm, self.ledger = comm, ledger
        self.events: list[MemoryEvent] = []
        self.held: dict[int, tuple[str, int, str]] = {}

    def alloc(self, category: str, nbytes: int, label: str = "") -> int:
        with self.comm.lock:
            token = self.ledger.alloc(category, nbytes, label)
            self.held[token] = (category, nbytes, label)
            self._record(category, nbytes, label)
        return token

    def free(self, token: int) -> None:
        with self.comm.lock:
            self.ledger.free(token)
            category, nbytes, label = self.held.pop(token)
            self._record(category, -nbytes, label)

    def _record(self, category: str, delta: int, label: str) -> None:
        self.events.append(MemoryEvent(self.comm.global_rank, self.comm.now(), category, delta,
                                       label, self.ledger.current()))


def device_capacity(device: torch.device) -> int:
    """Bytes of memory the device has: the GPU's total, or the machine's RAM for the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except ImportError:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class Stream:
    """A rank's communication stream: one daemon thread that runs submitted jobs in order."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._loop, daemon=True,
                                       name=f"rank-{comm.rank}-stream")
        self.thread.start()

    def submit(self, fn: Callable[..., Any], args: tuple) -> Future:
        future: Future = Future()
        self.jobs.put((fn, args, future))
        return future

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()

    def _loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            self.comm.board.set(STREAM, "running")
            self.comm.run_stream_job(*job)
