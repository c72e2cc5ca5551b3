"""The errors of the torch.distributed backend: they say which rank and what it waited for."""

from __future__ import annotations

from mpgpu_edu.comm.errors import CommError, RankError


class NotPicklableError(ValueError):
    """The function (or an argument) cannot be sent to worker processes."""


class MessageTimeoutError(CommError, TimeoutError):
    """A rank waited for a message longer than the process group's timeout (a deadlock, or
    a peer that stopped); ``pending`` says what it waited for."""

    def __init__(self, rank: int, pending: str, detail: str) -> None:
        self.rank, self.pending = rank, pending
        super().__init__(f"rank {rank} gave up waiting for: {pending} (the process group's "
                         f"timeout passed: {detail.strip().splitlines()[-1][:200]}). A rank "
                         "waiting on a message nobody sends? Else raise --timeout.")


class PeerLostError(CommError):
    """A peer's process ended while this rank waited for it: the peer's own failure is the
    root cause (``pending`` says what this rank waited for)."""

    def __init__(self, rank: int, pending: str, detail: str) -> None:
        self.rank, self.pending = rank, pending
        super().__init__(f"rank {rank} lost its peer while waiting for: {pending} (the peer's "
                         "process ended; its own error is the cause)")


class WorkerDiedError(RankError):
    """A worker process exited in the middle of a job (``os._exit``, a crash, a kill)."""

    def __init__(self, rank: int, exitcode: int | None) -> None:
        self.rank, self.original, self.rank_traceback = rank, None, ""
        self.exitcode = exitcode
        how = (f"killed by signal {-exitcode}" if exitcode is not None and exitcode < 0
               else f"exit code {exitcode}")
        CommError.__init__(self, f"rank {rank}'s worker process died during the job ({how}); "
                           "every other rank was stopped. Something ended the process "
                           "without a Python exception: os._exit, sys.exit in a thread, a "
                           "crash inside C++ (segfault) or running out of memory.")
