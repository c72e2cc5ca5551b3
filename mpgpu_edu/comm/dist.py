"""The torch.distributed backend: the same ``Communicator``, on real processes.

Each rank is a process; ``send``/``recv`` are ``torch.distributed`` point-to-point messages
and the trace is *measured* with the wall clock (Python overhead and the operating system
included). ``gloo`` runs on CPU and honours tags; ``nccl`` runs on GPUs and *ignores* tags
(messages between two ranks match in the order they are posted). ``comm.device`` is ``cpu``
for gloo and ``cuda:LOCAL_RANK`` for nccl; tensors are not moved for you.

On gloo every message carries an envelope (``comm.envelope``), so a receive into a buffer of
another size, shape or dtype fails as on the simulator. A wait longer than the process
group's timeout raises ``MessageTimeoutError`` naming the message. ``run_async`` jobs run on
a thread with its own process group (``dist_work.Stream``), the real twin of the
simulator's second lane. ``launch(fn, 2, backend="gloo")`` runs ranks on the runtime's
worker pool (``comm.pool``); ``torchrun -m mpgpu_edu.run`` runs them under torchrun.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed as dist

from mpgpu_edu.cluster.ledger import MemoryLedger
from mpgpu_edu.comm.base import CommStats, Communicator, Work, nbytes_of
from mpgpu_edu.comm.dist_work import (MAIN, STREAM, DistMemory, DistWork, JobWork, Lanes,
                                      OpBoard, QuickWork, Stream, check_args,
                                      device_capacity, init_lanes, wait_first)
from mpgpu_edu.comm.dist_errors import (MessageTimeoutError, NotPicklableError, PeerLostError,
                                       WorkerDiedError)
from mpgpu_edu.comm.envelope import (block_check_tag, check_envelope, check_same_tensor,
                                     checking_from_env, empty_envelope, envelope,
                                     sized_tag)
from mpgpu_edu.comm.errors import Pending
from mpgpu_edu.comm.message import check_sources, describe
from mpgpu_edu.cluster.trace import Event

__all__ = ["MAIN", "STREAM", "DistCommunicator", "Lanes", "MessageTimeoutError",
           "NotPicklableError", "OpBoard", "PeerLostError", "WorkerDiedError", "describe",
           "init_lanes"]


class DistCommunicator(Communicator):
    """One rank of a ``torch.distributed`` job. Call ``start_clock()`` on every rank before
    the program (a barrier: time 0 is the same moment everywhere, to within the barrier's
    latency) and ``finish()`` after it (drains the comm stream and unwaited messages)."""

    def __init__(self, lanes: Lanes, board: OpBoard | None = None,
                 on_stream_error: Callable[[BaseException], None] | None = None,
                 check_messages: bool | None = None) -> None:
        self.lanes, self.board = lanes, board or OpBoard()
        self._cuda = lanes.device.type == "cuda"
        if check_messages is None:
            check_messages = checking_from_env()
        self.backend = dist.get_backend()
        self.checked = check_messages and self.backend == "gloo"
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.stats = CommStats()
        self._events: list[Event] = []
        self._raw: list[tuple] = []  # neighbours' messages, made into events when read
        self.logs: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.in_flight: set[DistWork] = set()
        self.t0 = time.perf_counter()
        self._local = threading.local()
        self._texts: dict[tuple, tuple[str, str]] = {}  # a message's words and board line
        self._envelopes: dict[tuple, torch.Tensor] = {}  # the envelope of a dtype and shape
        self._bursts: dict[tuple, _BurstKind] = {}  # a neighbours block's groups and words
        self._stream: Stream | None = None
        self._on_stream_error = on_stream_error
        ledger = MemoryLedger(self.rank, device_capacity(lanes.device), str(lanes.device))
        self._memory = DistMemory(self, ledger)

    @property
    def device(self) -> torch.device:
        return self.lanes.device

    @property
    def collectives_at_once(self) -> int:
        return 2 if self.backend == "gloo" else 1

    @property
    def events(self) -> list[Event]:
        """The rank's trace so far (``neighbours``' messages are kept as plain tuples until
        the events are read: an event costs microseconds to make)."""
        if self._raw:
            with self.lock:
                raw, self._raw = self._raw, []
                self._events.extend(Event(self.rank, "comm", *r) for r in raw)
        return self._events

    @property
    def memory(self) -> DistMemory:
        return self._memory

    # ---- clock and bookkeeping ------------------------------------------------------------
    def start_clock(self) -> None:
        self.board.set(MAIN, "at the start barrier (waiting for the other ranks to start)")
        dist.barrier(group=self.lanes.main)
        self.t0 = time.perf_counter()
        self.board.set(MAIN, "running")

    def now(self) -> float:
        """Seconds since ``start_clock``."""
        return time.perf_counter() - self.t0

    def sync(self) -> None:
        """Wait for the GPU's queued work, so that the wall clock measures it (CUDA only)."""
        if self._cuda:
            torch.cuda.synchronize(self.device)

    @property
    def lane(self) -> int:
        return getattr(self._local, "lane", MAIN)

    @contextlib.contextmanager
    def blocked(self, text: str, op: str = "other", peer: int | None = None,
                tag: int | None = None) -> Iterator[None]:
        """Show what this lane waits in on the board while it waits (read by the launcher on
        a timeout, which rebuilds it as a ``Pending``): ``text`` in words, and for a send or
        receive (``op``) its ``peer`` and ``tag`` as data."""
        with self.waiting(text, Pending(self.rank, op, text, peer, tag).to_line()):
            yield

    def waiting(self, text: str, line: str) -> _Waiting:
        """``blocked`` with its board ``line`` made already (``message_text``): what every
        send, receive and wait uses, so that waiting costs no formatting."""
        return _Waiting(self, text, line)

    def message_text(self, op: str, tensor: torch.Tensor, peer: int, tag: int,
                     prefix: str = "") -> tuple[str, str]:
        """A message's words (``prefix`` + ``describe``) and its board line, made once per
        kind of message (a ring sends the same few shapes over and over), then looked up."""
        on_stream = self.lane == STREAM
        key = (op, tensor.dtype, tensor.shape, peer, tag, on_stream, prefix)
        found = self._texts.get(key)
        if found is None:
            text = prefix + describe(op, tensor, peer, tag, on_stream)
            found = _remember(self._texts, key,
                              (text, Pending(self.rank, op, text, peer, tag).to_line()))
        return found

    def envelope_of(self, tensor: torch.Tensor) -> torch.Tensor:
        """``envelope(tensor)``, made once per dtype and shape (only ever read: sent, or
        compared with a received one)."""
        key = (tensor.dtype, tensor.shape)
        found = self._envelopes.get(key)
        if found is None:
            found = _remember(self._envelopes, key, envelope(tensor))
        return found

    def burst_text(self, send_to: int, recv_from: int, tag: int) -> tuple[str, str]:
        """``neighbours``' words and board line, made once per pair of peers and tag."""
        key = ("neighbours", send_to, recv_from, tag, self.lane == STREAM)
        found = self._texts.get(key)
        if found is None:
            text = (f"waiting for its messages to rank {send_to} and from rank {recv_from}, "
                    f"tag {tag}")
            found = _remember(self._texts, key, (text, Pending(
                self.rank, "recv", text, recv_from, tag).to_line()))
        return found

    def record_message(self, op: str, tensor: torch.Tensor, peer: int, tag: int,
                       start: float) -> None:
        nbytes, end, label = nbytes_of(tensor), self.now(), _label(op, peer, tag)
        with self.lock:
            if op == "send":
                self.stats.record_send(peer, nbytes)
            else:
                self.stats.record_recv(peer, nbytes)
            self._events.append(Event(self.rank, "comm", op, start, end, label, nbytes=nbytes,
                                     peer=peer))

    def record_burst(self, works: list[QuickWork], send_to: int, recv_from: int,
                     tag: int) -> None:
        """``record_message`` for each of a ``neighbours`` block's messages, under one lock,
        with the time each wait returned: the same events and counts."""
        if not works:
            return
        sent, got = _label("send", send_to, tag), _label("recv", recv_from, tag)
        stats, raw = self.stats, self._raw
        out = into = sends = recvs = 0
        with self.lock:
            for work in works:
                nbytes = work.nbytes
                if work.op == "send":
                    out, sends = out + nbytes, sends + 1
                    raw.append(("send", work.start, work.end, sent, nbytes, 0.0, send_to))
                else:
                    into, recvs = into + nbytes, recvs + 1
                    raw.append(("recv", work.start, work.end, got, nbytes, 0.0, recv_from))
            if sends:  # once for the block
                stats.record_send(send_to, out, sends)
            if recvs:
                stats.record_recv(recv_from, into, recvs)

    def _checks_each(self) -> bool:
        """Whether this thread's messages carry an envelope now (not inside ``sized_by``)."""
        return self.checked and getattr(self._local, "sized", None) is None

    @contextlib.contextmanager
    def sized_by(self, tensor: torch.Tensor, send_to: int, recv_from: int,
                 tag: int = 0) -> Iterator[None]:
        """See ``Communicator.sized_by``. On gloo: one envelope, ``tensor``'s, goes to
        ``send_to`` before anything else inside, and ``recv_from``'s is checked before the
        first receive inside completes (or on the way out); the messages inside carry no
        envelope of their own: one small message instead of one per message."""
        if not self.checked or getattr(self._local, "sized", None) is not None:
            yield
            return
        head = self._local.sized = _Head.post(self, tensor, send_to, recv_from, tag)
        try:
            yield
            head.finish()
        finally:
            self._local.sized = None

    def neighbours(self, tensor: torch.Tensor, send_to: int, recv_from: int,
                   tag: int = 0) -> _Burst:
        """See ``Communicator.neighbours``. Here the peers, tag and device are checked once,
        the tensors' sizes once (one envelope, as ``sized_by``), and the board says once
        what the rank waits for; each message is then one ``dist.isend``/``dist.irecv``,
        and all are recorded (``record_burst``) when the block ends, from the times their
        waits saw: none of ``isend``'s checks, words and bookkeeping per message, and nothing
        but the wait itself between a message's arrival and the caller's next step. A
        message left unwaited is waited on the way out."""
        lane = self.lane
        kind = self._bursts.get((send_to, recv_from, tag, lane))
        # Peers and tag were checked when their kind was made; the tensor is checked every
        # time (fully, for the error's words, when the quick look finds anything amiss).
        if (kind is None or type(tensor) is not torch.Tensor
                or tensor.device != self.lanes.device or not tensor.is_contiguous()):
            self._check("send", tensor, send_to, tag)
            self._check("recv", tensor, recv_from, tag)
        if kind is None:  # what stays the same for these peers, tag and lane: made once
            kind = _remember(self._bursts, (send_to, recv_from, tag, lane),
                             self._burst_kind(send_to, recv_from, tag, lane))
        return _Burst(self, tensor, kind)

    def _burst_kind(self, send_to: int, recv_from: int, tag: int, lane: int) -> _BurstKind:
        """What a ``neighbours`` block between these peers, on this tag and lane, keeps from
        call to call: the groups to send and receive on, their send/recv, its words and
        board line. A message to a lower rank takes the lane's second connection
        (``Lanes``): on two ranks the ring's two directions then run at once. Both ends
        apply the same rule."""
        # The process groups themselves (the default one for None): each message is then
        # posted with the group's own send/recv, what dist.isend/irecv end in, without their
        # argument handling. Every lane's group spans all ranks: group rank = global rank.
        # Messages are dealt out over the lane's channels in turn (``Lanes.channels``).
        to = [dist.group.WORLD if g is None else g
              for g in self.lanes.channels(lane, self.rank, send_to)]
        source = [dist.group.WORLD if g is None else g
                  for g in self.lanes.channels(lane, recv_from, self.rank)]
        return _BurstKind(self, send_to, recv_from, tag, to, source,
                          *self.burst_text(send_to, recv_from, tag))

    # ---- point to point -------------------------------------------------------------------
    def _check(self, op: str, tensor: torch.Tensor, peer: int, tag: int) -> None:
        check_args(self.rank, self.world_size, self.device, op, tensor, peer, tag)

    def _group(self) -> Any:
        """The calling thread's process group: the comm stream has its own."""
        return self.lanes.stream if self.lane == STREAM else self.lanes.main

    def _blocking(self, op: str, tensor: torch.Tensor, peer: int, tag: int) -> None:
        self._check(op, tensor, peer, tag)
        start, group, checked = self.now(), self._group(), self._checks_each()
        with self.waiting(*self.message_text(op, tensor, peer, tag)):
            if op == "send":
                data = tensor.contiguous()
                head = self.envelope_of(data) if checked else None
                sent = dist.isend(head, peer, group=group, tag=tag) if checked else None
                dist.send(data, peer, group=group, tag=self._wire_tag(tag, data))
                if sent is not None:
                    sent.wait()
            else:
                if checked:
                    head = empty_envelope(self.device)
                    dist.recv(head, peer, group=group, tag=tag)
                    check_envelope(head, tensor, peer, self.rank, tag, self.envelope_of(tensor))
                else:
                    self.check_size_first()
                dist.recv(tensor, peer, group=group, tag=self._wire_tag(tag, tensor))
            self.sync()
        self.record_message(op, tensor, peer, tag, start)

    def _post(self, op: str, tensor: torch.Tensor, peer: int, tag: int) -> DistWork:
        self._check(op, tensor, peer, tag)
        start, group, works, head = self.now(), self._group(), [], None
        checked = self._checks_each()
        if op == "send":
            tensor = tensor.contiguous()
            if checked:
                works.append(dist.isend(self.envelope_of(tensor), peer, group=group, tag=tag))
            works.append(dist.isend(tensor, peer, group=group, tag=self._wire_tag(tag, tensor)))
        else:
            if checked:
                head = empty_envelope(self.device)
                works.append(dist.irecv(head, peer, group=group, tag=tag))
            works.append(dist.irecv(tensor, peer, group=group, tag=self._wire_tag(tag, tensor)))
        handle = DistWork(self, works, op, tensor, peer, tag, start, head,
                          self.message_text(op, tensor, peer, tag, "waiting for its "))
        with self.lock:
            self.in_flight.add(handle)
        return handle

    def _wire_tag(self, tag: int, tensor: torch.Tensor) -> int:
        """The torch tag of a message: inside a ``sized_by`` block, whose messages carry no
        envelope each, its size folded in (``envelope.sized_tag``), so that it never lands
        in a receive of another size before the block's envelope is checked."""
        if getattr(self._local, "sized", None) is None:
            return tag
        return sized_tag(tag, nbytes_of(tensor))

    def check_size_first(self) -> None:
        """Inside ``sized_by``: before a receive completes, the other rank's tensor must
        have been checked (its envelope came first)."""
        head = getattr(self._local, "sized", None)
        if head is not None:
            head.check()

    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        self._blocking("send", tensor, dst, tag)

    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> None:
        self._blocking("recv", tensor, src, tag)

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Work:
        return self._post("send", tensor, dst, tag)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Work:
        return self._post("recv", tensor, src, tag)

    def recv_any(self, tensor: torch.Tensor, sources: Sequence[int], tag: int = 0) -> int:
        """``torch.distributed.recv`` with ``src=None`` (gloo; NCCL has no receive from any
        source: post one ``irecv`` per source and use ``wait_any`` there). The first
        message on ``tag`` from *any* rank matches, so one from a rank outside ``sources``
        is an error here."""
        sources = list(sources)
        check_sources(self.rank, sources)
        for src in sources:
            self._check("recv", tensor, src, tag)
        start = self.now()
        what = f"recv from any of ranks {sources}, tag {tag}, {nbytes_of(tensor)} bytes"
        with self.blocked(what):
            head = empty_envelope(self.device) if self.checked else tensor
            src = dist.recv(head, None, group=self._group(), tag=tag)
            if self.checked:
                check_envelope(head, tensor, src, self.rank, tag)
                dist.recv(tensor, src, group=self._group(), tag=tag)
            self.sync()
        self.record_message("recv", tensor, src, tag, start)
        if src not in sources:
            raise ValueError(f"rank {self.rank}: recv_any from ranks {sources} received a "
                             f"message from rank {src} (tag {tag}): on torch.distributed any "
                             "rank's message on that tag matches; keep other ranks off it")
        return src

    def wait_any(self, works: Sequence[Work]) -> int:
        return wait_first(self, works)  # a thread waits on each work; the first done wins

    # ---- compute, async jobs, logs --------------------------------------------------------
    @contextlib.contextmanager
    def compute(self, kind: str = "compute", label: str = "",
                seconds: float | None = None) -> Iterator[None]:
        """Measured wall clock. ``seconds`` is a stand-in duration: the region lasts at least
        that long (the rank sleeps for the rest), so a schedule written with made-up compute
        times shows the same shape here as on the simulator."""
        if getattr(self._local, "in_region", False):  # nested: counted by the outer region
            yield
            return
        self._local.in_region = True
        self.sync()
        start = self.now()
        try:
            yield
            self.sync()
            if seconds is not None and self.now() - start < seconds:
                time.sleep(seconds - (self.now() - start))
        finally:
            self._local.in_region = False
        with self.lock:
            self._events.append(Event(self.rank, "compute", kind, start, self.now(), label))

    def run_async(self, fn: Callable[..., Any], *args: Any) -> Work:
        if self.lane != MAIN:
            raise RuntimeError("run_async is called from the rank's program, not from a job "
                               "already on the comm stream")
        if self._stream is None:
            self._stream = Stream(self)
        return JobWork(self, self._stream.submit(fn, args))

    def run_stream_job(self, fn: Callable[..., Any], args: tuple, future: Future) -> None:
        """Body of the stream thread for one job (the thread calls it)."""
        self._local.lane = STREAM
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter and the launcher
            future.set_exception(exc)
            if self._on_stream_error is not None:
                self._on_stream_error(exc)
        finally:
            self.board.set(STREAM, "")

    def log(self, text: str) -> None:
        with self.lock:
            self.logs.append((self.now(), str(text)))

    def finish(self) -> None:
        """After the program: run the comm stream's remaining jobs, then complete every
        message that was posted but never waited for (a missing recv hangs here, and the
        launcher's timeout names it)."""
        if self._stream is not None:
            with self.blocked("waiting for the jobs left on its comm stream"):
                self._stream.close()
        for work in sorted(self.in_flight, key=lambda w: w.start):
            work.wait()
        self.board.set(MAIN, "finished")



