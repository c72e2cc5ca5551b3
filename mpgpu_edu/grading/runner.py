"""Run an exercise's checks: the learner's code computes in a child process, the grader judges.

The learner's code may loop forever, crash the interpreter, call ``sys.exit`` or
``os._exit``, print without end, allocate too much, or lie. None of that may stop the grader
or change a verdict, so for each exercise

* a child process (``compute``) forked by the runtime's fork server imports the learner's
  file and runs the *compute* half of each case, with a soft timeout per case, a memory
  limit, a file-size limit and capped output, and sends back plain data (``wire``);
* for class grading (``judge_here``) this process judges that data with its own copy of
  the checks (``session``): names, points and verdicts never come from the child. A
  learner's own ``check`` lets the child judge too (honest results for honest code, and the
  kernel needs neither torch nor the checks, so the first check is fast);
* a case that overruns by ``GRACE_S`` or a child that dies ends that child (and everything
  it started: the runtime kills its process group and what it left behind); a fresh child
  goes on from the next case, within the exercise's time budget;
* the learner's files are copied to a temporary folder and imported from there (no bytecode
  written), and the child works in a scratch folder, so checking never changes them.

``server`` is the fork server to use: the process's own (``runtime.local_server()``, for a
learner's ``check``) or a sandboxed one (``grading.sandbox``, for grading a class).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpgpu_edu.grading.registry import Exercise, get
from mpgpu_edu.grading.report import ExerciseResult, exercise_status
from mpgpu_edu.grading.session import State, follow

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MEMORY_BYTES = 4 * 2**30
OUTPUT_CHARS = 4000
CHILD = "mpgpu_edu.grading.compute:main"


@dataclass(frozen=True)
class Limits:
    """How long and how big: ``timeout_s`` for one exercise (all its cases together),
    ``case_timeout_s`` caps every case (default: each case's own, 20 s for most),
    ``memory_bytes`` on top of the process's size at start, ``output_chars`` kept per case,
    ``max_processes`` the processes a check may have (None: no limit of its own)."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    case_timeout_s: float | None = None
    memory_bytes: int = DEFAULT_MEMORY_BYTES
    output_chars: int = OUTPUT_CHARS
    max_processes: int | None = None


def warm_up() -> None:
    """Start the local fork server in the background, so that a learner's first check does
    not wait for torch to be imported. A notebook's first ``mp.progress()`` calls this (a
    check that comes sooner waits for the server)."""
    from mpgpu_edu.runtime import warm_up as start

    start()


def run_exercise(exercise_id: str, file: Path, function: str | None = None, *,
                 limits: Limits = Limits(), figures: bool = False,
                 display_file: str | None = None, server: Any = None,
                 workdir: str | None = None, judge_here: bool = False) -> ExerciseResult:
    """Check ``function`` (default: the exercise's own) of the module ``file`` in child
    processes of ``server`` that work in a scratch folder (``workdir``, or a new one).
    ``file`` is imported where it is, without writing bytecode (``run_many`` imports copies,
    so that not even hostile code can change the learner's files). ``judge_here``: judge
    in this process (class grading); else the child judges too (a learner's own check:
    this process then needs neither torch nor the checks)."""
    from mpgpu_edu.runtime import local_server

    server = server or local_server()
    exercise = get(exercise_id)
    if not server.prefix:  # a sandbox dies with the thread that starts it: not in the back
        threading.Thread(target=_start, args=(server,), daemon=True).start()
    if judge_here:  # class grading: the key of the ranks' inputs, drawn once, kept here
        from mpgpu_edu.grading.checks._support import grading_secret

        grading_secret()
    state = State(exercise, figures, trust_child=not judge_here)  # judging here: imports
    # the checks while the server starts
    started = time.monotonic()
    scratch = tempfile.mkdtemp(prefix="mpgpu-work-", dir=workdir)
    request = {"exercise": exercise.id, "file": str(file),
               "function": function or exercise.function, "workdir": scratch,
               "case_timeout_s": limits.case_timeout_s, "memory_bytes": limits.memory_bytes,
               "output_chars": limits.output_chars, "max_processes": limits.max_processes,
               "display_file": display_file or str(file), "judge": not judge_here,
               "figures": figures}
    try:
        _run_sessions(state, request, limits, server)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return _result(state, request, time.monotonic() - started)


def _start(server: Any) -> None:
    try:
        server.start()
    except Exception:  # noqa: BLE001 - the first spawn reports it
        pass


def _run_sessions(state: State, request: dict, limits: Limits, server: Any) -> None:
    """Child after child, each from the next case, until every case has a result."""
    while not state.finished():
        if state.budget_end is not None and time.monotonic() >= state.budget_end:
            state.record_rest("timeout", f"not run: the exercise's {limits.timeout_s:g} s "
                                         "were used up by the cases before")
            break
        before = state.next_index
        _session(state, request, limits, server)
        if state.next_index == before and not state.finished():
            state.message = state.message or "the check process stopped before running a case"
            state.record_rest("error", state.message)
            break


def _session(state: State, request: dict, limits: Limits, server: Any) -> None:
    """One child's life: start it at the next case, follow it, and stop it (with whatever
    it started) when it dies, overruns a case or finishes."""
    remaining = (limits.timeout_s if state.budget_end is None
                 else state.budget_end - time.monotonic())
    child_request = dict(request, start=state.next_index, budget_s=max(remaining, 0.1))
    child = server.spawn(CHILD, child_request)  # the first waits for the server: not counted
    if state.budget_end is None:
        state.budget_end = time.monotonic() + limits.timeout_s
    try:
        follow(state, child, limits)
    finally:
        child.kill()  # also when it returned normally: nothing it started outlives it
        child.join(5.0)
        child.close()


def _result(state: State, request: dict, seconds: float) -> ExerciseResult:
    e = state.exercise
    cases = [state.results[i] for i in sorted(state.results)]
    status = exercise_status(cases) if cases else "error"
    return ExerciseResult(e.id, e.title, status, e.points, cases, e.hint,
                          request["display_file"], request["function"], e.notebook,
                          state.message, state.figure, "a separate process", seconds)


# ---- several exercises from one folder ----------------------------------------------------

def copy_impl(impl_dir: Path, into: str | None = None) -> Path:
    """A private copy of the ``.py`` files of ``impl_dir`` (a temporary folder, under
    ``into`` if given): the code under check is imported from there, never from the
    learner's own files. Files that are symbolic links are not copied (a submission's link
    could point anywhere, e.g. at ``solutions/``)."""
    target = Path(tempfile.mkdtemp(prefix="mpgpu-check-", dir=into))
    for path in sorted(Path(impl_dir).glob("*.py")):
        if path.is_file() and not path.is_symlink():
            shutil.copyfile(path, target / path.name)
    return target


def run_many(impl_dir: Path, ids: list[str], *, limits: Limits = Limits(),
             figures: bool = False, display_dir: str | None = None,
             on_result: Callable[[ExerciseResult], None] | None = None,
             server: Any = None, workdir: str | None = None,
             judge_here: bool = False) -> list[ExerciseResult]:
    """Check exercises ``ids`` against the modules in ``impl_dir`` (an ``exercises/`` or
    ``solutions/`` folder), each in isolation, in order."""
    copy = copy_impl(impl_dir, workdir)
    shown = display_dir if display_dir is not None else str(impl_dir)
    results = []
    try:
        for exercise_id in ids:
            exercise = get(exercise_id)
            file = copy / exercise.filename
            display = f"{shown.rstrip('/')}/{exercise.filename}"
            if (Path(impl_dir) / exercise.filename).is_symlink():
                result = missing_file(exercise, display, "is a symbolic link, not a file of "
                                      "your own: replace it with the file itself")
            elif not file.is_file():
                result = missing_file(exercise, display)
            else:
                result = run_exercise(exercise.id, file, limits=limits, figures=figures,
                                      display_file=display, server=server, workdir=workdir,
                                      judge_here=judge_here)
            results.append(result)
            if on_result is not None:
                on_result(result)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    return results


def missing_file(exercise: Exercise, display: str, why: str = "does not exist"
                 ) -> ExerciseResult:
    return ExerciseResult(exercise.id, exercise.title, "error", exercise.points, [],
                          exercise.hint, display, exercise.function, exercise.notebook,
                          f"{display} {why}")
