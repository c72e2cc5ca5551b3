"""The launcher's side of ``launch(..., backend="gloo"|"nccl")``: a pool of ranks that stays.

Starting a process that imports torch and joins a process group takes seconds; a notebook
launches small programs again and again. So the ranks of one (world size, backend) stay alive
between launches, as a ``WorkerGroup`` of the runtime's local fork server (``comm.worker`` is
their side): a launch pickles ``(fn, args, kwargs)`` to every rank and gathers a
``LaunchResult``. At most ``MAX_POOLS`` pools are kept (the least recently used is stopped);
``shutdown_pools()`` ends them all, and the runtime's server takes any that remain with it
when this process exits (or is killed).

Faults. A rank that raises, a worker that dies, or a job still running after its timeout
leaves the process group in an unknown state (a peer may be blocked in a receive forever), so
the pool's processes are killed, the launch raises, and the next launch starts a fresh pool.
While it waits, each rank writes what it is blocked on into a shared board, which the
launcher reads even while the rank is stuck inside C++.

Functions travel by name, so they must live in a module, not in the notebook
(``NotPicklableError`` says so before anything starts).
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import sys
import threading
import types
from collections import OrderedDict
from typing import Any

from mpgpu_edu.comm.dist import NotPicklableError, WorkerDiedError
from mpgpu_edu.comm.dist_work import MAIN, STREAM
from mpgpu_edu.comm.envelope import checking_from_env
from mpgpu_edu.comm.errors import (LaunchTimeoutError, MessageMismatchError, Pending,
                                   RankError)
from mpgpu_edu.comm.result import LaunchResult, resolve_cluster
from mpgpu_edu.runtime import local_server
from mpgpu_edu.runtime.board import RankBoard, SharedBoard
from mpgpu_edu.runtime.pool import JobTimeout, WorkerGroup
from mpgpu_edu.comm.worker import STARTUP_TIMEOUT_S

MAX_POOLS = 2


# ---- pickling a job ------------------------------------------------------------------------
def _where(fn: Any) -> str:
    return f"`{getattr(fn, '__qualname__', repr(fn))}`"


class _JobPickler(pickle.Pickler):
    """Refuses functions and classes of ``__main__``: they pickle by name, and a worker
    process cannot import a notebook."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (types.FunctionType, type)) and obj.__module__ == "__main__":
            raise NotPicklableError(_main_message(obj))
        return NotImplemented


def _main_message(obj: Any) -> str:
    return (f"function {_where(obj)} is defined in the notebook (module __main__), so worker "
            "processes cannot import it. Put it in a module under exercises/ (e.g. "
            "exercises/my_code.py) and import it, or run it on the simulated backend "
            "(backend='sim').")


