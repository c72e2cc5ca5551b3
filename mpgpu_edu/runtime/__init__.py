"""The runtime: every process this package starts.

``ForkServer`` (``forkserver``, ``server``) starts children from a fresh process that imported
torch once: each child leads its own process group, dies with the server, and the server dies
with its owner; what a child leaves behind (double forks, ``setsid`` daemons) is found and
killed. ``WorkerGroup`` (``pool``) runs jobs on a group of such children (``comm``'s ranks on
gloo and nccl); ``SharedBoard`` (``board``) is memory they share with the owner; ``sandbox``
wraps a server in a namespace sandbox for grading a class. ``comm`` and ``grading`` both use
this package; it imports neither.

``local_server()`` is this process's own (unsandboxed) server, shared by ``comm``'s worker
pool and a learner's ``check``: one torch import serves both.
"""

from __future__ import annotations

import atexit
import threading

from mpgpu_edu.runtime.errors import RuntimeStartError, SandboxUnavailable
from mpgpu_edu.runtime.forkserver import Child, ForkServer

__all__ = ["LATER", "PRELOAD", "Child", "ForkServer", "RuntimeStartError", "SandboxUnavailable",
           "local_server", "warm_up"]

# What a server imports: torch, the entry points of comm's workers and of a check's child, and
# the package's layers that programs and checks use (a check's child imports its own lesson's
# checks after the fork: no server holds a check). The server answers its first request once
# the modules before LATER are in; it imports the rest while it waits for requests, so that a
# learner's first check does not wait for torch._dynamo (seconds) and later ones find it all.
LATER = "--later"
PRELOAD = ("torch", "mpgpu_edu.comm.worker", "mpgpu_edu.grading.compute", "mpgpu_edu.collectives",
           LATER, "matplotlib.figure", "mpgpu_edu.viz", "torch._dynamo", "mpgpu_edu.dp",
           "mpgpu_edu.pipeline", "mpgpu_edu.memory", "mpgpu_edu.hybrid", "mpgpu_edu.lessons")

_local: list[ForkServer] = []
_local_lock = threading.Lock()


def local_server() -> ForkServer:
    """This process's fork server (made on first use; started by its first ``spawn``)."""
    with _local_lock:
        if not _local:
            server = ForkServer(PRELOAD, name="mpgpu-edu")
            atexit.register(server.stop)
            _local.append(server)
        return _local[0]


def warm_up() -> None:
    """Start the local server in the background, so that a first check or launch does not
    wait for torch to be imported (a call that comes sooner waits on the server's lock)."""
    threading.Thread(target=_start_quietly, daemon=True, name="mpgpu-edu-warm-up").start()


def _start_quietly() -> None:
    try:
        local_server().start()
    except RuntimeStartError:
        pass  # the first real use reports it
