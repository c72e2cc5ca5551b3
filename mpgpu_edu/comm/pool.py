"""A pool of worker processes that run SPMD jobs on ``torch.distributed``.

Starting a process that imports torch and joins a process group takes seconds; a notebook
launches small programs again and again. So the processes of one (world size, backend) stay
alive between launches: a launch pickles ``(fn, args, kwargs)`` to every worker through a pipe,
each runs ``fn(comm, ...)`` with a fresh ``DistCommunicator`` on the process group it already
has, and sends back its result, measured events, stats and log. At most ``MAX_POOLS`` pools are
kept (the least recently used one is shut down); ``shutdown_pools()`` ends them all and also
runs at interpreter exit.

Faults. A rank that raises, a worker that dies, or a job still running after its timeout
leaves the process group in an unknown state (a peer may be blocked in a receive forever), so
the pool's processes are killed, the launch raises, and the next launch starts a fresh pool.
While it waits, each worker writes what it is blocked on into shared memory (``SharedBoard``),
which the launcher can read even while the worker is stuck inside C++.

Workers are fresh interpreters, never copies of a notebook that may hold CUDA state or threads:
forks of a clean fork server that imported torch once (``spawn`` where there is no fork
server). They receive the launcher's ``sys.path`` and working directory with every job, and
forget modules whose file changed since the last job, so an edit to ``exercises/my_code.py``
reaches them. Functions travel by name, so they must live in a module, not in the notebook.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import functools
import io
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import types
from collections import OrderedDict
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
from torch.distributed import TCPStore

from mpgpu_edu.comm.dist import MAIN, STREAM, NotPicklableError, OpBoard, WorkerDiedError
from mpgpu_edu.comm.errors import LaunchTimeoutError, RankError

MAX_POOLS = 2
SLOT_BYTES = 256
STARTUP_TIMEOUT_S = 300.0  # importing torch on a busy laptop can take a while
GRACE_S = 0.3  # after a first failure, how long to wait for other ranks' reports
PROCESS_GROUP_TIMEOUT = datetime.timedelta(days=1)  # the launcher enforces job timeouts


# ---- what a rank is blocked on, in shared memory ---------------------------------------------
class SharedBoard(OpBoard):
    """Rank ``rank``'s two slots (program, comm stream) in an array shared with the launcher."""

    def __init__(self, array: Any, rank: int) -> None:
        self.array, self.rank = array, rank

    def set(self, lane: int, text: str) -> None:
        data = text.encode()[:SLOT_BYTES - 1]
        start = (2 * self.rank + lane) * SLOT_BYTES
        self.array[start:start + SLOT_BYTES] = data.ljust(SLOT_BYTES, b"\0")

    def get(self, lane: int) -> str:
        start = (2 * self.rank + lane) * SLOT_BYTES
        return bytes(self.array[start:start + SLOT_BYTES]).split(b"\0", 1)[0].decode(
            errors="replace")


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


