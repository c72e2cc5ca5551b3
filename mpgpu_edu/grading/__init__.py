"""Grading: the exercises, their checks, and ``check`` for notebooks.

    import mpgpu_edu as mp
    mp.check("1.3")                    # checks ring_all_reduce in exercises/ex01_communication.py
    mp.check("1.3", my_ring)           # checks a function defined in the notebook
    mp.progress()                      # per lesson: exercises done, points

``check`` never raises unless ``strict=True`` (for CI): whatever the code under check does,
it returns an ``ExerciseResult`` with a status (passed, failed, not_implemented, error,
timeout), the points of every case, the hint, and in JupyterLab a small figure where one
helps. The code runs in a separate process with a timeout (``runner``); a function defined
in the notebook itself cannot be sent there, so it runs in a thread of the kernel instead.

Modules: ``registry`` (the exercises), ``checks`` (their cases), ``runner`` (isolated runs),
``in_kernel`` (a notebook's own function), ``report`` (text and HTML), ``generate``
(exercises from solutions), ``progress`` (the course folder, progress, reset), ``grade``
(a whole class).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mpgpu_edu.grading.progress import (IMPL_ENV, CourseNotFound, Progress, find_root,
                                        resolve_impl)
from mpgpu_edu.grading.progress import progress as _progress
from mpgpu_edu.grading.registry import EXERCISES, get
from mpgpu_edu.grading.hints import hint
from mpgpu_edu.grading.predict import predict, reveal
from mpgpu_edu.grading.report import ExerciseResult, Report
from mpgpu_edu.grading.yours import yours

__all__ = ["EXERCISES", "ExerciseFailed", "ExerciseResult", "Report", "check", "hint",
           "predict", "progress", "resolve_impl", "reveal", "yours"]


class ExerciseFailed(AssertionError):
    """Raised by ``check(..., strict=True)`` when the exercise does not pass."""


STRICT_ENV = "MPGPU_EDU_STRICT"


def progress(root: str | Path | None = None) -> Progress:
    """The learner's progress (see ``grading.progress.progress``). In a notebook it also
    starts the checker in the background, so the lesson's first ``check`` answers at once."""
    if _in_notebook():
        from mpgpu_edu.grading import runner

        runner.warm_up()
    return _progress(root)


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def check(exercise: str, fn: Callable[..., Any] | None = None, *,
          impl: str | Path | None = None, timeout: float = 60.0, strict: bool | None = None,
          figures: bool = True) -> ExerciseResult:
    """Check exercise ``exercise`` (e.g. ``"1.3"``) and return its result.

    Without ``fn`` the exercise's function is taken from the learner's
    ``exercises/<module>.py`` (``impl`` may name ``"solutions"`` or another folder instead)
    and the result is recorded in the course's progress. With ``fn``, that function is
    checked. ``timeout`` bounds all the exercise's cases together (each case has its own
    limit too). ``strict=True`` raises ``ExerciseFailed`` unless it passed (and ValueError
    for an unknown id).

    The environment can set the defaults for a whole run (CI runs every notebook twice):
    ``MPGPU_EDU_IMPL=solutions`` checks the solutions instead of ``exercises/``, and
    ``MPGPU_EDU_STRICT=1`` makes every check strict.
    """
    if impl is None and fn is None and os.environ.get(IMPL_ENV):
        impl = os.environ[IMPL_ENV]
    if strict is None:
        strict = os.environ.get(STRICT_ENV, "") not in ("", "0", "false", "no")
    try:
        result = _check(exercise, fn, impl, timeout, figures)
    except Exception as exc:  # noqa: BLE001 - check() reports, it does not raise
        if strict and isinstance(exc, (ValueError, CourseNotFound)):
            raise
        result = _error(exercise, f"{type(exc).__name__}: {exc}")
    if strict and not result.passed:
        raise ExerciseFailed(str(result))
    return result


def _check(exercise_id: str, fn: Callable[..., Any] | None, impl: str | Path | None,
           timeout: float, figures: bool) -> ExerciseResult:
    from mpgpu_edu.grading import runner

    try:
        exercise = get(exercise_id)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None
    limits = runner.Limits(timeout_s=timeout)
    if fn is not None:
        return _check_function(exercise.id, fn, limits, figures)
    root = find_root() if impl is None or str(impl) in ("exercises", "solutions") else None
    folder = resolve_impl(impl, root)
    results = runner.run_many(folder, [exercise.id], limits=limits, figures=figures,
                              display_dir=_shown(folder, root))
    from mpgpu_edu.grading.yours import remember

    sha = remember(folder / exercise.filename, exercise.id, results[0].passed)
    if root is not None and folder == root / "exercises":
        from mpgpu_edu.grading.progress import record

        record(root, results, {exercise.id: sha})
    return results[0]


def _check_function(exercise_id: str, fn: Callable[..., Any], limits: Any,
                    figures: bool) -> ExerciseResult:
    from mpgpu_edu.grading import in_kernel, runner

    file = _importable_file(fn)
    if file is None:
        return in_kernel.run_in_thread(exercise_id, fn, limits=limits, figures=figures)
    return runner.run_exercise(exercise_id, file, fn.__qualname__, limits=limits,
                               figures=figures)


def _importable_file(fn: Callable[..., Any]) -> Path | None:
    """The file a child process can import ``fn`` from, or None (notebook, lambda, closure)."""
    qualname = getattr(fn, "__qualname__", "")
    if getattr(fn, "__module__", "__main__") == "__main__" or "<" in qualname:
        return None
    try:
        file = inspect.getsourcefile(fn)
    except TypeError:
        return None
    return Path(file) if file and Path(file).is_file() and file.endswith(".py") else None


def _shown(folder: Path, root: Path | None) -> str:
    if root is not None:
        try:
            return str(folder.relative_to(root))
        except ValueError:
            pass
    return str(folder)


def _error(exercise_id: str, message: str) -> ExerciseResult:
    known = EXERCISES.get(str(exercise_id).strip())
    if known is None:
        return ExerciseResult(str(exercise_id), "unknown exercise", "error", 0, [], "", "", "",
                              "", message)
    return ExerciseResult(known.id, known.title, "error", known.points, [], known.hint,
                          known.filename, known.function, known.notebook, message)
