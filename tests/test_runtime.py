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
    it, even the server's next child: a kill that comes later (a pool stopped after its
    workers exited) must reach nobody. Here an unrelated process and a later child stand
    for the ones that could hold the pid."""
    server = ForkServer(["os"], name="test")
    unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ended = server.spawn("time:sleep", 0.0, connections=0)
        assert ended.join(30) == 0
        later = server.spawn("time:sleep", 60.0, connections=0)
        ended.kill()  # as WorkerGroup.stop does after its workers have exited
        server.kill(unrelated.pid)  # no child of this server has that id
        time.sleep(1.0)
        assert unrelated.poll() is None, "the server killed a process it did not start"
        assert later.is_alive(), "a kill for an ended child reached the next one"
        later.kill()  # a running child is still killed
        assert later.join(30) == -signal.SIGKILL
    finally:
        unrelated.kill()
        unrelated.wait()
        server.stop()


def test_a_child_that_gets_an_ended_childs_pid_is_not_taken_for_ended() -> None:
    """Pids wrap (at 32768 on many machines; a long test run goes round them): a new child
    may get the pid of one that ended under the same server. The owner knows each child by
    its request's id, so the old exit code is not the new child's. The server's messages
    are fed to the owner's reader here, the new child given the old one's pid."""
    import json
    import socket
    import threading

    from mpgpu_edu.runtime.forkserver import Child

    server = ForkServer(["os"], name="test")
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    reader = threading.Thread(target=server._read, args=(mine,), daemon=True)
    reader.start()
    try:
        for message in ({"ready": 1}, {"spawned": 0, "pid": 4242},
                        {"exit": 4242, "id": 0, "code": -9}, {"spawned": 1, "pid": 4242}):
            theirs.send(json.dumps(message).encode())
        assert wait_until(lambda: 1 in server.spawned, 10)
        old, new = Child(server, 4242, [], 0), Child(server, 4242, [], 1)
        assert old.exitcode == -9
        assert new.exitcode is None, "the new child was taken for the ended one"
    finally:
        theirs.close()
        reader.join(10)
        mine.close()


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
