"""Errors a multi-rank program can end with, each naming the ranks involved and the fix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Pending:
    """What one rank's program (or, with ``stream``, its comm stream) was blocked in when a
    launch stopped: a ``"send"`` to or ``"recv"`` from rank ``peer`` (``tag``), or ``"other"``
    (a wait for a comm-stream job, a receive from any of several ranks, a barrier). ``text``
    says it in words, as the error's message does."""

    rank: int
    op: str
    text: str
    peer: int | None = None
    tag: int | None = None
    stream: bool = False

    def to_line(self) -> str:
        """One line for a board slot that another process reads back with ``from_line``."""
        if self.op in ("send", "recv"):
            return f"{self.op} {self.peer} {self.tag}|{self.text}"
        return self.text

    @classmethod
    def from_line(cls, rank: int, line: str, stream: bool = False) -> Pending:
        head, bar, text = line.partition("|")
        fields = head.split(" ")
        if bar and len(fields) == 3 and fields[0] in ("send", "recv"):
            return cls(rank, fields[0], text, int(fields[1]), int(fields[2]), stream)
        return cls(rank, "other", line, stream=stream)


class CommError(RuntimeError):
    """Base class of the communication layer's errors."""


class _Stopped:
    """Mixin: ``pending`` (one ``Pending`` per blocked rank or comm stream) and ``finished``
    (the ranks whose program had returned), kept through pickling."""

    pending: tuple[Pending, ...]
    finished: tuple[int, ...]

    def _keep(self, pending: Sequence[Pending], finished: Sequence[int]) -> None:
        self.pending, self.finished = tuple(pending), tuple(finished)

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (type(self), (str(self), self.pending, self.finished))


class DeadlockError(_Stopped, CommError):
    """Every live rank is blocked and none can make progress; ``pending`` says in what."""

    def __init__(self, message: str, pending: Sequence[Pending] = (),
                 finished: Sequence[int] = ()) -> None:
        super().__init__(message)
        self._keep(pending, finished)


class MessageMismatchError(CommError):
    """A send and its matching receive disagree on shape, dtype or size."""


class UnmatchedMessageError(CommError):
    """The program ended with a message that was sent but never received (or the reverse)."""


class LaunchTimeoutError(_Stopped, CommError, TimeoutError):
    """The ranks did not finish within the launcher's timeout; ``pending`` says what each
    blocked rank waited in."""

    def __init__(self, message: str, pending: Sequence[Pending] = (),
                 finished: Sequence[int] = ()) -> None:
        super().__init__(message)
        self._keep(pending, finished)


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


def rank_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as a rank's error shows it: from the first frame outside the
    launcher (``comm``, ``runtime``) to the last one outside torch's internals and the
    simulator's FLOP counter (an op that fails under the counter otherwise ends in five
    frames of torch's dispatch machinery, ``_dynamo`` among them), with the number left out."""
    import os
    import traceback

    import torch

    remote = getattr(exc, "remote_frames", None)  # raised in a rank process (comm.apart)
    if remote is not None:
        kept = [f for f in remote if "mpgpu_edu" + os.sep + "comm" + os.sep not in f.filename]
        return "".join(traceback.format_list(kept or remote))
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    launcher = (os.path.join(package, "comm") + os.sep, os.path.join(package, "runtime") + os.sep)
    inner = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
             os.path.join(package, "comm", "flops.py"))
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    start = 0
    while start < len(frames) - 1 and frames[start].tb_frame.f_code.co_filename.startswith(
            launcher):
        start += 1
    end = len(frames)
    while end - 1 > start and frames[end - 1].tb_frame.f_code.co_filename.startswith(inner):
        end -= 1
    shown = traceback.format_list(traceback.extract_tb(frames[start], limit=end - start)) \
        if frames else []
    hidden = len(frames) - end
    note = (f"  [... {hidden} frame(s) inside torch and the simulator's FLOP counter not "
            "shown]\n") if hidden else ""
    return ("Traceback (most recent call last):\n" + "".join(shown) + note
            + "".join(traceback.format_exception_only(type(exc), exc)))
