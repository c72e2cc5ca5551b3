"""The torch.distributed backend: the same ``Communicator``, on real processes.

Each rank is a process; ``send``/``recv`` are ``torch.distributed`` point-to-point messages and
the trace is *measured* with the wall clock. Where the simulator counts FLOPs and replays a cost
model, this backend reads ``time.perf_counter``, so its timeline includes Python overhead, the
operating system and whatever else the machine is doing.

Backends. ``gloo`` runs on CPU and honours tags: a receive matches the send with the same tag,
whatever order they are posted in. ``nccl`` runs on GPUs and *ignores* tags: messages between
two ranks match in the order they are posted, so a program that relies on tags to reorder
messages works on gloo and the simulator but receives the wrong data on nccl.

Devices. ``comm.device`` is ``cpu`` for gloo and ``cuda:LOCAL_RANK`` for nccl. Tensors are not
moved for you: a strategy creates (or ``.to(comm.device)``) its tensors on ``comm.device``.

The communication stream. ``run_async`` runs jobs on a background thread, in order (FIFO).
That thread talks through its own process group, so its messages never meet the main
thread's, as on the simulator (where the two are separate channels); on nccl the separate
group also gives it its own NCCL communicators, so the two threads cannot interleave ops.

``launch(fn, 2, backend="gloo")`` runs ``fn`` on a pool of worker processes kept alive between
launches (``mpgpu_edu.comm.pool``); ``torchrun -m mpgpu_edu.run`` runs it under torchrun.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from mpgpu_edu.cluster.ledger import MemoryLedger
from mpgpu_edu.comm.base import RESERVED_TAG, CommStats, Communicator, MemoryRecorder, Work
from mpgpu_edu.comm.base import nbytes_of
from mpgpu_edu.comm.errors import CommError, RankError
from mpgpu_edu.trace import Event, MemoryEvent

MAIN, STREAM = 0, 1  # lanes: the rank's program, and its communication stream
POLL_S = 1e-4  # wait_any polls its works this often


class NotPicklableError(ValueError):
    """The function (or an argument) cannot be sent to worker processes."""


class WorkerDiedError(RankError):
    """A worker process exited in the middle of a job (``os._exit``, a crash, a kill)."""

    def __init__(self, rank: int, exitcode: int | None) -> None:
        self.rank, self.original, self.rank_traceback = rank, None, ""
        self.exitcode = exitcode
        how = (f"killed by signal {-exitcode}" if exitcode is not None and exitcode < 0
               else f"exit code {exitcode}")
        CommError.__init__(self, f"rank {rank}'s worker process died during the job ({how}); "
                           "every other rank was stopped. Something ended the process "
                           "without a Python exception: os._exit, sys.exit in a thread, a "
                           "crash inside C++ (segfault) or running out of memory.")


@dataclass
class Lanes:
    """The process groups of one process: ``main`` for the rank's program (``None``: the
    default group) and ``stream`` for its communication stream; and the rank's device.
    Made once per process, by every rank at the same point (``init_lanes``)."""

    main: Any
    stream: Any
    device: torch.device


def init_lanes(backend: str) -> Lanes:
    """After ``dist.init_process_group``: pick the device and make the stream's group."""
    device = torch.device("cpu")
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count()))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    return Lanes(None, dist.new_group(backend=backend), device)


class OpBoard:
    """Where a rank writes what it is blocked on, so that its launcher can read it while the
    rank is stuck inside C++. The default keeps it in this process; the pool's workers use
    shared memory (``pool.SharedBoard``)."""

    def __init__(self) -> None:
        self.slots = ["", ""]

    def set(self, lane: int, text: str) -> None:
        self.slots[lane] = text


def describe(op: str, tensor: torch.Tensor, peer: int, tag: int, lane: int = MAIN) -> str:
    """``"recv from rank 0, tag 0, 16 bytes (float32 [4])"``: a pending message, in words."""
    what = f"send to rank {peer}" if op == "send" else f"recv from rank {peer}"
    dtype = str(tensor.dtype).replace("torch.", "")
    tag_text = f"barrier round {tag - RESERVED_TAG}" if tag >= RESERVED_TAG else f"tag {tag}"
    return (f"{what}, {tag_text}, {nbytes_of(tensor)} bytes ({dtype} {list(tensor.shape)})"
            + (", on its comm stream" if lane == STREAM else ""))


