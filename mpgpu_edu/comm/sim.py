"""The simulated backend: every rank is a thread, tensors are real, time is simulated.

Execution and timing are separate. While the ranks run, a *router* matches each send with its
receive (the n-th send on a channel meets the n-th receive), copies the data and records every
operation in the rank's op list. Nothing here reads a clock. Afterwards ``replay`` turns the op
lists into a timeline with the cluster's cost model, so the same program always gives the same
trace, whatever the thread interleaving.

Semantics that catch real bugs: a blocking ``send`` returns only once the receiver has posted
the matching receive (synchronous send), so an ordering that can hang NCCL or gloo hangs here
too, and is then reported: when every live rank is blocked the router stops them all and raises
a ``DeadlockError`` listing each rank's pending operation.

"Whichever comes first" (``recv_any``, ``wait_any``) is decided without a clock too: such a
request waits until every other actor is blocked (the program is at rest, a state that does
not depend on threads), then the op lists so far are timed (``replay.time_so_far``) and the
message that arrives first in simulated time wins (ties: the lower position in the list).
Only when no request can be served either is it a deadlock.
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
from mpgpu_edu.comm.base import CommStats, Communicator, MemoryRecorder, Work, nbytes_of
from mpgpu_edu.comm.errors import Aborted, DeadlockError, MessageMismatchError, Pending
from mpgpu_edu.comm.flops import FlopCount
from mpgpu_edu.comm.replay import time_so_far


class Actor:
    """One thread of one rank: its program (lane 0) or its communication stream (lane 1)."""

    def __init__(self, rank: int, lane: int) -> None:
        self.rank, self.lane = rank, lane
        self.ops: list[ops.Op] = []
        self.state = "running"  # running | blocked | idle | done
        self.pending = ""
        self.waiting: Pending | None = None  # ``pending`` as data, while blocked
        self.ready: Callable[[], bool] = lambda: True
        self.region: tuple[str, str] | None = None  # (kind, label) of the open region
        self.counter: FlopCount | None = None  # counts every op this thread runs
        self.emitted = (0.0, 0, 0.0)  # the counter's (flops, kernels, extra s) already timed
        self.emitted_by_dtype: dict[str, float] = {}
        self.flush: Callable[[], None] = lambda: None  # time what is left, at the end

    @property
    def name(self) -> str:
        return f"rank {self.rank}" + (" (comm stream)" if self.lane == ops.STREAM else "")


class _Posted:
    """A posted send or receive waiting for (or done with) its partner."""

    def __init__(self, post: ops.Post, tensor: torch.Tensor, actor: Actor) -> None:
        self.post, self.tensor, self.actor, self.done = post, tensor, actor, False

    def waiting(self, prefix: str = "") -> Pending:
        """This message as a ``Pending`` of its rank: what it waits in, as data and words."""
        p = self.post
        peer = p.dst if p.op == "send" else p.src
        return Pending(self.actor.rank, p.op, prefix + self.describe(), peer, p.tag,
                       p.lane == ops.STREAM)

    def describe(self) -> str:
        p = self.post
        what = f"send to rank {p.dst}" if p.op == "send" else f"recv from rank {p.src}"
        dtype = str(self.tensor.dtype).replace("torch.", "")
        return (f"{what}, tag {p.tag}, {p.nbytes} bytes ({dtype} {list(self.tensor.shape)})"
                + (", on its comm stream" if p.lane == ops.STREAM else ""))


class _AnyRequest:
    """A ``recv_any`` (``posteds`` is None) or a ``wait_any``, served when the program rests;
    ``result`` is then the source rank, or the index of the first work done."""

    def __init__(self, actor: Actor, tensor: torch.Tensor | None = None,
                 sources: tuple[int, ...] = (), tag: int = 0,
                 posteds: list[_Posted] | None = None) -> None:
        self.actor, self.tensor, self.sources, self.tag = actor, tensor, sources, tag
        self.posteds = posteds
        self.result: int | None = None


class Router:
    """Matches posts, moves data, and watches for deadlock. One per launch."""

    def __init__(self, world_size: int, stats: list[CommStats]) -> None:
        self.cond = threading.Condition()
        self.world_size, self.stats = world_size, stats
        self.cluster: Any = None  # set by the communicators: times recv_any's candidates
        self.any_requests: list[_AnyRequest] = []
        self.actors: list[Actor] = []
        self.unmatched: dict[tuple[int, int, int, int], deque[_Posted]] = {}
        self.seq: dict[tuple, int] = {}
        self.handles = itertools.count()
        self.failure: BaseException | None = None

    # ---- posting and matching -------------------------------------------------------------
    def post(self, actor: Actor, op: str, tensor: torch.Tensor, peer: int, tag: int,
             blocking: bool) -> _Posted:
        src, dst = (actor.rank, peer) if op == "send" else (peer, actor.rank)
        key = (src, dst, tag, actor.lane)
        with self.cond:
            self.raise_if_failed()
            seq = self.seq.get((op, *key), 0)
            self.seq[(op, *key)] = seq + 1
            post = ops.Post(op, src, dst, tag, actor.lane, seq, nbytes_of(tensor), blocking,
                            next(self.handles))
            actor.ops.append(post)
            mine = _Posted(post, tensor, actor)
            queue = self.unmatched.setdefault(key, deque())
            if queue and queue[0].post.op != op:
                other = queue.popleft()
                send, recv = (mine, other) if op == "send" else (other, mine)
                self._deliver(send, recv)
            else:
                queue.append(mine)
            return mine

    def _deliver(self, send: _Posted, recv: _Posted) -> None:
        a, b = send.tensor, recv.tensor
        if a.shape != b.shape or a.dtype != b.dtype or a.is_meta != b.is_meta:
            err = MessageMismatchError(
                f"message mismatch on tag {send.post.tag}: rank {send.post.src} sends "
                f"{_kind(a)} but rank {send.post.dst} receives into {_kind(b)}; make both "
                "sides use the same shape and dtype (and both real or both meta tensors)")
            self.fail(err)
            raise err
        if not a.is_meta:
            with torch.no_grad():  # a receive into a parameter is not an autograd op
                b.copy_(a)
        self.stats[send.post.src].record_send(send.post.dst, send.post.nbytes)
        self.stats[recv.post.dst].record_recv(recv.post.src, recv.post.nbytes)
        send.done = recv.done = True
        self.cond.notify_all()

    # ---- blocking, failure and deadlock -----------------------------------------------------
    def block(self, actor: Actor, ready: Callable[[], bool], pending: str | Pending,
              state: str = "blocked") -> None:
        """Wait until ``ready()``; raise ``Aborted`` if the launch failed meanwhile.
        ``pending`` says what the actor waits in: a ``Pending``, or words only."""
        if isinstance(pending, str):
            pending = Pending(actor.rank, "other", pending, stream=actor.lane == ops.STREAM)
        with self.cond:
            while not ready():
                self.raise_if_failed()
                actor.state, actor.pending, actor.ready = state, pending.text, ready
                actor.waiting = pending
                self._check_deadlock()  # may serve a recv_any: this actor's, too
                self.raise_if_failed()
                if not ready():
                    self.cond.wait(0.5)
            actor.state, actor.pending, actor.ready = "running", "", lambda: True

    def finish(self, actor: Actor) -> None:
        actor.flush()
        with self.cond:
            actor.state = "done"
            self._check_deadlock()
            self.cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            if self.failure is None:
                self.failure = exc
            self.cond.notify_all()

    def raise_if_failed(self) -> None:
        if self.failure is not None:
            raise Aborted()

    def _check_deadlock(self) -> None:
        if self.failure is not None:
            return
        live = [a for a in self.actors if a.state != "done"]
        if not live or any(a.state == "running" or a.ready() for a in live):
            return
        if all(a.state == "idle" for a in live):
            return  # only idle comm streams are left: their hosts finished, they will exit
        if self._serve_any():
            return
        lines = [f"  {a.name}: {a.pending}" for a in self.actors if a.state == "blocked"]
        lines += [f"  {a.name}: finished" for a in self.actors
                  if a.state == "done" and a.lane == ops.HOST]
        self.failure = DeadlockError(
            "deadlock: every rank is blocked and none can make progress\n" + "\n".join(lines)
            + "\nA blocking send waits until its receiver posts the matching recv. Check that "
            "every send has a matching recv on the peer (same tag) in an order both sides "
            "reach, or use isend/irecv so that both directions can be in flight at once.",
            pending=[a.waiting for a in self.actors if a.state == "blocked" and a.waiting],
            finished=[a.rank for a in self.actors if a.state == "done" and a.lane == ops.HOST])
        self.cond.notify_all()

    # ---- whichever comes first: served when every actor is blocked -------------------------
    def request_any(self, request: _AnyRequest) -> None:
        with self.cond:
            self.raise_if_failed()
            self.any_requests.append(request)

    def _serve_any(self) -> bool:
        """Serve every pending ``recv_any``/``wait_any`` that has a candidate; the first to
        arrive in simulated time wins. True if any was served."""
        if not self.any_requests:
            return False
        op_lists = {(a.rank, a.lane): a.ops for a in self.actors}
        posted_at, ends = time_so_far(op_lists, self.cluster, self.world_size)
        for request in sorted(self.any_requests, key=lambda r: (r.actor.rank, r.actor.lane)):
            if request.posteds is None:
                self._serve_recv(request, posted_at)
            else:
                done = [(ends.get(p.post.handle, 0.0), i)
                        for i, p in enumerate(request.posteds) if p.done]
                if done:
                    request.result = min(done)[1]
                    handle = request.posteds[request.result].post.handle
                    request.actor.ops.append(ops.Wait(handle))
        served = [r for r in self.any_requests if r.result is not None]
        self.any_requests = [r for r in self.any_requests if r.result is None]
        if served:
            self.cond.notify_all()
        return bool(served)

    def _serve_recv(self, request: _AnyRequest, posted_at: dict[int, float]) -> None:
        me, lane = request.actor.rank, request.actor.lane
        arrivals = []
        for order, src in enumerate(request.sources):
            queue = self.unmatched.get((src, me, request.tag, lane))
            if queue and queue[0].post.op == "send":
                post = queue[0].post
                route = self.cluster.route(src, me)
                sent = posted_at.get(post.handle, 0.0)
                arrivals.append((sent + route.alpha_s + post.nbytes / route.beta_Bps, order, src))
        if not arrivals:
            return
        src = min(arrivals)[2]
        try:
            self.post(request.actor, "recv", request.tensor, src, request.tag, True)
        except MessageMismatchError:
            return  # the router failed the launch: every rank stops
        request.result = src


def _kind(t: torch.Tensor) -> str:
    dtype = str(t.dtype).replace("torch.", "")
    return f"{'meta ' if t.is_meta else ''}{dtype} {list(t.shape)} ({nbytes_of(t)} bytes)"


class _PostWork(Work):
    def __init__(self, comm: SimCommunicator, posted: _Posted) -> None:
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


class SimCommunicator(Communicator):
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

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def memory(self) -> MemoryRecorder:
        return self._memory

    def actor(self) -> Actor:
        return getattr(self._local, "actor", self.host)

    def bind(self, actor: Actor) -> None:
        """Make ``actor`` this thread's, and count every op the thread runs from now on: ops
        outside compute regions (the adds of a reduction, bucket copies) are timed as
        ``compute`` events labelled ``elementwise`` at the next message or wait."""
        self._local.actor = actor
        if actor.counter is None:
            actor.counter = FlopCount(self.cluster, skip=self.router.cond._is_owned)
            actor.counter.factories = False
            actor.counter.__enter__()  # the thread's own mode stack: gone with the thread
            actor.flush = lambda: self.flush_region(actor)

    # ---- point to point ---------------------------------------------------------------------
    def _post(self, op: str, tensor: torch.Tensor, peer: int, tag: int,
              blocking: bool) -> _Posted:
        self._check_peer(op, tensor, peer)
        actor = self.actor()
        self.flush_region(actor)
        return self.router.post(actor, op, tensor, peer, tag, blocking)

    def _check_peer(self, op: str, tensor: torch.Tensor, peer: int) -> None:
        if not 0 <= peer < self.world_size:
            raise ValueError(f"rank {self.rank}: peer {peer} does not exist (world size "
                             f"{self.world_size}, ranks 0..{self.world_size - 1})")
        if peer == self.rank:
            raise ValueError(f"rank {self.rank} tries to {op} to/from itself: a rank already "
                             "has its own data, skip the message")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{op} needs a torch.Tensor, got {type(tensor).__name__}")

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
        if not sources or len(set(sources)) != len(sources):
            raise ValueError(f"rank {self.rank}: recv_any needs a list of distinct source "
                             f"ranks, got {list(sources)}")
        for src in sources:
            self._check_peer("recv", tensor, src)
        actor = self.actor()
        self.flush_region(actor)
        request = _AnyRequest(actor, tensor, sources, tag)
        self.router.request_any(request)
        self.router.block(actor, lambda: request.result is not None,
                          f"recv from any of ranks {list(sources)}, tag {tag}, "
                          f"{_kind(tensor)}")
        return request.result

    def wait_any(self, works: Sequence[Work]) -> int:
        works = list(works)
        if not works or not all(isinstance(w, _PostWork) for w in works):
            raise TypeError("wait_any needs a non-empty list of works from isend/irecv")
        actor = self.actor()
        self.flush_region(actor)
        request = _AnyRequest(actor, posteds=[w.posted for w in works])
        self.router.request_any(request)
        self.router.block(actor, lambda: request.result is not None,
                          "waiting for the first of: "
                          + "; ".join(w.posted.describe() for w in works))
        return request.result

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
            counter, pushed = FlopCount(self.cluster, skip=self.router.cond._is_owned), True
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
                actor.ops.append(ops.Compute(float(seconds), kind, label, 0.0))
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
            actor.ops.append(ops.Compute(seconds, kind, label, flops))

    # ---- the communication stream -------------------------------------------------------------
    def run_async(self, fn: Callable[..., Any], *args: Any) -> Work:
        host = self.actor()
        if host.lane != ops.HOST:
            raise RuntimeError("run_async is called from the rank's program, not from a job "
                               "already on the comm stream")
        self.flush_region(host)
        stream = self.stream
        job = next(stream.count)
        host.ops.append(ops.Submit(job))
        with self.router.cond:
            self.router.raise_if_failed()
            stream.jobs.append((job, fn, args))
            if stream.thread is None:
                self.router.actors.append(stream.actor)
                stream.thread = threading.Thread(target=self._stream_loop, daemon=True,
                                                 name=f"rank-{self.rank}-stream")
                stream.thread.start()
            self.router.cond.notify_all()
        return _JobWork(self, job)

    def _stream_loop(self) -> None:
        stream, actor = self.stream, self.stream.actor
        self.bind(actor)
        try:
            while True:
                self.router.block(actor, lambda: bool(stream.jobs) or self.host.state == "done",
                                  "idle", state="idle")
                with self.router.cond:
                    if not stream.jobs:
                        break
                    job, fn, args = stream.jobs.popleft()
                actor.ops.append(ops.JobStart(job))
                result = fn(*args)
                actor.ops.append(ops.JobEnd(job))
                with self.router.cond:
                    stream.results[job] = result
                    self.router.cond.notify_all()
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
