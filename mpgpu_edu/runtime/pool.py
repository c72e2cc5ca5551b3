"""A group of worker processes that run jobs together (``comm``'s ranks on gloo or nccl).

Each worker is a child of a ``ForkServer`` with one connection to the owner; the owner sends
every worker the same job (bytes) and collects one reply per worker. The first failure
(a reply other than the good one, or a worker that died) ends the collection after a short
grace, so the other workers' reports (often: blocked on the failed one) come along; a job
still running at its deadline raises ``JobTimeout``. After a failure the owner kills the
group: workers blocked on each other cannot be trusted to continue.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait

from mpgpu_edu.runtime.forkserver import ForkServer

GRACE_S = 0.3  # after a first failure, how long to wait for other workers' reports


class JobTimeout(Exception):
    """Workers still running at the deadline; ``replies`` holds those that had answered."""

    def __init__(self, replies: dict[int, tuple]) -> None:
        super().__init__(f"{len(replies)} worker(s) answered in time")
        self.replies = replies


class WorkerGroup:
    """``size`` workers, worker ``r`` running ``target(conn, r, *args_of(r))``."""

    def __init__(self, server: ForkServer, size: int, target: str,
                 args_of: Callable[[int], tuple]) -> None:
        self.size = size
        self.lock = threading.Lock()  # one job at a time
        self.children = []
        try:
            for rank in range(size):
                self.children.append(server.spawn(target, rank, *args_of(rank)))
        except BaseException:
            self.kill()
            raise
        self.conns = [child.conns[0] for child in self.children]

    @property
    def pids(self) -> list[int]:
        return [child.pid for child in self.children]

    def alive(self) -> bool:
        return bool(self.children) and all(child.is_alive() for child in self.children)

    def send_all(self, message: bytes) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):  # a dead worker is reported by collect
                conn.send_bytes(message)

    def collect(self, timeout: float, good: str) -> dict[int, tuple]:
        """Each worker's reply (a tuple whose first item is its kind); ``("died", exitcode)``
        for a worker that ended without one. Stops early after a failure (see the module)."""
        deadline, replies = time.monotonic() + timeout, {}
        first_failure: float | None = None
        while len(replies) < self.size:
            now = time.monotonic()
            until = deadline if first_failure is None else first_failure + GRACE_S
            if now > until:
                if first_failure is not None:
                    break
                raise JobTimeout(replies)
            waiting = [r for r in range(self.size) if r not in replies]
            wait([self.conns[r] for r in waiting], max(0.0, min(until - now, 1.0)))
            for r in waiting:
                reply = self._poll(r)
                if reply is not None:
                    replies[r] = reply
                    if reply[0] != good and first_failure is None:
                        first_failure = time.monotonic()
        return replies

    def _poll(self, rank: int) -> tuple | None:
        conn, child = self.conns[rank], self.children[rank]
        try:
            if conn.poll():
                return pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return ("died", child.join(2.0))
        if child.exitcode is not None:
            return ("died", child.exitcode)
        return None

    def kill(self) -> None:
        """Stop every worker now (after a fault: they may be blocked inside C++)."""
        for child in self.children:
            child.kill()
        for child in self.children:
            child.join(5.0)
            child.close()
        self.children, self.conns = [], []

    def stop(self, message: bytes = b"stop") -> None:
        """Ask idle workers to exit; kill the stragglers."""
        self.send_all(message)
        deadline = time.monotonic() + 2.0
        for child in self.children:
            child.join(max(0.0, deadline - time.monotonic()))
        self.kill()


__all__ = ["GRACE_S", "JobTimeout", "WorkerGroup"]
