"""The fork server's own process: ``python -m mpgpu_edu.runtime.server FD MODULE...``.

It imports ``MODULE...`` once (torch takes seconds), then forks a child per request from
its owner (``forkserver.ForkServer``) on the control socket ``FD``. Modules after a
``--later`` argument are imported after the server says it is ready, one at a time while no
request waits: a first request is not held up by them, and a child forked before they are in
imports what it needs itself. Every child

* leads its own session and process group (``setsid``), so it and what it starts are
  killed at once;
* is killed by the kernel if this server dies (``PR_SET_PDEATHSIG``), and the server exits
  when its owner does (end of file on the control socket), so a killed launcher takes
  everything with it;
* runs ``module:function(*connections, *args)`` and exits with ``os._exit``.

The server is a subreaper (``PR_SET_CHILD_SUBREAPER``): a process a child left behind (a
double fork, a ``setsid`` daemon) becomes the server's child when its parent ends, and is
killed when seen, for a few seconds after any child ends. Messages to the owner are JSON,
so that nothing a child could write is ever unpickled by the owner.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import pickle
import select
import signal
import socket
import sys
import time
import traceback
from multiprocessing.connection import Connection

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
SWEEP_S = 3.0  # after a child ends, look for what it left behind this long
MAX_MESSAGE = 1 << 20


def prctl(option: int, value: int) -> bool:
    """Linux's prctl(2); False where there is none."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def children_of(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc)."""
    found = []
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as handle:
                    stat = handle.read()
            except OSError:
                continue
            fields = stat.rsplit(b")", 1)[-1].split()
            if len(fields) > 1 and int(fields[1]) == pid:
                found.append(int(name))
    return found


def ended_child() -> tuple[int, int | None]:
    """``(pid, None)`` of a child that has ended, left unreaped (``waitid`` with
    ``WNOWAIT``); where the system has no such call, ``(pid, wait status)`` of one reaped
    here, its pid free from now on. ``(0, None)``: none has ended."""
    if hasattr(os, "waitid") and hasattr(os, "WNOWAIT"):
        seen = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return (0, None) if seen is None else (seen.si_pid, None)
    pid, status = os.waitpid(-1, os.WNOHANG)
    return pid, status if pid else None


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s process group (it leads one) and ``pid`` itself."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(OSError):
            kill(pid, signal.SIGKILL)


class Server:
    def __init__(self, control: socket.socket) -> None:
        self.control = control
        # Children forked on request and not yet reaped: pid -> the request's id. The owner
        # knows a child by that id, which is never reused; its pid is, once pids wrap.
        self.jobs: dict[int, int] = {}
        self.sweep_until = 0.0

    def send(self, message: dict) -> None:
        with contextlib.suppress(OSError):
            self.control.send(json.dumps(message).encode())

    def serve(self, later: list[str] | None = None) -> None:
        later = list(later or ())
        self.send({"ready": os.getpid()})
        while True:
            timeout = 0.05 if time.monotonic() < self.sweep_until else 0.5
            ready, _, _ = select.select([self.control], [], [], 0 if later else timeout)
            if not ready and later:
                preload(later.pop(0))  # nothing waits: import the next module meanwhile
                continue
            if ready:
                try:
                    data, fds, _, _ = socket.recv_fds(self.control, MAX_MESSAGE, 16)
                except OSError:
                    data, fds = b"", []
                if not data:
                    break  # the owner has gone
                self.handle(pickle.loads(data), fds)
            self.reap()
            if time.monotonic() < self.sweep_until:
                self.sweep()
        for pid in list(self.jobs):
            kill_tree(pid)
        self.sweep()

    def handle(self, request: tuple, fds: list[int]) -> None:
        kind = request[0]
        if kind == "spawn":
            _, request_id, target, args = request
            pid = self.fork(target, args, fds)
            self.jobs[pid] = request_id
            self.send({"spawned": request_id, "pid": pid})
        elif kind == "kill":
            # Only the child of that request, and only while it is still running (or not yet
            # reaped): one that ended was killed with its group when it was reaped, and its
            # pid may be another process's by now, even another child of this server (pids
            # wrap at 32768 on many machines, and a test run goes round them in minutes).
            for pid, child_id in list(self.jobs.items()):
                if child_id == request[1]:
                    kill_tree(pid)
            self.sweep_until = time.monotonic() + SWEEP_S
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def fork(self, target: str, args: tuple, fds: list[int]) -> int:
        # Everything preloaded so far moves to the collector's permanent generation: a child's
        # first collection then scans only what it made itself (it scanned torch, matplotlib
        # and dynamo's objects, about 0.2 s in every child), and touches no page it shares.
        gc.freeze()
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:
            self.control.close()
            os.setsid()
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            module, _, name = target.partition(":")
            function = getattr(importlib.import_module(module), name)
            function(*[Connection(fd) for fd in fds], *args)
            code = 0
        except BaseException:  # noqa: BLE001 - the child's last words, then it exits
            with contextlib.suppress(Exception):
                traceback.print_exc()
        finally:
            os._exit(code)
        return 0  # not reached

    def reap(self) -> None:
        while True:
            # Look before reaping (WNOWAIT): while the child is a zombie its pid is still its
            # own, so what it started in its own group is killed before the pid can pass to
            # another process.
            try:
                pid, status = ended_child()
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.jobs:  # what it started in its own group goes with it
                if status is None:
                    kill_tree(pid)
                else:  # reaped already: its group only, not a pid that may be reused
                    with contextlib.suppress(OSError):
                        os.killpg(pid, signal.SIGKILL)
            if status is None:
                try:
                    _, status = os.waitpid(pid, 0)
                except ChildProcessError:
                    continue
            if pid in self.jobs:
                child_id = self.jobs.pop(pid)
                self.sweep_until = time.monotonic() + SWEEP_S
                self.send({"exit": pid, "id": child_id,
                           "code": os.waitstatus_to_exitcode(status)})

    def sweep(self) -> None:
        """Kill every child of this server that it did not fork itself: orphans of a job."""
        for pid in children_of(os.getpid()):
            if pid not in self.jobs:
                kill_tree(pid)


def preload(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - the child that needs it reports the error
        traceback.print_exc()


def main(argv: list[str]) -> None:
    control = socket.socket(fileno=int(argv[0]))
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the owner's to handle
    modules = argv[1:]
    cut = modules.index("--later") if "--later" in modules else len(modules)
    first, later = modules[:cut], modules[cut + 1:]
    for module in first:
        preload(module)
    Server(control).serve(later)
    # Every child is dead by now. Skip the interpreter's teardown (seconds, with torch loaded),
    # which the owner's stop() would otherwise wait out for each server.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
