"""Check a function defined in a notebook: in this process, each case in a thread.

A child process cannot import a function that lives in the notebook's ``__main__``, so
``check("1.3", fn)`` runs such a function here instead. A case that overruns its time is
reported as a timeout but cannot be stopped: its thread keeps running in the background.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from mpgpu_edu.grading.registry import get
from mpgpu_edu.grading.report import CaseResult, ExerciseResult, exercise_status
from mpgpu_edu.grading.runner import Limits

IN_KERNEL = ("this kernel, in a thread: a function defined in a notebook cannot be sent to "
             "another process, so a case that hangs keeps running in the background until "
             "the kernel restarts")


def run_in_thread(exercise_id: str, fn: Callable[..., Any], *, limits: Limits = Limits(),
                  figures: bool = False) -> ExerciseResult:
    """Check ``fn`` in this process, each case in a daemon thread with a timeout. For
    functions that cannot be imported by a child process (defined in ``__main__``)."""
    from mpgpu_edu.grading._outcome import classify, figure_png
    from mpgpu_edu.grading.checks import cases_for

    exercise = get(exercise_id)
    code = getattr(fn, "__code__", None)
    file = code.co_filename if code is not None else ""
    started = time.monotonic()
    end = started + limits.timeout_s
    cases, figure = [], ""
    for case in cases_for(exercise.id):
        left = end - time.monotonic()
        if left <= 0:
            cases.append(CaseResult(case.name, case.points, "timeout", "not run: the "
                                    f"exercise's {limits.timeout_s:g} s were used up",
                                    case.hidden))
            continue
        soft = min(case.timeout_s, limits.case_timeout_s or case.timeout_s, left)
        box: dict[str, Any] = {}
        thread = threading.Thread(target=_run_into, args=(case, fn, box, exercise.id),
                                  daemon=True, name=f"check-{exercise.id}")
        case_start = time.monotonic()
        thread.start()
        thread.join(soft)
        if thread.is_alive():
            status, message = "timeout", (f"still running after {soft:.1f} s; it goes on in "
                                          "the background of this kernel (restart the kernel "
                                          "if the CPU stays busy)")
            # the package's functions it blocked work again for the rest of the notebook
            from mpgpu_edu.grading.checks._blocking import release_thread

            release_thread(thread.ident or 0)
        elif "error" in box:
            status, message = classify(box["error"], soft, limits.memory_bytes, file,
                                       "your notebook")
        else:
            status, message = "passed", ""
        evidence = box.get("evidence")
        cases.append(CaseResult(case.name, case.points, status, message, case.hidden, "",
                                round(time.monotonic() - case_start, 3),
                                getattr(evidence, "text", "") or ""))
        if figures and not figure and getattr(evidence, "traces", None):
            figure = figure_png(evidence)
    return ExerciseResult(exercise.id, exercise.title, exercise_status(cases), exercise.points,
                          cases, exercise.hint, "your notebook", getattr(fn, "__name__", ""),
                          exercise.notebook, "", figure, IN_KERNEL,
                          time.monotonic() - started)


def _run_into(case: Any, fn: Callable[..., Any], box: dict[str, Any], exercise_id: str) -> None:
    """The case's two halves, as a child runs them: *compute* with the package's own
    implementation of the exercise out of reach (``REFERENCES``), then *judge*."""
    from mpgpu_edu.grading.compute import references_blocked

    try:
        box["evidence"] = case.run(fn, lambda: references_blocked(exercise_id))
    except BaseException as exc:  # noqa: BLE001 - reported by run_in_thread
        box["error"] = exc
        box["evidence"] = getattr(exc, "evidence", None)
