"""``launch``: run an SPMD function on every rank and collect results, trace, stats and logs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from mpgpu_edu.comm import ops
from mpgpu_edu.comm.base import CommStats
from mpgpu_edu.comm.errors import (Aborted, DeadlockError, LaunchTimeoutError,
                                   MessageMismatchError, RankError, UnmatchedMessageError,
                                   rank_traceback)
from mpgpu_edu.comm.replay import replay
from mpgpu_edu.comm.result import LaunchResult, resolve_cluster
from mpgpu_edu.comm.router import Router
from mpgpu_edu.comm.sim import SimCommunicator, _StreamFailure

DEFAULT_TIMEOUT_S = 60.0


def launch(fn: Callable[..., Any], cluster: Any, *args: Any, backend: str = "sim",
           timeout: float = DEFAULT_TIMEOUT_S, **kwargs: Any) -> LaunchResult:
    """Run ``fn(comm, *args, **kwargs)`` on every rank.

    ``backend="sim"`` runs the ranks as threads on the simulated ``cluster`` (a ``Cluster``,
    a preset name such as ``"4xA100-nvlink"``, or a number of ranks). ``"gloo"`` and
    ``"nccl"`` run real ``torch.distributed`` processes; then ``cluster`` is the number of
    processes (or a Cluster, whose world size is used).

    If a rank raises, every rank is stopped and ``RankError`` carries that rank's traceback; a
    deadlock raises ``DeadlockError``; ranks still running after ``timeout`` seconds raise
    ``LaunchTimeoutError`` naming what each rank was doing.

    On the simulator every rank is a thread of this process, so ranks share torch's global
    random generator: seed before ``launch`` (or give each rank a ``torch.Generator``) rather
    than calling ``torch.manual_seed`` inside ``fn``. On gloo and nccl, ``fn`` runs in worker
    processes and must live in an importable module (not in a notebook).
    """
    if backend == "sim":
        return run_sim(fn, resolve_cluster(cluster), args, kwargs, timeout)
    if backend in ("gloo", "nccl"):
        from mpgpu_edu.comm.pool import run_job

        return run_job(fn, cluster, args, kwargs, backend, timeout)
    raise ValueError(f"unknown backend {backend!r}: use 'sim', 'gloo' or 'nccl'")


def run_sim(fn: Callable[..., Any], cluster: Any, args: tuple, kwargs: dict,
            timeout: float = DEFAULT_TIMEOUT_S) -> LaunchResult:
    n = cluster.world_size
    if n < 1:
        raise ValueError(f"cluster {getattr(cluster, 'name', '')!r} has no visible devices "
                         "(is CUDA_VISIBLE_DEVICES empty or invalid?): make at least one visible")
    stats = [CommStats() for _ in range(n)]
    router = Router(n, stats)
    ledgers = cluster.new_ledgers()
    comms = [SimCommunicator(r, n, router, cluster, ledgers[r], stats[r]) for r in range(n)]
    results: list[Any] = [None] * n
    errors: dict[int, tuple[BaseException, str]] = {}

    def body(rank: int) -> None:
        comm = comms[rank]
        comm.bind(comm.host)
        try:
            results[rank] = fn(comm, *args, **kwargs)
        except Aborted:
            pass
        except BaseException as exc:  # noqa: BLE001 - re-raised by the launcher
            errors[rank] = (exc, rank_traceback(exc))
            router.fail(exc)
        finally:
            router.finish(comm.host)

    threads = [threading.Thread(target=body, args=(r,), daemon=True, name=f"rank-{r}")
               for r in range(n)]
    for t in threads:
        t.start()
    _join(threads, comms, router, timeout)
    _raise_failure(router, errors)
    _check_unmatched(router)
    op_lists = {(c.rank, lane.lane): lane.ops for c in comms
                for lane in (c.host, c.stream.actor) if lane.ops or lane.lane == ops.HOST}
    trace, logs = replay(op_lists, cluster, n, {"cluster": getattr(cluster, "name", "")})
    return LaunchResult(results, trace, stats,
                        [[f"[{t * 1e3:10.4f} ms] {text}" for t, text in log] for log in logs],
                        cluster, "sim", ledgers, op_lists)


def _join(threads: list[threading.Thread], comms: list[SimCommunicator], router: Router,
          timeout: float) -> None:
    deadline = time.monotonic() + timeout
    streams = lambda: [c.stream.thread for c in comms if c.stream.thread is not None]  # noqa
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    for t in streams():
        t.join(max(0.0, deadline - time.monotonic()))
    alive = [t for t in threads + streams() if t.is_alive()]
    if not alive:
        return
    lines = []
    for a in router.actors:
        doing = {"blocked": a.pending, "idle": "idle", "done": "finished",
                 "running": "running Python code (an endless loop?)"}[a.state]
        lines.append(f"  {a.name}: {doing}")
    err = LaunchTimeoutError(f"ranks still running after {timeout:g} s, all stopped:\n"
                             + "\n".join(lines)
                             + "\nRaise `timeout=` if the work is just slow, else look for a "
                             "rank waiting on a message nobody sends.",
                             pending=[a.waiting for a in router.actors
                                      if a.state == "blocked" and a.waiting],
                             finished=[a.rank for a in router.actors
                                       if a.state == "done" and a.lane == ops.HOST])
    router.fail(err)
    for t in alive:
        t.join(2.0)
    raise err


def _raise_failure(router: Router, errors: dict[int, tuple[BaseException, str]]) -> None:
    failure = router.failure
    if failure is None:
        return
    if isinstance(failure, (DeadlockError, MessageMismatchError)):
        raise failure  # detected by the router, not raised by a learner's code
    if isinstance(failure, _StreamFailure):
        tb = rank_traceback(failure.original)
        raise RankError(failure.rank, failure.original, tb) from failure.original
    for rank, (exc, tb) in sorted(errors.items()):
        if exc is failure:
            raise RankError(rank, exc, tb) from exc
    raise failure


def _check_unmatched(router: Router) -> None:
    left = [p for queue in router.unmatched.values() for p in queue]
    if left:
        lines = "\n".join(f"  rank {p.actor.rank}: {p.describe()}" for p in left)
        raise UnmatchedMessageError("the program ended with messages nobody matched:\n" + lines
                                    + "\nEvery send needs a recv on the peer with the same tag.")