class _Waiting:
    """The context of ``DistCommunicator.waiting``: a small class rather than a generator,
    as it runs around every message. Errors that mean a timeout or a lost peer become
    ``MessageTimeoutError`` / ``PeerLostError`` naming ``text``."""

    __slots__ = ("comm", "lane", "line", "text")

    def __init__(self, comm: DistCommunicator, text: str, line: str) -> None:
        self.comm, self.text, self.line = comm, text, line
        self.lane = comm.lane

    def __enter__(self) -> None:
        self.comm.board.set(self.lane, self.line)

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        self.comm.board.set(self.lane, "running")
        if isinstance(exc, RuntimeError):
            words = str(exc).lower()
            if "timed out" in words or "timeout" in words:
                raise MessageTimeoutError(self.comm.rank, self.text, str(exc)) from None
            if "by peer" in words or "connection closed" in words:
                raise PeerLostError(self.comm.rank, self.text, str(exc)) from None


class _BurstKind:
    """What ``neighbours`` blocks between the same peers, on the same tag and lane, share:
    made once (``DistCommunicator._burst_kind``), so that a block's entry does no more than
    it must. ``groups``/``sources``: the channels' process groups to send and receive on,
    ``sends``/``recvs`` their send and recv; ``waiting``: the board's line while the block
    runs."""

    __slots__ = ("send_to", "recv_from", "tag", "groups", "sources", "sends", "recvs",
                 "waiting")

    def __init__(self, comm: DistCommunicator, send_to: int, recv_from: int, tag: int,
                 groups: list[Any], sources: list[Any], text: str, line: str) -> None:
        self.send_to, self.recv_from, self.tag = send_to, recv_from, tag
        self.groups, self.sources = groups, sources
        self.sends, self.recvs = [g.send for g in groups], [g.recv for g in sources]
        self.waiting = _Waiting(comm, text, line)


