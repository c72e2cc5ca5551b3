"""Children forked from the calling process itself, for work that needs the caller's memory
as it is (``comm.apart``'s rank processes: a program and its inputs that were never meant to
be pickled). ``fork_each`` starts them, each dying with its parent; ``end_all`` kills and
reaps them, however the work ended. Anything a child leaves behind is the fork server's to
reap (it is a subreaper: ``runtime.server``)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def fork_each(count: int, body: Callable[[int], None]) -> list[int]:
    """Fork ``count`` children; child ``i`` runs ``body(i)`` and then ends (``os._exit``),
    whatever ``body`` does. Returns their pids. Call ``end_all`` with them afterwards."""
    sys.stdout.flush()
    sys.stderr.flush()
    pids: list[int] = []
    try:
        for index in range(count):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child, which never returns
                try:
                    with contextlib.suppress(Exception):
                        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
                    body(index)
                finally:
                    os._exit(0)
            pids.append(pid)
    except BaseException:
        end_all(pids)
        raise
    return pids


def end_all(pids: list[int]) -> None:
    """Kill every child of ``pids`` and wait for it."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.waitpid(pid, 0)
