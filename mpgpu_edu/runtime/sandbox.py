"""A namespace sandbox for code nobody vouches for (a class's submissions): bubblewrap.

``Sandbox(private, hide)`` is a fork server (``ForkServer``) started inside ``bwrap`` with

* the whole file system read-only (``--ro-bind / /``), except ``private`` (the learner's
  own temporary folder: a copy of their files and the checks' scratch folders);
* a private, empty ``/tmp`` and ``/dev/shm``, a new ``/proc``, no network
  (``--unshare-net``), its own PID, IPC and UTS namespaces, all capabilities dropped;
* every folder in ``hide`` replaced by an empty one (the course's ``solutions/``, the other
  learners' submissions, the grader's output), and the package's source folder shown
  read-only, alone of its repository;
* a process-count limit from a ``pids`` cgroup where the grader may make one (Linux,
  cgroup v1 or v2, as root), else ``RLIMIT_NPROC`` (which root ignores);
* ``--die-with-parent``: when the grader ends, the sandbox's first process dies and the
  kernel kills every process of the PID namespace with it, ``setsid`` daemons included.

``problem()`` says why a sandbox cannot be made here (``None`` when it can).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

from mpgpu_edu.runtime.forkserver import ForkServer

CGROUP_ROOTS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")
INSTALL = "install bubblewrap (Debian/Ubuntu: apt-get install -y bubblewrap)"


def problem() -> str | None:
    """Why no sandbox can be made on this machine, or ``None``."""
    if sys.platform != "linux":
        return "namespace sandboxes need Linux"
    if shutil.which("bwrap") is None:
        return f"bubblewrap (bwrap) is not installed: {INSTALL}"
    try:
        done = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-pid",
                               "--unshare-net", "--", "true"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap does not run ({exc})"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return f"bubblewrap cannot make namespaces here ({last}): enable user namespaces"
    return None


def package_root() -> Path:
    return Path(__file__).resolve().parents[1]


def bwrap_command(private: str, hide: Sequence[str | Path]) -> list[str]:
    command = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid",
               "--unshare-ipc", "--unshare-uts", "--unshare-net", "--unshare-cgroup-try",
               "--cap-drop", "ALL", "--ro-bind", "/", "/", "--dev", "/dev",
               "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/dev/shm"]
    package = package_root()
    repo = package.parent
    shown = [package]
    if (repo / "solutions").exists() or (repo / ".git").exists():  # a source checkout
        command += ["--tmpfs", str(repo)]
        shown += [Path(p) for p in (sys.prefix, sys.base_prefix)
                  if Path(p).resolve().is_relative_to(repo)]
    for folder in hide:
        if Path(folder).exists() and not Path(folder).resolve().is_relative_to(repo):
            command += ["--tmpfs", str(Path(folder).resolve())]
    for folder in shown:
        command += ["--ro-bind", str(folder), str(folder)]
    command += ["--bind", private, private, "--chdir", private, "--"]
    return command


class PidsCgroup:
    """A ``pids`` cgroup holding at most ``limit`` processes (if one can be made here)."""

    def __init__(self, limit: int) -> None:
        self.path: str | None = None
        for root in CGROUP_ROOTS:
            self.remove_stale(root)
            path = os.path.join(root, f"mpgpu-edu-{uuid.uuid4().hex[:12]}")
            try:
                os.mkdir(path)
            except OSError:
                continue
            try:
                with open(os.path.join(path, "pids.max"), "w") as handle:
                    handle.write(str(limit))
            except OSError:
                os.rmdir(path)
                continue
            self.path = path
            break

    @staticmethod
    def remove_stale(root: str) -> None:
        """Remove the empty cgroups of graders that were killed (a cgroup with a process in
        it cannot be removed, so one in use stays)."""
        with contextlib.suppress(OSError):
            for name in os.listdir(root):
                if name.startswith("mpgpu-edu-"):
                    with contextlib.suppress(OSError):
                        os.rmdir(os.path.join(root, name))

    def enter(self) -> None:
        """In the child before ``exec`` (``Popen``'s ``preexec_fn``): join the cgroup."""
        if self.path is not None:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as handle:
                handle.write(str(os.getpid()))

    def remove(self) -> None:
        if self.path is None:
            return
        for _ in range(50):
            try:
                with open(os.path.join(self.path, "cgroup.procs")) as handle:
                    pids = [int(p) for p in handle.read().split()]
            except OSError:
                break
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            import time

            time.sleep(0.05)
        with contextlib.suppress(OSError):
            os.rmdir(self.path)
        self.path = None


class Sandbox(ForkServer):
    """A fork server inside bubblewrap (see the module); ``stop()`` ends it all. Start it
    from a thread that lives as long as it is needed: the kernel ends the sandbox when the
    thread that started it ends (``--die-with-parent`` is tied to that thread)."""

    def __init__(self, preload: Sequence[str], private: str, hide: Sequence[str | Path] = (),
                 max_processes: int = 256, name: str = "sandbox") -> None:
        self.cgroup = PidsCgroup(max_processes)
        super().__init__(preload, bwrap_command(private, hide), name=name,
                         preexec=self.cgroup.enter)

    @property
    def limits_processes(self) -> bool:
        return self.cgroup.path is not None

    def stop(self) -> None:
        super().stop()
        self.cgroup.remove()
