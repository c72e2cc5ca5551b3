"""Cutting one freshly forked process off from its siblings (``comm.apart``'s rank processes
in class grading): each then reaches the others only through the pipes it was given.

``cut_off(private)``, in a process with one thread:

* makes it not dumpable (``PR_SET_DUMPABLE`` 0), so that no other process of the same user
  reads or writes its memory through ``/proc/PID/mem`` or ``ptrace``; ``not_dumpable()``
  does that alone (the launcher of the rank processes calls it for itself);
* moves it into new user, mount, network, IPC and PID namespaces: no abstract Unix socket,
  no System V shared memory, no network peer and no other process (not in a new ``/proc``,
  or an empty one where the sandbox's cannot be mounted again; not to a signal) is
  reachable; no pseudo-terminal can be made. For the PID namespace it forks: the child goes
  on as the first process of the namespace, the caller waits for it and ends with it;
* mounts an empty ``tmpfs`` over each folder of ``private`` (the scratch folder, ``/tmp``,
  ``/dev/shm``), the package's and Python's own folders shown again on top where one lies
  inside such a folder, then makes every mount read-only (``/dev`` and the sandbox's own
  tmpfs folders included), so that no file passes from one process to another: a write
  fails with "Read-only file system". Read-only, because inside the class-grading sandbox,
  whose capabilities are dropped, the new user namespace cannot map the process's own
  user: a file it made would have no owner.

* hides ``/sys`` (an empty tmpfs) and, with a seccomp filter, refuses the system calls that
  reach state the kernel keeps for the whole machine whatever the namespace, which one
  process can set and another read: file locks (a lock on a read-only file shows to every
  process that asks), inotify and fanotify, page-cache residency (``mincore``,
  ``cachestat``) and the user's keyrings. Channels through timing and through the machine's
  free memory stay open: slow and noisy, not closed.

``hide_files(files, folders)`` makes files read as empty and folders empty, for the calling
process and those it starts (a class-grading child or rank hides the source and compiled
copies of the package code it blocks, whose original it has forgotten).

``only_fds(keep)`` points every other file descriptor at ``/dev/null`` (a forked process
inherits its parent's pipes, a grading child's pipe to the grader among them; the numbers
stay taken, so that no object of the parent's closes a file the process opens later).

``cut_off`` returns what it could not do (empty when everything was done), so that a caller
may refuse to go on: namespaces need a Linux kernel that lets a user make them (the
class-grading sandbox already needs that).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import sys
from collections.abc import Iterable
from pathlib import Path

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWPID = 0x08000000, 0x40000000, 0x20000000
PR_SET_DUMPABLE = 4
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE = 1024, 2048, 0x1000, 0x4000, 0x40000
MS_RELATIME = 1 << 21
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


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
    """See the module's docstring; call it in a child with a single thread. The process
    that called it ends here, once the process that goes on (its child, the first of a new
    PID namespace) has ended."""
    problems = [p for p in [not_dumpable()] if p]
    if sys.platform != "linux":
        return problems
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    cwd = Path(os.getcwd())
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC
                    | CLONE_NEWPID) != 0:
        problems.append(f"unshare: {os.strerror(ctypes.get_errno())}")
        return problems
    with contextlib.suppress(OSError):  # the same ids inside, so files keep their owner
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        problems.append(f"mount --make-rprivate /: {os.strerror(ctypes.get_errno())}")
        return problems
    problems += _empty_folders(libc, private)
    problems += _all_read_only(libc)
    _enter_again(cwd)
    _first_of_new_pids(libc, problems)
    problems += _hidden(libc, "/sys")
    problems += _no_shared_kernel_state(libc)
    return problems


def hide_files(files: Iterable[str | Path], folders: Iterable[str | Path]) -> list[str]:
    """Make each of ``files`` read as empty and each of ``folders`` an empty read-only folder,
    for this process and those it starts: in a mount namespace of its own (made here: with
    ``CAP_SYS_ADMIN`` a new mount namespace, else a new user namespace too, which needs a
    single-threaded caller). '' problems, or what went wrong."""
    if sys.platform != "linux":
        return ["not Linux: the files stay readable"]
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWNS) != 0:
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
            return [f"unshare: {os.strerror(ctypes.get_errno())}"]
        with contextlib.suppress(OSError):  # the same ids inside, so files keep their owner
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
            Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return [f"mount --make-rprivate /: {os.strerror(ctypes.get_errno())}"]
    problems = []
    for file in sorted({str(f) for f in files}):
        if os.path.isfile(file) and libc.mount(b"/dev/null", file.encode(), None, MS_BIND,
                                               None) != 0:
            problems.append(f"{file} hidden: {os.strerror(ctypes.get_errno())}")
    for folder in sorted({str(f) for f in folders}):
        problems += _hidden(libc, folder)
    return problems


def _hidden(libc: ctypes.CDLL, folder: str) -> list[str]:
    """An empty read-only tmpfs over ``folder`` (``/sys``: its counters of the whole machine,
    of the sandbox's cgroup, are state another process can change)."""
    if not os.path.isdir(folder) or libc.mount(
            b"tmpfs", folder.encode(), b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
            b"size=4k") == 0:
        return []
    return [f"{folder} hidden: {os.strerror(ctypes.get_errno())}"]


# System calls that reach state the kernel keeps for the whole machine, not per namespace,
# which one process can set and another read: file locks (fcntl's record locks, flock: one
# lock table per file, whatever the mount), inotify and fanotify (an access to a file shows
# to a watcher of it), page-cache residency (mincore, cachestat) and the user's keyrings.
# By machine: (audit arch, {name: number}).
_SYSCALLS = {
    "x86_64": (0xC000003E, {"flock": 73, "inotify_init": 253, "inotify_add_watch": 254,
                            "inotify_init1": 294, "fanotify_init": 300, "fanotify_mark": 301,
                            "mincore": 27, "cachestat": 451, "add_key": 248,
                            "request_key": 249, "keyctl": 250}, 72),
    "aarch64": (0xC00000B7, {"flock": 32, "inotify_init1": 26, "inotify_add_watch": 27,
                             "fanotify_init": 262, "fanotify_mark": 263, "mincore": 232,
                             "cachestat": 451, "add_key": 217, "request_key": 218,
                             "keyctl": 219}, 25),
}
_LOCK_COMMANDS = (5, 6, 7, 36, 37, 38)  # F_GETLK, F_SETLK, F_SETLKW and their OFD forms


def _no_shared_kernel_state(libc: ctypes.CDLL) -> list[str]:
    """A seccomp filter: the calls of ``_SYSCALLS`` and fcntl's lock commands fail with
    EPERM (and every call of another ABI, x32's or i386's on x86_64, which would name them
    by other numbers)."""
    import platform
    import struct

    machine = platform.machine()
    if machine not in _SYSCALLS:
        return [f"no seccomp filter for {machine}: file locks stay shared"]
    arch, numbers, fcntl = _SYSCALLS[machine]
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    code: list[tuple[int, int, int, int]] = [(ld, 0, 0, 4), (jeq, 1, 0, arch),  # another
                                             (ret, 0, 0, deny), (ld, 0, 0, 0)]  # ABI: none
    if machine == "x86_64":
        code += [(jge, 0, 1, 0x40000000), (ret, 0, 0, deny)]
    for number in numbers.values():
        code += [(jeq, 0, 1, number), (ret, 0, 0, deny)]
    code += [(jeq, 1, 0, fcntl), (ret, 0, 0, allow), (ld, 0, 0, 24)]  # fcntl's command
    for command in _LOCK_COMMANDS:
        code += [(jeq, 0, 1, command), (ret, 0, 0, deny)]
    code += [(ret, 0, 0, allow)]
    program = b"".join(struct.pack("HBBI", *row) for row in code)
    buffer = ctypes.create_string_buffer(program)

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Fprog(len(code), ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.prctl(
            PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return [f"seccomp: {os.strerror(ctypes.get_errno())}"]
    return []


def _empty_folders(libc: ctypes.CDLL, private: Iterable[str | Path]) -> list[str]:
    """An empty tmpfs over each folder of ``private``, read-only once the package's and
    Python's own folders inside it are shown again on top."""
    problems = []
    needed = [Path(__file__).resolve().parents[1], Path(sys.prefix).resolve(),
              Path(sys.base_prefix).resolve(), Path(os.__file__).resolve().parent]
    for folder in dict.fromkeys(Path(p).resolve() for p in private):
        if not folder.is_dir() or any(n == folder or n in folder.parents for n in needed):
            continue
        inside = [n for n in needed if folder in n.parents]
        fds = [os.open(n, os.O_PATH | os.O_DIRECTORY) for n in inside]
        try:
            if libc.mount(b"tmpfs", str(folder).encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                          b"size=1m,mode=0755") != 0:
                problems.append(f"tmpfs over {folder}: {os.strerror(ctypes.get_errno())}")
                continue
            for n, fd in zip(inside, fds):
                n.mkdir(parents=True, exist_ok=True)
                if libc.mount(f"/proc/self/fd/{fd}".encode(), str(n).encode(), None,
                              MS_BIND | MS_REC, None) != 0:
                    problems.append(f"{n} shown again: {os.strerror(ctypes.get_errno())}")
            if libc.mount(None, str(folder).encode(), None,
                          MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None) != 0:
                problems.append(f"{folder} read-only: {os.strerror(ctypes.get_errno())}")
        finally:
            for fd in fds:
                os.close(fd)
    return problems


_LOCKED = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
           "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}


def _all_read_only(libc: ctypes.CDLL) -> list[str]:
    """Every mount that is writable (``/dev``, a tmpfs the sandbox made, the learner's
    folder...) made read-only, keeping the flags a user namespace may not drop; ``/proc``
    and ``/sys`` aside (``_first_of_new_pids`` mounts a new ``/proc``)."""
    problems = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError as exc:
        return [f"/proc/self/mountinfo: {exc}"]
    for line in lines:
        fields = line.split()
        point, options = fields[4].replace("\\040", " "), fields[5].split(",")
        kind = fields[fields.index("-") + 1] if "-" in fields else ""
        if "rw" not in options or kind in ("proc", "sysfs") or point.startswith(("/proc/",
                                                                                  "/sys/")):
            continue
        if kind == "devpts":  # a new pseudo-terminal would be a channel: none at all
            if libc.mount(b"tmpfs", point.encode(), b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV,
                          b"size=4k") != 0 and ctypes.get_errno() != errno.ENOENT:
                problems.append(f"{point} hidden: {os.strerror(ctypes.get_errno())}")
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for name, flag in _LOCKED.items():
            if name in options:
                flags |= flag
        if libc.mount(None, point.encode(), None, flags, None) != 0:
            if ctypes.get_errno() != errno.ENOENT:  # else under a tmpfs mounted above
                problems.append(f"{point} read-only: {os.strerror(ctypes.get_errno())}")
    return problems


def _first_of_new_pids(libc: ctypes.CDLL, problems: list[str]) -> None:
    """Fork into the PID namespace made by ``unshare``: the child, its first process, sees
    no other process (a new ``/proc``) and can signal none; this process waits for it and
    ends with it."""
    pid = os.fork()
    if pid:
        with contextlib.suppress(BaseException):
            os.waitpid(pid, 0)
        os._exit(0)
    with contextlib.suppress(Exception):
        libc.prctl(PR_SET_PDEATHSIG, 9)  # SIGKILL when the waiting process is killed
    if libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) == 0:
        return
    # A sandbox's /proc with parts mounted over (bwrap's) cannot be mounted again: an empty
    # one then, so that no other process shows (their names, states and times neither).
    if libc.mount(b"tmpfs", b"/proc", b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  b"size=4k") != 0:
        problems.append(f"/proc hidden: {os.strerror(ctypes.get_errno())}")


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
