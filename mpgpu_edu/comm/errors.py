"""Errors a multi-rank program can end with, each naming the ranks involved and the fix."""

from __future__ import annotations


class CommError(RuntimeError):
    """Base class of the communication layer's errors."""


class DeadlockError(CommError):
    """Every live rank is blocked and none can make progress."""


class MessageMismatchError(CommError):
    """A send and its matching receive disagree on shape, dtype or size."""


class UnmatchedMessageError(CommError):
    """The program ended with a message that was sent but never received (or the reverse)."""


class LaunchTimeoutError(CommError, TimeoutError):
    """The ranks did not finish within the launcher's timeout."""


class RankError(CommError):
    """One rank raised; every rank was stopped. ``original`` is that rank's exception and
    ``rank_traceback`` its traceback as text."""

    def __init__(self, rank: int, original: BaseException | None, rank_traceback: str,
                 summary: str | None = None) -> None:
        self.rank, self.original, self.rank_traceback = rank, original, rank_traceback
        what = summary or f"{type(original).__name__}: {original}"
        super().__init__(f"rank {rank} raised {what}\n"
                         f"(every other rank was stopped)\n\n--- traceback of rank {rank} ---\n"
                         f"{rank_traceback.rstrip()}")


class Aborted(BaseException):
    """Raised inside a rank that is stopped because another rank failed. A BaseException so
    that a learner's ``except Exception`` does not swallow it."""