class DistWork(Work):
    """An ``isend``/``irecv`` in flight; its event spans from the post to the end of ``wait``."""

    def __init__(self, comm: DistCommunicator, work: Any, op: str, tensor: torch.Tensor,
                 peer: int, tag: int, start: float) -> None:
        self.comm, self.work, self.op, self.tensor = comm, work, op, tensor
        self.peer, self.tag, self.start, self.done = peer, tag, start, False
        self.lane = comm.lane
        # wait_any: gloo's works do not report completion before wait(), so a thread waits
        self.waiter: threading.Thread | None = None
        self.completed = threading.Event()
        self.error: BaseException | None = None

    def wait_in_background(self) -> None:
        """Start a thread that waits for this work and sets ``completed`` (once)."""
        if self.waiter is not None or self.done:
            return

        def run() -> None:
            try:
                self.work.wait()
            except BaseException as exc:  # noqa: BLE001 - raised again by wait()
                self.error = exc
            self.completed.set()

        self.waiter = threading.Thread(target=run, daemon=True, name="wait-any")
        self.waiter.start()

    def wait(self) -> None:
        if self.done:
            return
        comm = self.comm
        what = describe(self.op, self.tensor, self.peer, self.tag, self.lane)
        with comm.blocked("waiting for its " + what):
            if self.waiter is None:
                self.work.wait()
            else:
                self.waiter.join()
                if self.error is not None:
                    raise self.error
            comm.sync()
        self.done = True
        comm.record_message(self.op, self.tensor, self.peer, self.tag, self.start)
        with comm.lock:
            comm.in_flight.discard(self)


class _JobWork(Work):
    def __init__(self, comm: DistCommunicator, future: Future) -> None:
        self.comm, self.future = comm, future

    def wait(self) -> Any:
        with self.comm.blocked("waiting for a job on its comm stream"):
            return self.future.result()


class DistMemory(MemoryRecorder):
    """Memory records on a real device, with the wall-clock time of each change."""

    def __init__(self, comm: DistCommunicator, ledger: MemoryLedger) -> None:
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