# ---- the launcher's side -------------------------------------------------------------------
class WorkerPool:
    """``world_size`` worker processes in one process group of ``backend``."""

    def __init__(self, world_size: int, backend: str) -> None:
        self.world_size, self.backend = world_size, backend
        self.lock = threading.Lock()
        ctx = _context()
        self.array = ctx.RawArray("c", 2 * world_size * SLOT_BYTES)
        # The launcher hosts the rendezvous store on a free port chosen by the OS.
        self.store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        for rank in range(world_size):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, name=f"mpgpu-{backend}-rank{rank}",
                               args=(rank, world_size, backend, self.store.port, theirs,
                                     self.array), daemon=True)
            with _main_hidden():
                proc.start()
            theirs.close()
            self.conns.append(mine)
            self.procs.append(proc)
        self.ready = False

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def wait_ready(self) -> None:
        messages = self._collect(STARTUP_TIMEOUT_S, "ready")
        bad = {r: m for r, m in messages.items() if m[0] != "ready"}
        if bad:
            self.kill()
            rank, message = min(bad.items())
            detail = (message[2] if message[0] == "error"
                      else f"its process died (exit code {message[1]})")
            raise RuntimeError(f"the {self.backend} worker processes did not start: rank {rank}"
                               f" failed:\n{detail}")
        self.ready = True

    def run(self, job: bytes, timeout: float) -> list[dict]:
        """Send one job to every worker and return their replies, in rank order."""
        cwd = os.getcwd()
        header = pickle.dumps(([p or cwd for p in sys.path], cwd, job))
        for conn in self.conns:
            with contextlib.suppress(OSError):  # a dead worker is reported by _collect
                conn.send_bytes(header)
        messages = self._collect(timeout, "ok")
        failed = {r: m for r, m in messages.items() if m[0] != "ok"}
        for rank, message in sorted(messages.items()):
            _print_output(rank, message[-1])
        if failed:
            self.kill()
            raise _failure(failed)
        return [pickle.loads(messages[r][1]) for r in range(self.world_size)]

    def _collect(self, timeout: float, good: str) -> dict[int, tuple]:
        """Each rank's reply; stops early (after a short grace) once one rank fails."""
        deadline, messages = time.monotonic() + timeout, {}
        first_failure: float | None = None
        while len(messages) < self.world_size:
            now = time.monotonic()
            until = deadline if first_failure is None else first_failure + GRACE_S
            if now > until:
                if first_failure is not None:
                    break
                self.timed_out(messages, timeout)
            waiting = [r for r in range(self.world_size) if r not in messages]
            wait([self.conns[r] for r in waiting] + [self.procs[r].sentinel for r in waiting],
                 max(0.0, until - now))
            for r in waiting:
                message = self._poll(r)
                if message is not None:
                    messages[r] = message
                    if message[0] != good and first_failure is None:
                        first_failure = time.monotonic()
        return messages

    def _poll(self, rank: int) -> tuple | None:
        conn, proc = self.conns[rank], self.procs[rank]
        try:
            if conn.poll():
                return pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            pass
        if not proc.is_alive():
            proc.join(1.0)
            return ("died", proc.exitcode, "")
        return None

    def timed_out(self, messages: dict[int, tuple], timeout: float) -> None:
        board = [SharedBoard(self.array, r) for r in range(self.world_size)]
        lines = []
        for r in range(self.world_size):
            main = "finished" if r in messages else _doing(board[r].get(MAIN))
            lines.append(f"  rank {r}: {main}")
            if r not in messages and board[r].get(STREAM):
                lines.append(f"  rank {r} (comm stream): {_doing(board[r].get(STREAM))}")
        self.kill()
        raise LaunchTimeoutError(f"ranks still running after {timeout:g} s, all stopped:\n"
                                 + "\n".join(lines)
                                 + "\nRaise `timeout=` if the work is just slow, else look "
                                 "for a rank waiting on a message nobody sends.")

    def kill(self) -> None:
        """Stop every worker now (after a fault: they may be blocked inside C++)."""
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        self._reap()

    def stop(self) -> None:
        """Ask idle workers to leave their process group and exit; kill the stragglers."""
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send_bytes(b"stop")
        deadline = time.monotonic() + 2.0
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self.kill()

    def _reap(self) -> None:
        for proc in self.procs:
            proc.join(5.0)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        self.store, self.ready = None, False


def _context() -> Any:
    """``forkserver`` where the OS has it, else ``spawn``. The fork server is a fresh process
    (never a copy of the notebook) that imports torch once; each worker is a fork of it, so
    a pool starts in well under a second once the server runs, instead of every worker
    importing torch again."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["mpgpu_edu.comm.pool"])
    return ctx


@contextlib.contextmanager
def _main_hidden() -> Any:
    """While a worker is spawned, show it an empty ``__main__``. Otherwise spawn re-runs the
    launcher's script in every worker (to find functions defined there, which we refuse
    anyway), and a script without ``if __name__ == "__main__":`` would launch again."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _doing(text: str) -> str:
    return {"running": "running Python code (an endless loop?)",
            "": "has not started the job (still loading the function?)"}.get(text, text)


def _print_output(rank: int, output: str) -> None:
    for line in output.splitlines():
        print(f"[rank {rank}] {line}")


def _failure(failed: dict[int, tuple]) -> RankError:
    died = {r: m for r, m in failed.items() if m[0] == "died"}
    if died:
        rank = min(died)
        return WorkerDiedError(rank, died[rank][1])
    rank = min(failed)
    _, summary, tb, original, _ = failed[rank]
    try:
        exc = pickle.loads(original) if original is not None else None
    except Exception:  # noqa: BLE001 - an exception class the launcher cannot rebuild
        exc = None
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


atexit.register(shutdown_pools)


def run_job(fn: Any, cluster: Any, args: tuple, kwargs: dict, backend: str,
            timeout: float) -> Any:
    """``launch_dist``'s body: pickle, run on the pool, and gather a ``LaunchResult``."""
    from mpgpu_edu.comm.launch import LaunchResult, resolve_cluster
    from mpgpu_edu.trace import Trace

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


