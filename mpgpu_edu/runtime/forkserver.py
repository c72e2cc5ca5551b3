"""The owner's side of a fork server (``server``): start it, ask it for children, stop it.

A ``ForkServer`` belongs to whoever made it (the worker pool of ``comm``, the grader); it
holds its own list of modules to preload, its own process and its own lock, so two users
never share or race on a setting. ``prefix`` runs the server inside a sandbox (``sandbox``),
whose children then inherit it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from typing import Any

from mpgpu_edu.runtime.errors import RuntimeStartError

START_TIMEOUT_S = 300.0  # importing torch on a busy laptop can take a while


class Child:
    """A process the server forked: its ``pid`` (in the server's view), the number of the
    request that made it (``id``, never reused while the server lives: a pid is, once the
    system's pids wrap, so the owner and the server know a child by its id), the owner's
    ends of its connections, and its exit code once the server has seen it end."""

    def __init__(self, server: ForkServer, pid: int, conns: list[Connection],
                 child_id: int) -> None:
        self.server, self.pid, self.conns, self.id = server, pid, conns, child_id

    @property
    def exitcode(self) -> int | None:
        return self.server.exitcode(self.id)

    def is_alive(self) -> bool:
        return self.server.running() and self.exitcode is None

    def join(self, timeout: float) -> int | None:
        return self.server.wait_exit(self.id, timeout)

    def kill(self) -> None:
        """Kill it, its process group and whatever it left behind (nothing, once it has
        ended: its pid may be another process's by then)."""
        self.server.kill(self.id)

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


class ForkServer:
    def __init__(self, preload: Sequence[str], prefix: Sequence[str] = (),
                 env: dict[str, str] | None = None, name: str = "mpgpu-edu",
                 preexec: Callable[[], None] | None = None) -> None:
        self.preload, self.prefix, self.name = list(preload), list(prefix), name
        self.preexec = preexec
        self.extra_env = dict(env or {})
        self.lock = threading.Lock()  # starting, spawning, stopping
        self.cond = threading.Condition()
        self.process: subprocess.Popen | None = None
        self.control: socket.socket | None = None
        self.spawned: dict[int, int] = {}  # request id: pid
        self.exits: dict[int, int] = {}  # child id (its request's): exit code
        self.server_pid = 0
        self.ids = itertools.count()

    # ---- life ---------------------------------------------------------------------------
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start the server (if it is not running) and wait until it has preloaded."""
        with self.lock:
            if self.running() and self.server_pid:
                return
            self._start()

    def _start(self) -> None:
        self._close()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ, **self.extra_env)
        env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        command = self.prefix + [sys.executable, "-m", "mpgpu_edu.runtime.server",
                                 str(theirs.fileno()), *self.preload]
        self.process = subprocess.Popen(command, pass_fds=[theirs.fileno()], env=env,
                                        stdin=subprocess.DEVNULL, preexec_fn=self.preexec)
        theirs.close()
        self.control, self.spawned, self.exits, self.server_pid = mine, {}, {}, 0
        threading.Thread(target=self._read, args=(mine,), daemon=True,
                         name=f"{self.name}-forkserver").start()
        with self.cond:
            ready = self.cond.wait_for(lambda: self.server_pid or not self.running(),
                                       START_TIMEOUT_S)
        if not ready or not self.server_pid:
            code = self.process.poll()
            self._close()
            raise RuntimeStartError(f"the {self.name} fork server did not start (exit code "
                                    f"{code}); run `mpgpu-edu doctor`")

    def stop(self) -> None:
        """End the server; its children die with it."""
        with self.lock:
            self._close()

    def _close(self) -> None:
        if self.control is not None:
            with contextlib.suppress(OSError):
                # Shut down before closing: the reader thread's blocked recv() keeps the
                # socket open after a bare close(), so the server would never see end of file
                # and stop() would wait out its timeout, then kill it.
                self.control.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                self.control.close()
        if self.process is not None:
            try:
                self.process.wait(5.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5.0)
        self.process = self.control = None
        with self.cond:
            self.server_pid = 0
            self.cond.notify_all()

    def _read(self, control: socket.socket) -> None:
        while True:
            try:
                data = control.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            try:
                message = json.loads(data)
            except ValueError:
                continue
            with self.cond:
                if "ready" in message:
                    self.server_pid = int(message["ready"])
                elif "spawned" in message:
                    self.spawned[int(message["spawned"])] = int(message["pid"])
                elif "exit" in message:
                    self.exits[int(message["id"])] = int(message["code"])
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    # ---- children -------------------------------------------------------------------------
    def spawn(self, target: str, *args: Any, connections: int = 1) -> Child:
        """Fork a child that runs ``target`` (``"module:function"``) with ``connections``
        duplex connections, then ``args`` (pickled; the server trusts its owner)."""
        self.start()
        pairs = [Pipe(duplex=True) for _ in range(connections)]
        request_id = next(self.ids)
        message = pickle.dumps(("spawn", request_id, target, args))
        with self.lock:
            if self.control is None:
                raise RuntimeStartError(f"the {self.name} fork server is not running")
            socket.send_fds(self.control, [message], [theirs.fileno() for _, theirs in pairs])
        for _, theirs in pairs:
            theirs.close()
        with self.cond:
            self.cond.wait_for(lambda: request_id in self.spawned or not self.running(), 30.0)
            pid = self.spawned.pop(request_id, None)
        if pid is None:
            raise RuntimeStartError(f"the {self.name} fork server did not start a process")
        return Child(self, pid, [mine for mine, _ in pairs], request_id)

    def kill(self, child_id: int) -> None:
        """Kill child ``child_id`` (``Child.id``) if it is still running."""
        with self.lock:
            if self.control is not None:
                with contextlib.suppress(OSError):
                    self.control.send(pickle.dumps(("kill", child_id)))

    def exitcode(self, child_id: int) -> int | None:
        with self.cond:
            return self.exits.get(child_id)

    def wait_exit(self, child_id: int, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        with self.cond:
            self.cond.wait_for(lambda: child_id in self.exits or not self.running()
                               or time.monotonic() >= deadline, timeout)
            return self.exits.get(child_id)