class DistCommunicator(Communicator):
    """One rank of a ``torch.distributed`` job. Call ``start_clock()`` on every rank before
    the program (a barrier: time 0 is the same moment everywhere, to within the barrier's
    latency) and ``finish()`` after it (drains the comm stream and unwaited messages)."""

    def __init__(self, lanes: Lanes, board: OpBoard | None = None,
                 on_stream_error: Callable[[BaseException], None] | None = None) -> None:
        self.lanes, self.board = lanes, board or OpBoard()
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.stats = CommStats()
        self.events: list[Event] = []
        self.logs: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.in_flight: set[DistWork] = set()
        self.t0 = time.perf_counter()
        self._local = threading.local()
        self._stream: _Stream | None = None
        self._on_stream_error = on_stream_error
        ledger = MemoryLedger(self.rank, device_capacity(lanes.device), str(lanes.device))
        self._memory = DistMemory(self, ledger)

    @property
    def device(self) -> torch.device:
        return self.lanes.device

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
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @property
    def lane(self) -> int:
        return getattr(self._local, "lane", MAIN)

    @contextlib.contextmanager
    def blocked(self, text: str) -> Iterator[None]:
        """Show ``text`` on the board while this lane waits (read by the launcher on timeout)."""
        lane = self.lane
        self.board.set(lane, text)
        try:
            yield
        finally:
            self.board.set(lane, "running")

    def record_message(self, op: str, tensor: torch.Tensor, peer: int, tag: int,
                       start: float) -> None:
        nbytes, end = nbytes_of(tensor), self.now()
        label = f"tag {tag}" if tag else (f"to {peer}" if op == "send" else f"from {peer}")
        with self.lock:
            if op == "send":
                self.stats.record_send(peer, nbytes)
            else:
                self.stats.record_recv(peer, nbytes)
            self.events.append(Event(self.rank, "comm", op, start, end, label, nbytes=nbytes,
                                     peer=peer))

    # ---- point to point -------------------------------------------------------------------
    def _check(self, op: str, tensor: torch.Tensor, peer: int, tag: int) -> None:
        if not 0 <= peer < self.world_size:
            raise ValueError(f"rank {self.rank}: peer {peer} does not exist (world size "
                             f"{self.world_size}, ranks 0..{self.world_size - 1})")
        if peer == self.rank:
            raise ValueError(f"rank {self.rank} tries to {op} to/from itself: a rank already "
                             "has its own data, skip the message")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{op} needs a torch.Tensor, got {type(tensor).__name__}")
        if tensor.is_meta:
            raise ValueError(f"{op} of a meta tensor: meta tensors hold no data, so they only "
                             "travel on the simulator (backend='sim')")
        if tensor.device != self.device:
            raise ValueError(f"rank {self.rank}: {op} of a tensor on {tensor.device}, but this "
                             f"backend's tensors live on {self.device}: use "
                             "tensor.to(comm.device)")
        if op == "recv" and not tensor.is_contiguous():
            raise ValueError("recv needs a contiguous tensor to fill: pass tensor.contiguous() "
                             "and copy the result back")
        if tag < 0:
            raise ValueError(f"tag must be >= 0, got {tag}")

    def _group(self) -> Any:
        """The calling thread's process group: the comm stream has its own."""
        return self.lanes.stream if self.lane == STREAM else self.lanes.main

    def _blocking(self, op: str, tensor: torch.Tensor, peer: int, tag: int) -> None:
        self._check(op, tensor, peer, tag)
        start = self.now()
        with self.blocked(describe(op, tensor, peer, tag, self.lane)):
            if op == "send":
                dist.send(tensor.contiguous(), peer, group=self._group(), tag=tag)
            else:
                dist.recv(tensor, peer, group=self._group(), tag=tag)
            self.sync()
        self.record_message(op, tensor, peer, tag, start)

    def _post(self, op: str, tensor: torch.Tensor, peer: int, tag: int) -> DistWork:
        self._check(op, tensor, peer, tag)
        start = self.now()
        if op == "send":
            tensor = tensor.contiguous()
            work = dist.isend(tensor, peer, group=self._group(), tag=tag)
        else:
            work = dist.irecv(tensor, peer, group=self._group(), tag=tag)
        handle = DistWork(self, work, op, tensor, peer, tag, start)
        with self.lock:
            self.in_flight.add(handle)
        return handle

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
        if not sources or len(set(sources)) != len(sources):
            raise ValueError(f"rank {self.rank}: recv_any needs a list of distinct source "
                             f"ranks, got {sources}")
        for src in sources:
            self._check("recv", tensor, src, tag)
        start = self.now()
        what = f"recv from any of ranks {sources}, tag {tag}, {nbytes_of(tensor)} bytes"
        with self.blocked(what):
            src = dist.recv(tensor, None, group=self._group(), tag=tag)
            self.sync()
        self.record_message("recv", tensor, src, tag, start)
        if src not in sources:
            raise ValueError(f"rank {self.rank}: recv_any from ranks {sources} received a "
                             f"message from rank {src} (tag {tag}): on torch.distributed any "
                             "rank's message on that tag matches; keep other ranks off it")
        return src

    def wait_any(self, works: Sequence[Work]) -> int:
        """A thread waits on each work (gloo's works do not report completion before
        ``wait``); the first whose thread is done (lowest index among those) is waited on."""
        works = list(works)
        if not works or not all(isinstance(w, DistWork) for w in works):
            raise TypeError("wait_any needs a non-empty list of works from isend/irecv")
        for work in works:
            work.wait_in_background()
        with self.blocked("waiting for the first of " + "; ".join(
                describe(w.op, w.tensor, w.peer, w.tag, w.lane) for w in works)):
            while True:
                for index, work in enumerate(works):
                    if work.done or work.completed.is_set():
                        break
                else:
                    time.sleep(POLL_S)
                    continue
                break
        works[index].wait()
        return index

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
            self.events.append(Event(self.rank, "compute", kind, start, self.now(), label))

    def run_async(self, fn: Callable[..., Any], *args: Any) -> Work:
        if self.lane != MAIN:
            raise RuntimeError("run_async is called from the rank's program, not from a job "
                               "already on the comm stream")
        if self._stream is None:
            self._stream = _Stream(self)
        return _JobWork(self, self._stream.submit(fn, args))

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


class _Stream:
    """A rank's communication stream: one daemon thread that runs submitted jobs in order."""

    def __init__(self, comm: DistCommunicator) -> None:
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


def launch_dist(fn: Callable[..., Any], cluster: Any, args: tuple, kwargs: dict,
                backend: str = "gloo", timeout: float = 60.0) -> Any:
    """Run ``fn(comm, *args, **kwargs)`` on ``cluster`` worker processes (an int, or a
    ``Cluster`` whose world size is used) and gather a ``LaunchResult``; see ``pool``."""
    from mpgpu_edu.comm.pool import run_job

    return run_job(fn, cluster, args, kwargs, backend, timeout)
