"""Cutting one freshly forked process off from its siblings (``comm.apart``'s rank processes
in class grading): each then reaches the others only through the pipes it was given.

``cut_off(private)``, in a process with one thread:

* makes it not dumpable (``PR_SET_DUMPABLE`` 0), so that no other process of the same user
  reads or writes its memory through ``/proc/PID/mem`` or ``ptrace``; ``not_dumpable()``
  does that alone (the launcher of the rank processes calls it for itself);
* moves it into new user, mount, network and IPC namespaces: no abstract Unix socket, no
  System V shared memory and no network peer of another process is reachable;
* mounts an empty, read-only ``tmpfs`` over each folder of ``private`` (the scratch
  folder, ``/tmp``, ``/dev/shm``), so that no file passes from one process to another (a
  write fails with "Read-only file system"; read-only, because inside the class-grading
  sandbox, whose capabilities are dropped, the new user namespace cannot map the process's
  own user, so a file it made would have no owner); the package's and
  Python's own folders, where one lies inside such a folder, are shown again on top (a
  folder inside one of them is left as it is);

``only_fds(keep)`` points every other file descriptor at ``/dev/null`` (a forked process
inherits its parent's pipes, a grading child's pipe to the grader among them; the numbers
stay taken, so that no object of the parent's closes a file the process opens later).

``cut_off`` returns what it could not do (empty when everything was done), so that a caller
may refuse to go on: namespaces need a Linux kernel that lets a user make them (the class-grading
sandbox already needs that).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterable
from pathlib import Path

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
CLONE_NEWIPC, CLONE_NEWNET = 0x08000000, 0x40000000
PR_SET_DUMPABLE = 4
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 0x1000, 0x4000, 0x40000


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def not_dumpable() -> str:
    """Make this process not dumpable; '' or what went wrong."""
    if sys.platform != "linux":
        return "not Linux: the process stays dumpable"
    if _libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        return f"prctl(PR_SET_DUMPABLE): {os.strerror(ctypes.get_errno())}"
    return ""


def cut_off(private: Iterable[str | Path]) -> list[str]:
    """See the module's docstring; call it in a child with a single thread."""
    problems = [p for p in [not_dumpable()] if p]
    if sys.platform != "linux":
        return problems
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    cwd = Path(os.getcwd())
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC) != 0:
        problems.append(f"unshare: {os.strerror(ctypes.get_errno())}")
        return problems
    with contextlib.suppress(OSError):  # the same ids inside, so files keep their owner
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        problems.append(f"mount --make-rprivate /: {os.strerror(ctypes.get_errno())}")
    else:
        needed = [Path(__file__).resolve().parents[1], Path(sys.prefix).resolve(),
                  Path(sys.base_prefix).resolve(), Path(os.__file__).resolve().parent]
        for folder in dict.fromkeys(Path(p).resolve() for p in private):
            if not folder.is_dir() or any(n == folder or n in folder.parents for n in needed):
                continue
            inside = [n for n in needed if folder in n.parents]  # shown again on top
            fds = [os.open(n, os.O_PATH | os.O_DIRECTORY) for n in inside]
            if libc.mount(b"tmpfs", str(folder).encode(), b"tmpfs",
                          MS_RDONLY | MS_NOSUID | MS_NODEV, b"size=1m,mode=0555") != 0:
                problems.append(f"tmpfs over {folder}: {os.strerror(ctypes.get_errno())}")
            else:
                for n, fd in zip(inside, fds):
                    n.mkdir(parents=True, exist_ok=True)
                    if libc.mount(f"/proc/self/fd/{fd}".encode(), str(n).encode(), None,
                                  MS_BIND | MS_REC, None) != 0:
                        problems.append(f"{n} shown again: {os.strerror(ctypes.get_errno())}")
            for fd in fds:
                os.close(fd)
        _enter_again(cwd)
    return problems


def _enter_again(cwd: Path) -> None:
    """Make the working folder the one its path names now (the empty folder mounted over
    it), or, where a mount over a folder above hid the path, the nearest folder above."""
    for folder in (cwd, *cwd.parents):
        try:
            os.chdir(folder)
            return
        except OSError:
            continue


def only_fds(keep: Iterable[int]) -> None:
    """Point every file descriptor but 0, 1, 2 and ``keep`` at ``/dev/null``."""
    kept = {0, 1, 2, *keep}
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd not in kept and fd != null:
                with contextlib.suppress(OSError):
                    os.dup2(null, fd)
    finally:
        os.close(null)
