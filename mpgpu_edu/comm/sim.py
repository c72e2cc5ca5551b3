"""The simulated backend: every rank is a thread, tensors are real, time is simulated.

Execution and timing are separate. While the ranks run, a *router* matches each send with its
receive (the n-th send on a channel meets the n-th receive), copies the data and records every
operation in the rank's op list. Nothing here reads a clock. Afterwards ``replay`` turns the op
lists into a timeline with the cluster's cost model, so the same program always gives the same
trace, whatever the thread interleaving.

A blocking ``send`` returns only once the receiver has posted the matching receive
(synchronous send), so an ordering that can hang NCCL or gloo hangs here too, and is reported
as a ``DeadlockError`` by the router (``comm.router``), which also serves ``recv_any`` and
``wait_any`` without a clock.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from mpgpu_edu.comm import ops
from mpgpu_edu.comm.base import CommStats, Communicator, MemoryRecorder, Work
from mpgpu_edu.comm.errors import Aborted
from mpgpu_edu.comm.flops import FlopCount
from mpgpu_edu.comm.message import check_peer, check_sources, kind_of
from mpgpu_edu.comm.router import Actor, AnyRequest, Posted, Router


class _PostWork(Work):
    def __init__(self, comm: SimCommunicator, posted: Posted) -> None:
        self.comm, self.posted = comm, posted

    def wait(self) -> None:
        actor = self.comm.actor()
        self.comm.flush_region(actor)
        actor.ops.append(ops.Wait(self.posted.post.handle))
        self.comm.router.block(actor, lambda: self.posted.done,
                               self.posted.waiting("waiting for its "))


class _JobWork(Work):
    _UNSET = object()

    def __init__(self, comm: SimCommunicator, job: int) -> None:
        self.comm, self.job = comm, job
        self.result: Any = self._UNSET

    def wait(self) -> Any:
        """Wait for the job and return its result; waiting again returns it at once, as
        ``torch.distributed``'s ``Work.wait`` may be called more than once."""
        if self.result is not self._UNSET:
            return self.result
        actor = self.comm.actor()
        self.comm.flush_region(actor)
        actor.ops.append(ops.WaitJob(self.job))
        stream = self.comm.stream
        self.comm.router.block(actor, lambda: self.job in stream.results,
                               f"waiting for comm-stream job {self.job}")
        self.result = stream.results.pop(self.job)
        return self.result


class _Stream:
    """A rank's communication stream: a thread that runs submitted jobs in order."""

    def __init__(self, comm: SimCommunicator) -> None:
        self.comm = comm
        self.actor = Actor(comm.rank, ops.STREAM)
        self.jobs: deque[tuple[int, Callable[..., Any], tuple]] = deque()
        self.results: dict[int, Any] = {}
        self.count = itertools.count()
        self.thread: threading.Thread | None = None


class SimMemory(MemoryRecorder):
    def __init__(self, comm: SimCommunicator, ledger: Any) -> None:
        self.comm, self.ledger = comm, ledger
        self.held: dict[int, tuple[str, int, str]] = {}

    def alloc(self, category: str, nbytes: int, label: str = "") -> int:
        token = self.ledger.alloc(category, nbytes, label)
        self.held[token] = (category, nbytes, label)
        self.comm.actor().ops.append(ops.Memory(category, nbytes, label))
        return token

    def free(self, token: int) -> None:
        self.ledger.free(token)
        category, nbytes, label = self.held.pop(token)
        self.comm.actor().ops.append(ops.Memory(category, -nbytes, label))