# ---- the worker's side ---------------------------------------------------------------------
def _worker_main(rank: int, world_size: int, backend: str, port: int, conn: Connection,
                 array: Any) -> None:
    """A worker: join the process group once, then run jobs until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    # One intra-op thread per rank, as torchrun sets: N ranks each spawning a thread per
    # core would fight over the cores (an add of 512 KiB took 20 ms instead of 0.1 ms).
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    board, lock = SharedBoard(array, rank), threading.Lock()

    def send(message: tuple) -> None:
        with lock:
            conn.send_bytes(pickle.dumps(message))

    try:
        lanes = _join(rank, world_size, backend, port)
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher
        send(_error(exc, ""))
        return
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    send(("ready", ""))
    baseline: set[str] = set(sys.modules)
    seen: dict[str, float] = {}
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            break  # the launcher has gone
        if message == b"stop":
            break
        send(_run_one(message, lanes, board, send, baseline, seen))
    # Every rank leaves at once, so there is nothing to tear down politely; skipping
    # interpreter shutdown makes stopping a pool take milliseconds instead of seconds.
    os._exit(0)


def _join(rank: int, world_size: int, backend: str, port: int) -> Any:
    import torch.distributed as dist

    from mpgpu_edu.comm.dist import init_lanes

    os.environ["LOCAL_RANK"] = str(rank)  # nccl: rank r uses cuda:r
    store = dist.TCPStore("127.0.0.1", port, is_master=False,
                          timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=PROCESS_GROUP_TIMEOUT)
    return init_lanes(backend)


def _watch_parent(parent_pid: int) -> None:
    """Exit if the launcher dies, even while a job is blocked (no orphans). The parent is the
    launcher (spawn) or the fork server, which exits with the launcher."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)


def _run_one(message: bytes, lanes: Any, board: SharedBoard, send: Any, baseline: set[str],
             seen: dict[str, float]) -> tuple:
    from mpgpu_edu.comm.dist import DistCommunicator

    path, cwd, job = pickle.loads(message)
    sys.path[:] = path + [p for p in sys.path if p not in path]
    os.chdir(cwd)
    _forget_changed_modules(seen)
    board.set(MAIN, "")
    board.set(STREAM, "")
    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        try:
            fn, args, kwargs = pickle.loads(job)
            comm = DistCommunicator(lanes, board,
                                    lambda exc: send(_error(exc, output.getvalue())))
            comm.start_clock()
            result = fn(comm, *args, **kwargs)
            comm.finish()
            payload = _pickle_reply(comm, result)
        except BaseException as exc:  # noqa: BLE001 - reported to the launcher
            return _error(exc, output.getvalue())
        finally:
            _note_modules(baseline, seen)
    return ("ok", payload, output.getvalue())


def _pickle_reply(comm: Any, result: Any) -> bytes:
    reply = {"result": _to_cpu(result), "events": comm.events, "memory": comm.memory.events,
             "stats": comm.stats, "logs": comm.logs, "ledger": comm.memory.ledger}
    try:
        return pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - many types
        raise TypeError(f"rank {comm.rank}'s result cannot be sent back to the launcher "
                        f"({type(exc).__name__}: {exc}): return tensors, numbers, strings, "
                        "lists or dicts of them") from None


def _to_cpu(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, torch.nn.Module):
        return value.cpu()
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_to_cpu(v) for v in value)
    if type(value) is dict:
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def _error(exc: BaseException, output: str) -> tuple:
    frames = exc.__traceback__
    ours = (__file__, sys.modules["mpgpu_edu.comm.dist"].__file__)
    while frames is not None and frames.tb_frame.f_code.co_filename in ours:
        frames = frames.tb_next  # start the traceback at the learner's code
    tb = "".join(traceback.format_exception(type(exc), exc, frames))
    try:
        original = pickle.dumps(exc)
    except Exception:  # noqa: BLE001 - an exception holding something unpicklable
        original = None
    return ("error", f"{type(exc).__name__}: {exc}", tb, original, output)


def _user_file(module: Any) -> str | None:
    path = getattr(module, "__file__", None)
    if not path or path.startswith((sys.prefix, sys.base_prefix)):
        return None  # the standard library and installed packages do not change
    return path


def _note_modules(baseline: set[str], seen: dict[str, float]) -> None:
    for name, module in list(sys.modules.items()):
        path = _user_file(module)
        if name not in baseline and name not in seen and path and os.path.exists(path):
            seen[name] = os.path.getmtime(path)


def _forget_changed_modules(seen: dict[str, float]) -> None:
    """If any module a job imported changed on disk, forget them all, so the next job imports
    the code as it is now."""
    def changed(name: str) -> bool:
        path = _user_file(sys.modules.get(name))
        return path is None or not os.path.exists(path) or os.path.getmtime(path) != seen[name]

    if any(changed(name) for name in seen):
        for name in seen:
            sys.modules.pop(name, None)
        seen.clear()
