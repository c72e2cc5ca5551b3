"""A worker of ``comm``'s pool: one rank, a child of the runtime's fork server.

It joins the process group once, then runs job after job: ``(sys.path, cwd, check, job)``
from the launcher, where ``job`` is the pickled ``(fn, args, kwargs)``. Each job gets a fresh
``DistCommunicator`` on the process group the worker already has, and its reply (result,
measured events, stats, log) goes back pickled. Modules a job imported are forgotten when
their file changes, so an edit to ``exercises/my_code.py`` reaches the next job.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import pickle
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any

import torch

from mpgpu_edu.comm.dist_work import MAIN, STREAM
from mpgpu_edu.runtime.board import RankBoard, SharedBoard

STARTUP_TIMEOUT_S = 300.0  # importing torch on a busy laptop can take a while
# A message that waits longer than this fails with the message named (MessageTimeoutError);
# the launcher's own timeout (60 s by default) usually stops a deadlock sooner.
PROCESS_GROUP_TIMEOUT = datetime.timedelta(minutes=5)


def worker_main(conn: Connection, rank: int, world_size: int, backend: str, port: int,
                board_path: str) -> None:
    """Join the process group once, then run jobs until told to stop."""
    # One intra-op thread per rank, as torchrun sets: N ranks each spawning a thread per
    # core would fight over the cores (an add of 512 KiB took 20 ms instead of 0.1 ms).
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    board, lock = RankBoard(SharedBoard(board_path, 2 * world_size), rank), threading.Lock()

    def send(message: tuple) -> None:
        with lock:
            conn.send_bytes(pickle.dumps(message))

    try:
        lanes = _join(rank, world_size, backend, port)
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher
        send(_error(exc, ""))
        return
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

    from mpgpu_edu.comm.dist_work import init_lanes

    os.environ["LOCAL_RANK"] = str(rank)  # nccl: rank r uses cuda:r
    store = dist.TCPStore("127.0.0.1", port, is_master=False,
                          timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=PROCESS_GROUP_TIMEOUT)
    return init_lanes(backend)


def _run_one(message: bytes, lanes: Any, board: RankBoard, send: Any, baseline: set[str],
             seen: dict[str, float]) -> tuple:
    from mpgpu_edu.comm.dist import DistCommunicator

    path, cwd, check_messages, job = pickle.loads(message)
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
                                    lambda exc: send(_error(exc, output.getvalue())),
                                    check_messages=check_messages)
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
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ours = (os.path.join(package, "comm"), os.path.join(package, "runtime"))
    while frames is not None and frames.tb_frame.f_code.co_filename.startswith(ours):
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