class CountedCommunicator(Communicator):
    """What the simulator's communicators share: each thread of a rank counts the ops it
    runs (``bind``), and ``compute``/``flush_region`` turn the count into ``Compute`` ops,
    handed to ``record(actor, op)``. Subclasses set ``cluster``, ``host`` and ``_local`` (a
    ``threading.local``) and ``_memory``, and define ``record`` and ``counting_skipped`` (true while the
    communicator's own copies run, which are not the program's work)."""

    cluster: Any
    host: Actor
    _local: threading.local
    _memory: MemoryRecorder

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def memory(self) -> MemoryRecorder:
        return self._memory

    def actor(self) -> Actor:
        return getattr(self._local, "actor", self.host)

    def record(self, actor: Actor, op: ops.Op) -> None:
        raise NotImplementedError

    def submitting_actor(self) -> Actor:
        """``run_async``'s caller: the rank's program (not a job already on its stream),
        its counted work timed up to here."""
        host = self.actor()
        if host.lane != ops.HOST:
            raise RuntimeError("run_async is called from the rank's program, not from a job "
                               "already on the comm stream")
        self.flush_region(host)
        return host

    def counting_skipped(self) -> bool:
        return False

    def bind(self, actor: Actor) -> None:
        """Make ``actor`` this thread's, and count every op the thread runs from now on: ops
        outside compute regions (the adds of a reduction, bucket copies) are timed as
        ``compute`` events labelled ``elementwise`` at the next message or wait."""
        self._local.actor = actor
        if actor.counter is None:
            actor.counter = FlopCount(self.cluster, skip=self.counting_skipped)
            actor.counter.factories = False
            actor.counter.__enter__()  # the thread's own mode stack: gone with the thread
            actor.flush = lambda: self.flush_region(actor)

    # ---- compute ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def compute(self, kind: str = "compute", label: str = "",
                seconds: float | None = None) -> Iterator[None]:
        actor = self.actor()
        if actor.region is not None:  # nested: counted by the outer region
            yield
            return
        self.flush_region(actor)  # elementwise work before the region is not the region's
        counter, pushed = actor.counter, False
        if counter is None:  # a thread that was never bound: count this region alone
            counter, pushed = FlopCount(self.cluster, skip=self.counting_skipped), True
            actor.counter = counter
            counter.__enter__()
        actor.region = (kind, label)
        counter.active, counter.factories = seconds is None, True
        try:
            yield
        finally:
            counter.active, counter.factories = True, False
            if seconds is None:
                self.flush_region(actor)
            elif seconds > 0:
                self.record(actor, ops.Compute(float(seconds), kind, label, 0.0))
            actor.region = None
            if pushed:
                counter.__exit__(None, None, None)
                actor.counter = None
                actor.emitted, actor.emitted_by_dtype = (0.0, 0, 0.0), {}

    def flush_region(self, actor: Actor) -> None:
        """Time the ops counted since the last flush as one ``Compute``: the open region's,
        or, outside regions, ``compute``/``elementwise`` (a reduction's adds, a bucket's
        copies). Called before every message and wait, so that the work lands before the
        message it precedes.

        Seconds: ``sum over dtypes of flops / (peak * efficiency)``, plus, for the ops whose
        bytes take longer than their FLOPs, the difference (the roofline, see ``flops``),
        plus ``launch_overhead_s`` per kernel."""
        counter = actor.counter
        if counter is None or actor.region is not None and not counter.active:
            return
        flops0, kernels0, extra0 = actor.emitted
        by_dtype = dict(counter.by_dtype)
        actor.emitted = (sum(by_dtype.values()), counter.kernels, counter.memory_extra_s)
        flops, kernels = actor.emitted[0] - flops0, counter.kernels - kernels0
        if kernels <= 0:
            return
        seconds = counter.memory_extra_s - extra0
        seconds += kernels * getattr(self.cluster, "launch_overhead_s", 0.0)
        for dtype, total in by_dtype.items():
            new = total - actor.emitted_by_dtype.get(dtype, 0.0)
            if new > 0:
                seconds += self.cluster.flop_seconds(new, dtype)
        actor.emitted_by_dtype = by_dtype
        # On the comm stream (the reductions of an overlapped all-reduce) the work runs
        # beside the compute stream, as NCCL's kernels do on a GPU: the replay times it on
        # the comm lane, without waiting for the compute stream.
        kind, label = actor.region or ("compute", "elementwise")
        if seconds > 0 or flops > 0:
            self.record(actor, ops.Compute(seconds, kind, label, flops))


