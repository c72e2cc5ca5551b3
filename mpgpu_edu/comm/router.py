"""The simulator's router: it matches each send with its receive (the n-th send on a channel
meets the n-th receive), copies the data, records every operation in the posting thread's op
list, and watches for deadlock: when every live rank is blocked it stops them all and raises a
``DeadlockError`` listing each rank's pending operation. ``recv_any``/``wait_any`` requests are
served here too, once the program is at rest, by timing the op lists so far
(``replay.time_so_far``). Nothing here reads a clock.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.comm import ops
from mpgpu_edu.comm.base import CommStats, nbytes_of
from mpgpu_edu.comm.errors import Aborted, DeadlockError, MessageMismatchError, Pending
from mpgpu_edu.comm.flops import FlopCount
from mpgpu_edu.comm.message import describe, kind_of
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
        self.wakeup: threading.Condition | None = None  # on the router's lock, made at 1st wait

    @property
    def name(self) -> str:
        return f"rank {self.rank}" + (" (comm stream)" if self.lane == ops.STREAM else "")


class Posted:
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
        return describe(p.op, self.tensor, p.dst if p.op == "send" else p.src, p.tag,
                        p.lane == ops.STREAM)


class AnyRequest:
    """A ``recv_any`` (``posteds`` is None) or a ``wait_any``, served when the program rests;
    ``result`` is then the source rank, or the index of the first work done."""

    def __init__(self, actor: Actor, tensor: torch.Tensor | None = None,
                 sources: tuple[int, ...] = (), tag: int = 0,
                 posteds: list[Posted] | None = None) -> None:
        self.actor, self.tensor, self.sources, self.tag = actor, tensor, sources, tag
        self.posteds = posteds
        self.result: int | None = None


class Router:
    """Matches posts, moves data, and watches for deadlock. One per launch."""

    def __init__(self, world_size: int, stats: list[CommStats]) -> None:
        # One lock for all the router's state; each actor waits on a condition of its own on
        # it, and ``wake`` signals only those whose wait is over: a message wakes its two
        # ends, not every thread of the launch.
        self.lock = threading.RLock()
        self.world_size, self.stats = world_size, stats
        self.cluster: Any = None  # set by the communicators: times recv_any's candidates
        self.any_requests: list[AnyRequest] = []
        self.actors: list[Actor] = []
        self.unmatched: dict[tuple[int, int, int, int], deque[Posted]] = {}
        self.seq: dict[tuple, int] = {}
        self.handles = itertools.count()
        self.failure: BaseException | None = None

    # ---- posting and matching -------------------------------------------------------------
    def post(self, actor: Actor, op: str, tensor: torch.Tensor, peer: int, tag: int,
             blocking: bool) -> Posted:
        src, dst = (actor.rank, peer) if op == "send" else (peer, actor.rank)
        key = (src, dst, tag, actor.lane)
        with self.lock:
            self.raise_if_failed()
            seq = self.seq.get((op, *key), 0)
            self.seq[(op, *key)] = seq + 1
            post = ops.Post(op, src, dst, tag, actor.lane, seq, nbytes_of(tensor), blocking,
                            next(self.handles))
            actor.ops.append(post)
            mine = Posted(post, tensor, actor)
            queue = self.unmatched.setdefault(key, deque())
            if queue and queue[0].post.op != op:
                other = queue.popleft()
                send, recv = (mine, other) if op == "send" else (other, mine)
                self._deliver(send, recv)
            else:
                queue.append(mine)
            return mine

    def _deliver(self, send: Posted, recv: Posted) -> None:
        a, b = send.tensor, recv.tensor
        if a.shape != b.shape or a.dtype != b.dtype or a.is_meta != b.is_meta:
            err = MessageMismatchError(
                f"message mismatch on tag {send.post.tag}: rank {send.post.src} sends "
                f"{kind_of(a)} but rank {send.post.dst} receives into {kind_of(b)}; make both "
                "sides use the same shape and dtype (and both real or both meta tensors)")
            self.fail(err)
            raise err
        if not a.is_meta:
            with torch.no_grad():  # a receive into a parameter is not an autograd op
                b.copy_(a)
        self.stats[send.post.src].record_send(send.post.dst, send.post.nbytes)
        self.stats[recv.post.dst].record_recv(recv.post.src, recv.post.nbytes)
        send.done = recv.done = True
        self.wake()

    # ---- blocking, failure and deadlock -----------------------------------------------------
    def block(self, actor: Actor, ready: Callable[[], bool], pending: str | Pending,
              state: str = "blocked") -> None:
        """Wait until ``ready()``; raise ``Aborted`` if the launch failed meanwhile.
        ``pending`` says what the actor waits in: a ``Pending``, or words only."""
        if isinstance(pending, str):
            pending = Pending(actor.rank, "other", pending, stream=actor.lane == ops.STREAM)
        with self.lock:
            while not ready():
                self.raise_if_failed()
                actor.state, actor.pending, actor.ready = state, pending.text, ready
                actor.waiting = pending
                self._check_deadlock()  # may serve a recv_any: this actor's, too
                self.raise_if_failed()
                if not ready():
                    if actor.wakeup is None:
                        actor.wakeup = threading.Condition(self.lock)
                    actor.wakeup.wait(0.5)
            actor.state, actor.pending, actor.ready = "running", "", lambda: True

    def wake(self) -> None:
        """(With the lock held.) Signal every waiting actor whose wait is over, or every one
        once the launch has failed. Each state change a wait depends on calls this."""
        failed = self.failure is not None
        for a in self.actors:
            if a.wakeup is not None and a.state in ("blocked", "idle") and (failed or a.ready()):
                a.wakeup.notify()

    def finish(self, actor: Actor) -> None:
        actor.flush()
        with self.lock:
            actor.state = "done"
            self._check_deadlock()
            self.wake()

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            if self.failure is None:
                self.failure = exc
            self.wake()

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
        lines += self._unmatched_lines()
        self.failure = DeadlockError(
            "deadlock: every rank is blocked and none can make progress\n" + "\n".join(lines)
            + "\nA blocking send waits until its receiver posts the matching recv. Check that "
            "every send has a matching recv on the peer (same tag) in an order both sides "
            "reach, or use isend/irecv so that both directions can be in flight at once.",
            pending=[a.waiting for a in self.actors if a.state == "blocked" and a.waiting],
            finished=[a.rank for a in self.actors if a.state == "done" and a.lane == ops.HOST])
        self.wake()

    def _unmatched_lines(self, most: int = 4) -> list[str]:
        """For a deadlock's message: each rank's messages posted and never matched, besides
        the one it blocks in (its isend/irecv), so that a tag or a peer that differs at the
        two ends shows at once."""
        by_rank: dict[str, list[str]] = {}
        for queue in self.unmatched.values():
            for posted in queue:
                text = posted.describe()
                if not posted.done and text not in posted.actor.pending:  # not said above
                    by_rank.setdefault(posted.actor.name, []).append(text)
        if not by_rank:
            return []
        lines = ["Posted and never matched:"]
        for name in sorted(by_rank, key=lambda n: (int(n.split()[1]), n)):
            texts = by_rank[name]
            more = f"; and {len(texts) - most} more" if len(texts) > most else ""
            lines.append(f"  {name}: " + "; ".join(texts[:most]) + more)
        return lines

    # ---- whichever comes first: served when every actor is blocked -------------------------
    def request_any(self, request: AnyRequest) -> None:
        with self.lock:
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
            self.wake()
        return bool(served)

    def _serve_recv(self, request: AnyRequest, posted_at: dict[int, float]) -> None:
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
