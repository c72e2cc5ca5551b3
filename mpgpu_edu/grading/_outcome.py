"""How a case ended: the status and the message the learner reads."""

from __future__ import annotations

import base64
import io
import re
import traceback
from typing import Any

from mpgpu_edu.comm import LaunchTimeoutError
from mpgpu_edu.grading.checks._support import LearnerError


class CaseTimeout(BaseException):
    """Raised in the main thread when a case runs past its soft timeout."""


def classify(exc: BaseException, soft: float, memory_bytes: int, file: str,
             display: str) -> tuple[str, str]:
    """(status, message) for an exception a case ended with."""
    if isinstance(exc, CaseTimeout):
        return "timeout", (f"still running after {soft:.1f} s (an endless loop? a rank waiting "
                           "for a message nobody sends?)")
    if isinstance(exc, LaunchTimeoutError):
        return "timeout", str(exc)
    if isinstance(exc, NotImplementedError):
        return "not_implemented", str(exc) or "not implemented yet"
    if isinstance(exc, AssertionError):
        return "failed", str(exc) or "a check failed"
    if isinstance(exc, SystemExit):
        return "error", (f"the code called sys.exit({exc.code!r}): return a value or raise "
                         "an exception instead")
    original = exc.original if isinstance(exc, LearnerError) else exc
    if isinstance(original, MemoryError) or "can't allocate memory" in str(original):
        gib = memory_bytes / 2**30
        detail = str(original)[:200]
        return "error", (f"ran out of memory (the limit is {gib:g} GiB above the process's "
                         f"start): {type(original).__name__}" + (f": {detail}" if detail else ""))
    head = str(exc) if isinstance(exc, LearnerError) else f"{type(exc).__name__}: {exc}"
    if isinstance(original, AttributeError) and _NO_SUCH_METHOD.search(str(original)):
        head += (" (a communicator offers point-to-point messages, send, recv, isend and "
                 "irecv, and group(ranks); it has no collectives: here you build them from "
                 "messages, and the package's are switched off while your code is checked)")
    return "error", head + learner_frames(original, file, display)


_NO_SUCH_METHOD = re.compile(r"'\w*Communicator' object has no attribute '\w+'")


def learner_frames(exc: BaseException, file: str, display: str) -> str:
    """The traceback lines that point into the learner's file, shown under its real name."""
    frames = getattr(exc, "remote_frames", None) or traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if f.filename == file]
    lines = [f'  File "{display}", line {f.lineno}, in {f.name}\n'
             f"    {f.line or ''}" for f in mine[-4:]]
    return ("\n" + "\n".join(lines)) if lines else ""


def figure_png(evidence: Any) -> str:
    """The evidence's timelines side by side, as base64 PNG ("" when they cannot be drawn)."""
    try:
        from mpgpu_edu.viz.timeline import plot_timelines_side_by_side
    except ImportError:
        return ""
    try:
        figure = plot_timelines_side_by_side(evidence.traces)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=72)
        return base64.b64encode(buffer.getvalue()).decode("ascii")
    except Exception:  # noqa: BLE001 - a figure is a bonus, never a failure
        return ""
