"""The runtime's fork server: a child that ends takes what it started with it (its process
group, and daemons that left the group with ``setsid`` and a double fork), and a server whose
owner goes away ends with its children."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from mpgpu_edu.runtime import ForkServer

MARK = "mpgpuruntimet"


def named(mark: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == mark]


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


DAEMONS = textwrap.dedent(f"""
    import ctypes, os, time
    def name_me():
        ctypes.CDLL(None).prctl(15, b"{MARK}", 0, 0, 0)
    if os.fork() == 0:          # a child in the same process group
        name_me()
        time.sleep(120)
        os._exit(0)
    if os.fork() == 0:          # a daemon: new session, double fork
        os.setsid()
        if os.fork() == 0:
            name_me()
            time.sleep(120)
        os._exit(0)
    time.sleep(1.0)             # both are running when this returns normally
""")


def test_a_child_that_ends_takes_its_processes_and_daemons_with_it(tmp_path: Path) -> None:
    script = tmp_path / "daemons.py"
    script.write_text(DAEMONS)
    server = ForkServer(["os"], name="test")
    try:
        child = server.spawn("runpy:run_path", str(script), connections=0)
        assert wait_until(lambda: len(named(MARK)) == 2, 30), named(MARK)
        assert child.join(30) == 0
        assert wait_until(lambda: named(MARK) == [], 10), named(MARK)
    finally:
        server.stop()


def test_a_kill_for_a_child_that_has_ended_touches_no_other_process() -> None:
    """A child's pid is free once it has ended and been reaped, and the next process may get
    it: a kill that comes later (a pool stopped after its workers exited) must not reach
    that process. Here the pid of an unrelated process stands for the reused one."""
    server = ForkServer(["os"], name="test")
    unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child = server.spawn("time:sleep", 0.0, connections=0)
        assert child.join(30) == 0
        child.kill()  # as WorkerGroup.stop does after its workers have exited
        server.kill(unrelated.pid)  # a kill for a pid that is not the server's child
        time.sleep(1.0)
        assert unrelated.poll() is None, "the server killed a process it did not start"
        running = server.spawn("time:sleep", 60.0, connections=0)
        running.kill()  # a running child is still killed
        assert running.join(30) == -signal.SIGKILL
    finally:
        unrelated.kill()
        unrelated.wait()
        server.stop()


def test_a_server_whose_owner_is_killed_ends_with_its_children(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(textwrap.dedent(f"""
        import ctypes, time
        ctypes.CDLL(None).prctl(15, b"{MARK}x", 0, 0, 0)
        time.sleep(120)
    """))
    owner = textwrap.dedent(f"""
        from mpgpu_edu.runtime import ForkServer
        server = ForkServer(["os"], name="owner")
        server.spawn("runpy:run_path", {str(script)!r}, connections=0)
        print(server.process.pid, flush=True)
        import time
        time.sleep(120)
    """)
    process = subprocess.Popen([sys.executable, "-c", owner], stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(process.stdout.readline())
        assert wait_until(lambda: len(named(MARK + "x")) == 1, 30)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
        assert wait_until(lambda: named(MARK + "x") == [] and not (
            psutil.pid_exists(server_pid)
            and psutil.Process(server_pid).status() != psutil.STATUS_ZOMBIE), 15)
    finally:
        if process.poll() is None:
            process.kill()
