"""The learner's code drives the lesson: ``mp.yours`` picks whose function a demo runs.

    ring = mp.yours("1.3", reference=all_reduce_ring, what="ring")
    result = mp.launch(lambda comm: ring(comm, tensor), cluster)
    mp.show_timeline(result.trace, title=ring.label)   # "your ring" or
                                                       # "reference ring; yours: not yet"

A learner's function is used only when its check passed on the function *as it is now*:
``check`` remembers the SHA-256 of the function's source it judged (in this process, and for
``exercises/`` in ``.mpgpu/progress.json``), and ``yours`` hashes the source again, so an
edit after the check (or a stale progress file) falls back to the reference until the
next check. The folder is the one ``check`` uses: ``exercises/``, or ``$MPGPU_EDU_IMPL``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpgpu_edu.grading.generate import source_sha
from mpgpu_edu.grading.progress import IMPL_ENV
from mpgpu_edu.grading.registry import Exercise, get


# (resolved file, exercise id) -> SHA-256 of the function's source that passed its check in
# this process. Written only by ``remember``; a stale entry can never match a changed file.
_PASSED: dict[tuple[str, str], str] = {}


def remember(file: Path, exercise_id: str, passed: bool) -> str:
    """Called by ``check``: note whether the function now in ``file`` passed. Returns its
    source's SHA-256 (for the progress record)."""
    exercise = get(exercise_id)
    sha = source_sha(file, exercise.function)
    key = (str(file.resolve()), exercise.id)
    if passed and sha:
        _PASSED[key] = sha
    else:
        _PASSED.pop(key, None)
    return sha


@dataclass(frozen=True)
class Chosen:
    """The function a demo runs: the learner's (``is_yours``) or the package's reference.
    Call it like the function itself; ``label`` says whose it is, for figure titles, and
    ``note`` says it in full (why the reference runs, and how to use yours)."""

    fn: Callable[..., Any]
    exercise: Exercise
    is_yours: bool
    what: str
    reason: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def label(self) -> str:
        """Short, for a figure's title: "your ring" or "reference ring (yours: not yet)"."""
        if self.is_yours:
            return f"your {self.what}"
        return f"reference {self.what} (yours: {self.reason.split(' (')[0]})"

    @property
    def note(self) -> str:
        """In full, for a printed line: why the reference runs and how to use yours."""
        if self.is_yours:
            return f"your {self.what}"
        return f"reference {self.what}; yours: {self.reason}"

    def __repr__(self) -> str:
        return f"<{self.note} (exercise {self.exercise.id})>"


def yours(exercise_id: str, reference: Callable[..., Any], *, what: str | None = None,
          impl: str | Path | None = None) -> Chosen:
    """The learner's function of exercise ``exercise_id`` if it passed its check as it is
    now, else ``reference``; either way a ``Chosen`` whose ``label`` says which."""
    exercise = get(exercise_id)
    what = what or exercise.function.replace("_", " ")
    try:
        folder = _folder(impl)
    except (FileNotFoundError, ValueError) as exc:
        return Chosen(reference, exercise, False, what, f"not found ({exc})")
    file = folder / exercise.filename
    sha = source_sha(file, exercise.function)
    if not sha:
        return Chosen(reference, exercise, False, what, f"not found in {file.name}")
    if not _passed(folder, file, exercise, sha):
        return Chosen(reference, exercise, False, what, _why_not(folder, exercise, sha))
    try:
        fn = _load(file, exercise.function)
    except Exception as exc:  # noqa: BLE001 - the demo goes on with the reference
        return Chosen(reference, exercise, False, what,
                      f"cannot import ({type(exc).__name__}: {exc})")
    return Chosen(fn, exercise, True, what, "")


def _folder(impl: str | Path | None) -> Path:
    from mpgpu_edu.grading.progress import find_root, resolve_impl

    if impl is None and os.environ.get(IMPL_ENV):
        impl = os.environ[IMPL_ENV]
    root = find_root() if impl is None or str(impl) in ("exercises", "solutions") else None
    return resolve_impl(impl, root)


def _recorded(folder: Path, exercise: Exercise) -> dict:
    """The exercise's entry in the course's progress file (empty when ``folder`` is not the
    course's ``exercises/``, whose checks alone are recorded, or when there is no course)."""
    from mpgpu_edu.grading.progress import CourseNotFound, find_root, load

    try:
        root = find_root()
    except CourseNotFound:
        return {}
    if folder.resolve() != (root / "exercises").resolve():
        return {}
    return load(root).get(exercise.id, {})


def _passed(folder: Path, file: Path, exercise: Exercise, sha: str) -> bool:
    if _PASSED.get((str(file.resolve()), exercise.id)) == sha:
        return True
    entry = _recorded(folder, exercise)
    return entry.get("status") == "passed" and entry.get("source_sha256") == sha


def _why_not(folder: Path, exercise: Exercise, sha: str) -> str:
    """Why the learner's function is not used: never passed, its last check failed, or it
    changed since it passed (a learner trying a variant after passing sees their own
    function leave the figures, and should know why)."""
    check = f'mp.check("{exercise.id}")'
    entry = _recorded(folder, exercise)
    if entry.get("status") == "passed" and entry.get("source_sha256") != sha:
        return f"changed since it passed ({check} again to use yours)"
    if entry.get("status") in ("failed", "error", "timeout"):
        return f"its last check did not pass ({check} to use yours once it does)"
    return f"not yet ({check} to use yours)"


def _load(file: Path, function: str) -> Callable[..., Any]:
    """Import ``file`` afresh (a module named after it, its folder on ``sys.path`` so that
    gloo workers can import it too) and return ``function``."""
    folder = str(file.parent.resolve())
    if folder not in sys.path:
        sys.path.append(folder)
    spec = importlib.util.spec_from_file_location(file.stem, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[file.stem] = module
    spec.loader.exec_module(module)
    return getattr(module, function)