def pickle_job(fn: Any, args: tuple, kwargs: dict) -> bytes:
    """Pickle ``(fn, args, kwargs)`` for the workers, or raise ``NotPicklableError`` saying
    why and what to do instead (no pickling traceback)."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    name = getattr(target, "__qualname__", "")
    if getattr(target, "__module__", None) == "__main__":
        raise NotPicklableError(_main_message(target))
    if "<lambda>" in name or "<locals>" in name:
        raise NotPicklableError(
            f"function {_where(target)} is a lambda or is defined inside another function, so "
            "worker processes cannot import it. Define it with `def` at the top level of a "
            "module under exercises/ (e.g. exercises/my_code.py) and import it, or run it on "
            "the simulated backend (backend='sim').")
    buffer = io.BytesIO()
    try:
        _JobPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump((fn, args, kwargs))
    except NotPicklableError:
        raise
    except Exception as exc:  # noqa: BLE001 - pickling raises many types
        raise NotPicklableError(
            f"the arguments of {_where(target)} cannot be sent to worker processes "
            f"({type(exc).__name__}: {exc}). Pass tensors, numbers, lists and objects of "
            "classes defined in modules, or run on the simulated backend (backend='sim')."
        ) from None
    return buffer.getvalue()


# ---- a pool --------------------------------------------------------------------------------
class WorkerPool:
    """``world_size`` ranks in one process group of ``backend``."""

    def __init__(self, world_size: int, backend: str) -> None:
        from torch.distributed import TCPStore

        self.world_size, self.backend = world_size, backend
        self.lock = threading.Lock()
        self.board = SharedBoard.create(2 * world_size)
        # The launcher hosts the rendezvous store on a free port chosen by the OS.
        self.store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.group = WorkerGroup(local_server(), world_size, "mpgpu_edu.comm.worker:worker_main",
                                 lambda r: (world_size, backend, self.store.port,
                                            self.board.path))
        self.ready = False

    @property
    def pids(self) -> list[int]:
        return self.group.pids

    def alive(self) -> bool:
        return self.group.alive()

    def wait_ready(self) -> None:
        try:
            replies = self.group.collect(STARTUP_TIMEOUT_S, "ready")
        except JobTimeout:
            self.kill()
            raise RuntimeError(f"the {self.backend} worker processes did not start within "
                               f"{STARTUP_TIMEOUT_S:g} s") from None
        bad = {r: m for r, m in replies.items() if m[0] != "ready"}
        if bad:
            self.kill()
            rank, message = min(bad.items())
            detail = (message[2] if message[0] == "error"
                      else f"its process died (exit code {message[1]})")
            raise RuntimeError(f"the {self.backend} worker processes did not start: rank {rank}"
                               f" failed:\n{detail}")
        self.ready = True

    def run(self, job: bytes, timeout: float) -> list[dict]:
        """Send one job to every rank and return their replies, in rank order."""
        cwd = os.getcwd()
        self.group.send_all(pickle.dumps(([p or cwd for p in sys.path], cwd,
                                          checking_from_env(), job)))
        try:
            replies = self.group.collect(timeout, "ok")
        except JobTimeout as exc:
            self.timed_out(exc.replies, timeout)
        failed = {r: m for r, m in replies.items() if m[0] != "ok"}
        for rank, message in sorted(replies.items()):
            for line in message[-1].splitlines() if message[0] != "died" else []:
                print(f"[rank {rank}] {line}")
        if failed:
            self.kill()
            raise _failure(failed)
        return [pickle.loads(replies[r][1]) for r in range(self.world_size)]

    def timed_out(self, replies: dict[int, tuple], timeout: float) -> None:
        lines, pending = [], []
        for r in range(self.world_size):
            board = RankBoard(self.board, r)
            if r in replies:
                lines.append(f"  rank {r}: finished")
                continue
            for lane, name in ((MAIN, f"rank {r}"), (STREAM, f"rank {r} (comm stream)")):
                line = board.get(lane)
                if lane == STREAM and not line:
                    continue
                waiting = Pending.from_line(r, line, stream=lane == STREAM)
                lines.append(f"  {name}: {_doing(waiting.text)}")
                if waiting.text not in ("running", "", "finished"):  # blocked in something
                    pending.append(waiting)
        self.kill()
        raise LaunchTimeoutError(f"ranks still running after {timeout:g} s, all stopped:\n"
                                 + "\n".join(lines)
                                 + "\nRaise `timeout=` if the work is just slow, else look "
                                 "for a rank waiting on a message nobody sends.",
                                 pending=pending, finished=sorted(replies))

    def kill(self) -> None:
        """Stop every rank now (after a fault: they may be blocked inside C++)."""
        self.group.kill()
        self._release()

    def stop(self) -> None:
        """Ask idle ranks to leave and exit; kill the stragglers."""
        self.group.stop()
        self._release()

    def _release(self) -> None:
        self.board.remove()
        self.store, self.ready = None, False


def _doing(text: str) -> str:
    return {"running": "running Python code (an endless loop?)",
            "": "has not started the job (still loading the function?)"}.get(text, text)


def _failure(failed: dict[int, tuple]) -> Exception:
    died = {r: m for r, m in failed.items() if m[0] == "died"}
    errors = {r: m for r, m in failed.items() if m[0] == "error"}
    originals = {}
    for rank, (_, summary, tb, original, _) in errors.items():
        try:
            originals[rank] = pickle.loads(original) if original is not None else None
        except Exception:  # noqa: BLE001 - an exception class the launcher cannot rebuild
            originals[rank] = None
    for rank, exc in sorted(originals.items()):
        if isinstance(exc, MessageMismatchError):
            return MessageMismatchError(str(exc))  # as the simulator raises it
    if died:  # the others' errors are about losing it
        rank = min(died)
        return WorkerDiedError(rank, died[rank][1])
    rank = min(errors)
    _, summary, tb, _, _ = errors[rank]
    exc = originals[rank]
    return RankError(rank, exc, tb, summary=None if exc is not None else summary)


_pools: OrderedDict[tuple[int, str], WorkerPool] = OrderedDict()
_pools_lock = threading.Lock()


def get_pool(world_size: int, backend: str) -> WorkerPool:
    """The live pool of this size and backend, started (and made ready) if needed."""
    key = (world_size, backend)
    with _pools_lock:
        pool = _pools.pop(key, None)
        if pool is not None and not (pool.ready and pool.alive()):
            pool.kill()
            pool = None
        while len(_pools) >= MAX_POOLS:
            _pools.popitem(last=False)[1].stop()
        if pool is None:
            pool = WorkerPool(world_size, backend)
        _pools[key] = pool
    if not pool.ready:
        pool.wait_ready()
    return pool


def shutdown_pools() -> None:
    """End every worker process of every pool."""
    with _pools_lock:
        while _pools:
            _pools.popitem()[1].stop()


def run_job(fn: Any, cluster: Any, args: tuple, kwargs: dict, backend: str,
            timeout: float) -> LaunchResult:
    """``launch``'s body on gloo/nccl: pickle, run on the pool, gather a ``LaunchResult``."""
    from mpgpu_edu.cluster.trace import Trace

    world_size = resolve_cluster(cluster).world_size
    if world_size < 1:
        raise ValueError("the cluster has no visible devices: make at least one visible")
    if backend == "nccl":
        _check_gpus(world_size)
    job = pickle_job(fn, args, kwargs)
    pool = get_pool(world_size, backend)
    with pool.lock:
        try:
            replies = pool.run(job, timeout)
        except BaseException:
            pool.kill()  # a KeyboardInterrupt too: the workers are mid-job
            raise
    events = sorted((e for r in replies for e in r["events"]),
                    key=lambda e: (e.start, e.device, e.stream, e.end))
    memory = sorted((m for r in replies for m in r["memory"]), key=lambda m: (m.time, m.device))
    trace = Trace(world_size, events, memory, source="measured",
                  meta={"backend": backend, "world_size": world_size})
    logs = [[f"[{t * 1e3:10.4f} ms] {text}" for t, text in r["logs"]] for r in replies]
    return LaunchResult([r["result"] for r in replies], trace, [r["stats"] for r in replies],
                        logs, cluster, backend, [r["ledger"] for r in replies])


def _check_gpus(world_size: int) -> None:
    import torch

    have = torch.cuda.device_count()
    if have < world_size:
        raise ValueError(f"backend 'nccl' needs one GPU per rank: {world_size} ranks, but "
                         f"{have} GPU(s) are visible. Use fewer ranks, or backend='gloo'.")