class _Burst:
    """``DistCommunicator.neighbours``' block: a class, not a generator, as it runs around
    every call of the fast ring. Entering posts the envelope (when messages are checked and
    no ``sized_by`` block is open) and yields ``(isend, irecv)``; leaving waits what is left,
    checks the envelope, and records every message."""

    __slots__ = ("comm", "tensor", "kind", "posted", "head")

    def __init__(self, comm: DistCommunicator, tensor: torch.Tensor, kind: _BurstKind) -> None:
        self.comm, self.tensor, self.kind = comm, tensor, kind
        self.posted: list[QuickWork] = []
        self.head: _Head | None = None

    def __enter__(self) -> tuple[Callable[[torch.Tensor], Work],
                                 Callable[[torch.Tensor], Work]]:
        comm, posted, kind = self.comm, self.posted, self.kind
        send_to, recv_from, tag = kind.send_to, kind.recv_from, kind.tag
        head = getattr(comm._local, "sized", None)  # an enclosing sized_by checks for us
        if head is None and comm.checked:  # the size check (post_block: its receive ahead)
            head = self.head = comm._local.sized = _Head.post_block(
                comm, self.tensor, send_to, recv_from, tag, kind.groups[0], kind.sources[0])
        now = comm.now
        kind.waiting.__enter__()

        # Message i goes on channel i % k, at both ends: a ring's sends to its right
        # neighbour are the receives it posts, one for one, in the same order.
        sends, recvs, k = kind.sends, kind.recvs, len(kind.sends)
        sent_count, received_count = 0, 0
        own = self.head  # this block's envelope, sent after its first message

        def isend(t: torch.Tensor) -> Work:
            nonlocal own, sent_count
            nbytes = t.numel() * t.element_size()
            send, sent_count = sends[sent_count % k], sent_count + 1
            sent = send([torch.view_as_real(t) if t.is_complex() else t], send_to,
                        sized_tag(tag, nbytes))
            work = QuickWork(comm, sent, "send", t, send_to, tag, now(), None, nbytes)
            posted.append(work)
            if own is not None:
                own.send_mine()
                own = None
            return work

        def irecv(t: torch.Tensor) -> Work:
            nonlocal received_count
            nbytes = t.numel() * t.element_size()
            recv, received_count = recvs[received_count % k], received_count + 1
            got = recv([torch.view_as_real(t) if t.is_complex() else t], recv_from,
                       sized_tag(tag, nbytes))
            work = QuickWork(comm, got, "recv", t, recv_from, tag, now(), head, nbytes)
            posted.append(work)
            return work

        return isend, irecv

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if kind is None:
            try:
                self._finish()
            except BaseException as error:
                self._close(type(error), error, error.__traceback__)
                raise
        self._close(kind, exc, tb)

    def _finish(self) -> None:
        for work in self.posted:
            work.wait()
        if self.head is not None:
            self.head.finish()

    def _close(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        """Record the messages that completed, then leave the board (where a timeout
        becomes ``MessageTimeoutError``)."""
        comm, burst = self.comm, self.kind
        if self.head is not None:
            comm._local.sized = None
        comm.record_burst([w for w in self.posted if w.done], burst.send_to, burst.recv_from,
                          burst.tag)
        burst.waiting.__exit__(kind, exc, tb)


class _Head:
    """``sized_by``'s envelope in flight (and ``neighbours'``): checked once, by the first
    receive that waits."""

    def __init__(self, comm: DistCommunicator, tensor: torch.Tensor, mine: torch.Tensor,
                 src: int, dst: int, tag: int) -> None:
        self.comm, self.tensor, self.mine, self.src, self.tag = comm, tensor, mine, src, tag
        self.dst = dst
        self.theirs: torch.Tensor | None = None
        self.work: Any = None
        self.sent: Any = None
        self.done = False
        self.next: tuple | None = None  # post_block's: where the next envelope comes from

    @classmethod
    def post(cls, comm: DistCommunicator, tensor: torch.Tensor, send_to: int, recv_from: int,
             tag: int, groups: tuple[Any, Any] | None = None) -> _Head:
        """``tensor``'s envelope sent to ``send_to``, and ``recv_from``'s receive posted
        first, so that the left neighbour's lands at once; on ``groups`` (to, from), by
        default both the lane's own."""
        to, source = groups if groups is not None else (comm._group(), comm._group())
        head = cls(comm, tensor, comm.envelope_of(tensor), recv_from, send_to, tag)
        head.theirs = empty_envelope(comm.device)
        head.work = dist.irecv(head.theirs, recv_from, group=source, tag=tag)
        head.sent = dist.isend(head.mine, send_to, group=to, tag=tag)
        return head

    @classmethod
    def post_block(cls, comm: DistCommunicator, tensor: torch.Tensor, send_to: int,
                   recv_from: int, tag: int, to: Any, source: Any) -> _Head:
        """A ``neighbours`` block's envelope. Its receive was posted when the last block
        with the same peer, tag and lane passed its check (``rearm``; posted now for the
        first), and this rank's own leaves right after its first message (``send_mine``),
        behind it on the same connection. Waited for at the first data receive, the
        left neighbour's has then usually arrived. (Posted with the block, both ahead of the
        data, the check met the envelope late, the sender's thread busy writing its first
        segment, and held up the first addition by a quarter of a millisecond on 1 MiB.) It
        travels under its own tag (``block_check_tag``): nothing else meets a receive left
        waiting."""
        wire = block_check_tag(tag)
        if wire is None:
            return cls.post(comm, tensor, send_to, recv_from, tag, (to, source))
        head = cls(comm, tensor, comm.envelope_of(tensor), recv_from, send_to, tag)
        key = (comm.lane, recv_from, tag)
        ready = comm.lanes.checks.pop(key, None)
        if ready is None:
            head.theirs = empty_envelope(comm.device)
            head.work = source.recv([head.theirs], recv_from, wire)
        else:
            head.work, head.theirs = ready
        head.next = (key, to, source, wire)
        return head

    def send_mine(self) -> None:
        """A block's own envelope, once: after its first message, or on the way out."""
        if self.sent is None and self.next is not None:
            to, wire = self.next[1], self.next[3]
            self.sent = to.send([self.mine], self.dst, wire)

    def rearm(self) -> None:
        """Once a block's check has passed: the receive of the next block's envelope, posted
        while this block's data is still arriving."""
        if self.next is not None:
            key, _, source, wire = self.next
            theirs = empty_envelope(self.comm.device)
            self.comm.lanes.checks[key] = (source.recv([theirs], self.src, wire), theirs)

    def finish(self) -> None:
        """On the way out: the check (if no receive made it), then this rank's envelope
        delivered."""
        self.send_mine()
        self.check()
        comm = self.comm
        with comm.waiting(*comm.message_text("send", self.mine, self.dst, self.tag,
                                             "waiting for its size check, ")):
            self.sent.wait()

    def check(self) -> None:
        if self.done:
            return
        self.done = True
        comm = self.comm
        with comm.waiting(*comm.message_text("recv", self.theirs, self.src, self.tag,
                                             "waiting for its size check, ")):
            self.work.wait()
        check_same_tensor(self.theirs, self.tensor, self.src, comm.rank, self.mine)
        self.rearm()


def _label(op: str, peer: int, tag: int) -> str:
    """A message's label on the timeline: its tag, or where it went or came from."""
    return f"tag {tag}" if tag else (f"to {peer}" if op == "send" else f"from {peer}")


def _remember(cache: dict, key: tuple, value: Any) -> Any:
    """Store ``value`` under ``key`` in one of the communicator's lookups, emptied when it
    reaches 4096 entries (a program with ever new shapes must not grow it without end)."""
    if len(cache) >= 4096:
        cache.clear()
    cache[key] = value
    return value