class SimCommunicator(CountedCommunicator):
    """One rank's view of the simulated cluster."""

    def __init__(self, rank: int, world_size: int, router: Router, cluster: Any,
                 ledger: Any, stats: CommStats) -> None:
        self.rank, self.world_size, self.router, self.cluster = rank, world_size, router, cluster
        self.stats = stats
        router.cluster = cluster
        self.host = Actor(rank, ops.HOST)
        self.stream = _Stream(self)
        self._memory = SimMemory(self, ledger)
        self._local = threading.local()
        router.actors.append(self.host)

    def record(self, actor: Actor, op: ops.Op) -> None:
        actor.ops.append(op)

    def counting_skipped(self) -> bool:
        return self.router.lock._is_owned()  # the router's copies of a message

    # ---- point to point ---------------------------------------------------------------------
    def _post(self, op: str, tensor: torch.Tensor, peer: int, tag: int,
              blocking: bool) -> Posted:
        check_peer(self.rank, self.world_size, op, tensor, peer)
        actor = self.actor()
        self.flush_region(actor)
        return self.router.post(actor, op, tensor, peer, tag, blocking)

    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        posted = self._post("send", tensor, dst, tag, True)
        self.router.block(self.actor(), lambda: posted.done, posted.waiting())

    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> None:
        posted = self._post("recv", tensor, src, tag, True)
        self.router.block(self.actor(), lambda: posted.done, posted.waiting())

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Work:
        return _PostWork(self, self._post("send", tensor, dst, tag, False))

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Work:
        return _PostWork(self, self._post("recv", tensor, src, tag, False))

    def recv_any(self, tensor: torch.Tensor, sources: Sequence[int], tag: int = 0) -> int:
        sources = tuple(sources)
        check_sources(self.rank, sources)
        for src in sources:
            check_peer(self.rank, self.world_size, "recv", tensor, src)
        actor = self.actor()
        self.flush_region(actor)
        request = AnyRequest(actor, tensor, sources, tag)
        self.router.request_any(request)
        self.router.block(actor, lambda: request.result is not None,
                          f"recv from any of ranks {list(sources)}, tag {tag}, "
                          f"{kind_of(tensor)}")
        return request.result

    def wait_any(self, works: Sequence[Work]) -> int:
        works = list(works)
        if not works or not all(isinstance(w, _PostWork) for w in works):
            raise TypeError("wait_any needs a non-empty list of works from isend/irecv")
        actor = self.actor()
        self.flush_region(actor)
        request = AnyRequest(actor, posteds=[w.posted for w in works])
        self.router.request_any(request)
        self.router.block(actor, lambda: request.result is not None,
                          "waiting for the first of: "
                          + "; ".join(w.posted.describe() for w in works))
        return request.result

    # ---- the communication stream -------------------------------------------------------------
    def run_async(self, fn: Callable[..., Any], *args: Any) -> Work:
        host = self.submitting_actor()
        stream = self.stream
        job = next(stream.count)
        host.ops.append(ops.Submit(job))
        with self.router.lock:
            self.router.raise_if_failed()
            stream.jobs.append((job, fn, args))
            if stream.thread is None:
                self.router.actors.append(stream.actor)
                stream.thread = threading.Thread(target=self._stream_loop, daemon=True,
                                                 name=f"rank-{self.rank}-stream")
                stream.thread.start()
            self.router.wake()
        return _JobWork(self, job)

    def _stream_loop(self) -> None:
        stream, actor = self.stream, self.stream.actor
        self.bind(actor)
        try:
            while True:
                self.router.block(actor, lambda: bool(stream.jobs) or self.host.state == "done",
                                  "idle", state="idle")
                with self.router.lock:
                    if not stream.jobs:
                        break
                    job, fn, args = stream.jobs.popleft()
                actor.ops.append(ops.JobStart(job))
                result = fn(*args)
                self.flush_region(actor)  # the job's trailing work (a reduction's last adds)
                actor.ops.append(ops.JobEnd(job))  # is part of it: wait() returns after it
                with self.router.lock:
                    stream.results[job] = result
                    self.router.wake()
        except Aborted:
            pass
        except BaseException as exc:  # noqa: BLE001 - reported by the launcher
            self.router.fail(_StreamFailure(self.rank, exc))
        finally:
            self.router.finish(actor)

    def log(self, text: str) -> None:
        self.actor().ops.append(ops.Log(str(text)))


class _StreamFailure(Exception):
    """A job on a rank's comm stream raised; carries the rank and the original exception."""

    def __init__(self, rank: int, original: BaseException) -> None:
        super().__init__(f"comm stream of rank {rank}: {original!r}")
        self.rank, self.original = rank, original
        self.__traceback__ = original.__traceback__
