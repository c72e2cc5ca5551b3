"""Run an exercise's checks in a separate process, with timeouts and resource limits.

The learner's code may loop forever, crash the interpreter, call ``sys.exit`` or
``os._exit``, print without end or allocate too much. None of that may stop the grader, so
each exercise runs in a child process:

* children are forked from a server process that has already imported torch and the
  checks (``multiprocessing``'s forkserver), so a child starts in milliseconds;
* a child limits its address space (``RLIMIT_AS``: its size at start plus
  ``memory_bytes``), sends ``sys.stdout``/``sys.stderr`` to a capped buffer (kept per case)
  and the raw file descriptors 1 and 2 to /dev/null;
* every case runs under a soft timeout (``SIGALRM``); the parent kills the child's whole
  process group when a case overruns by ``GRACE_S``, or when the child dies, and starts a
  fresh child for the remaining cases; the exercise as a whole has a time budget;
* the learner's files are copied to a temporary folder and imported from there (no
  bytecode written), and the child works in a scratch folder, so checking never changes
  them.

Messages child -> parent (dicts over a pipe): ``cases`` (names, points), ``import``,
``start`` (case i, its timeout), ``result``, ``figure`` (a PNG timeline), ``done``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.spawn
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpgpu_edu.grading.registry import Exercise, get
from mpgpu_edu.grading.report import CaseResult, ExerciseResult, exercise_status

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MEMORY_BYTES = 4 * 2**30
GRACE_S = 5.0
BETWEEN_CASES_S = 30.0  # import, figure rendering: work outside a case's own timeout
OUTPUT_CHARS = 4000
PRELOAD = ["torch", "torch._dynamo", "mpgpu_edu.grading._child"]
FIGURE_PRELOAD = ["mpgpu_edu.viz.timeline"]


@dataclass(frozen=True)
class Limits:
    """How long and how big: ``timeout_s`` for one exercise (all its cases together),
    ``case_timeout_s`` caps every case (default: each case's own, 20 s for most),
    ``memory_bytes`` on top of the process's size at start, ``output_chars`` kept per case."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    case_timeout_s: float | None = None
    memory_bytes: int = DEFAULT_MEMORY_BYTES
    output_chars: int = OUTPUT_CHARS


@dataclass
class _State:
    """What the parent knows about one exercise's run so far."""

    exercise: Exercise
    cases: list[dict] = field(default_factory=list)
    results: dict[int, CaseResult] = field(default_factory=dict)
    figure: str = ""
    message: str = ""
    budget_end: float | None = None

    @property
    def next_index(self) -> int:
        return max(self.results, default=-1) + 1

    def finished(self) -> bool:
        return bool(self.cases) and self.next_index >= len(self.cases)

    def record(self, index: int, status: str, message: str) -> None:
        case = self.cases[index]
        self.results[index] = CaseResult(case["name"], case["points"], status, message,
                                         case["hidden"])

    def record_rest(self, status: str, message: str) -> None:
        for index in range(self.next_index, len(self.cases)):
            self.record(index, status, message)


_CONTEXT: Any = None


def _context(figures: bool = False) -> Any:
    """The multiprocessing context: forkserver with torch and the checks preloaded (and
    matplotlib, when the first run wants figures)."""
    global _CONTEXT  # one server per grading process, started on first use
    if _CONTEXT is None:
        methods = multiprocessing.get_all_start_methods()
        forkserver = "forkserver" in methods
        _CONTEXT = multiprocessing.get_context("forkserver" if forkserver else "spawn")
    if _CONTEXT.get_start_method() == "forkserver":
        _add_preload(_CONTEXT, PRELOAD + (FIGURE_PRELOAD if figures else []))
    return _CONTEXT


def warm_up() -> None:
    """Start the grading fork server in a background thread, so that a learner's first check
    does not wait for it (it imports torch and every lesson's checks: 5-10 s). A notebook's
    first ``mp.progress()`` calls this; a check that comes sooner simply waits for it
    (starting the server is guarded by its own lock)."""
    ctx = _context(figures=True)
    if ctx.get_start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    threading.Thread(target=forkserver.ensure_running, daemon=True,
                     name="mpgpu-grader-warm-up").start()


def _add_preload(ctx: Any, modules: list[str]) -> None:
    """Add ``modules`` to what the fork server imports when it starts. The server is shared
    by the whole process (``mpgpu_edu.comm.pool`` uses it too), so keep what others asked
    for; once it runs, this changes nothing."""
    from multiprocessing import forkserver

    current = list(getattr(getattr(forkserver, "_forkserver", None), "_preload_modules", []))
    ctx.set_forkserver_preload(current + [m for m in modules if m not in current])


def run_exercise(exercise_id: str, file: Path, function: str | None = None, *,
                 limits: Limits = Limits(), figures: bool = False,
                 display_file: str | None = None) -> ExerciseResult:
    """Check ``function`` (default: the exercise's own) of the module ``file`` in child
    processes that work in a scratch folder. ``file`` is imported where it is, without
    writing bytecode (``run_many`` imports copies, so that not even hostile code can change
    the learner's files)."""
    exercise = get(exercise_id)
    state = _State(exercise)
    started = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="mpgpu-work-")
    request = {"exercise": exercise.id, "file": str(file),
               "function": function or exercise.function, "workdir": workdir,
               "case_timeout_s": limits.case_timeout_s, "memory_bytes": limits.memory_bytes,
               "output_chars": limits.output_chars, "figures": figures,
               "display_file": display_file or str(file)}
    try:
        _run_sessions(state, request, limits)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return _result(state, request, time.monotonic() - started)


def _run_sessions(state: _State, request: dict, limits: Limits) -> None:
    """Child after child, each from the next case, until every case has a result."""
    while not state.finished():
        if state.budget_end is not None and time.monotonic() >= state.budget_end:
            state.record_rest("timeout", f"not run: the exercise's {limits.timeout_s:g} s "
                                         "were used up by the cases before")
            break
        before = state.next_index
        _session(state, request, limits)
        if not state.cases or state.next_index == before and not state.finished():
            state.message = state.message or "the check process stopped before running a case"
            if state.cases:
                state.record_rest("error", state.message)
            break


def _result(state: _State, request: dict, seconds: float) -> ExerciseResult:
    e = state.exercise
    cases = [state.results[i] for i in sorted(state.results)]
    status = exercise_status(cases) if cases else "error"
    return ExerciseResult(e.id, e.title, status, e.points, cases, e.hint,
                          request["display_file"], request["function"], e.notebook,
                          state.message, state.figure, "a separate process", seconds)


def _session(state: _State, request: dict, limits: Limits) -> None:
    """One child's life: start it at the next case, follow it, and stop it when it dies,
    overruns a case or finishes."""
    ctx = _context(request["figures"])
    reader, writer = ctx.Pipe(duplex=False)
    remaining = (limits.timeout_s if state.budget_end is None
                 else state.budget_end - time.monotonic())
    child_request = dict(request, start=state.next_index, budget_s=max(remaining, 0.1))
    process = ctx.Process(target=_child_main, args=(writer, child_request), daemon=True)
    with _without_main():
        process.start()  # the first start waits for the server to import torch: not counted
    writer.close()
    if state.budget_end is None:
        state.budget_end = time.monotonic() + limits.timeout_s
    try:
        _follow(state, reader, process, limits)
    finally:
        reader.close()
        _stop(process)


def _child_main(conn: Any, request: dict) -> None:
    """The child's entry point; ``_child`` (torch, the checks) is imported in the child only,
    never in the process that runs the grader."""
    from mpgpu_edu.grading._child import main

    main(conn, request)


_START_LOCK = threading.Lock()


@contextlib.contextmanager
def _without_main() -> Iterator[None]:
    """Start children without re-running the parent's ``__main__``, as multiprocessing
    otherwise does: a child only needs ``_child``, and re-running a script that has no
    ``if __name__ == "__main__"`` guard (or was read from stdin) would break it."""
    original = multiprocessing.spawn.get_preparation_data

    def preparation_data(name: str) -> dict:
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    with _START_LOCK:
        multiprocessing.spawn.get_preparation_data = preparation_data
        try:
            yield
        finally:
            multiprocessing.spawn.get_preparation_data = original


Phase = tuple[int | str | None, float]  # (the case running, or "import"..., its deadline)


def _follow(state: _State, reader: Any, process: Any, limits: Limits) -> None:
    """Read the child's messages until it is done, dies, or misses a deadline."""
    phase: Phase | None = ("startup", time.monotonic() + BETWEEN_CASES_S + 60.0)
    while phase is not None:
        assert state.budget_end is not None
        current, deadline = phase
        wait = min(deadline, state.budget_end + GRACE_S) - time.monotonic()
        if wait <= 0:
            _overran(state, current, limits)
            return
        try:
            message = reader.recv() if reader.poll(min(wait, 0.5)) else None
        except (EOFError, OSError):
            _died(state, current, process)
            return
        if message is None:
            if not process.is_alive() and not reader.poll(0):
                _died(state, current, process)
                return
            continue
        phase = _handle(state, message, phase)


def _handle(state: _State, message: dict, phase: Phase) -> Phase | None:
    """Record one message; the next phase, or None when the child is done."""
    kind, now = message.pop("type"), time.monotonic()
    if kind == "cases":
        state.cases = message["cases"]
        return phase[0], now + BETWEEN_CASES_S
    if kind == "import":
        return "import", now + BETWEEN_CASES_S
    if kind == "import_error":
        state.message = message["message"]
        state.record_rest(message["status"], "not run: the file could not be imported")
        return None
    if kind == "start":
        return message["index"], now + message["timeout_s"] + GRACE_S
    if kind == "result":
        index = message.pop("index")
        state.results[index] = CaseResult(**message)
        return None, now + BETWEEN_CASES_S
    if kind == "figure":
        state.figure = message["png"]
        return phase
    return None  # "done"


def _overran(state: _State, current: int | str | None, limits: Limits) -> None:
    budget = f"the exercise's {limits.timeout_s:g} s"
    if isinstance(current, int):
        state.record(current, "timeout", "still running when its time was up, so its "
                     "process was stopped (an endless loop? a rank waiting for a message "
                     "nobody sends?)")
    elif current == "import":
        state.message = "importing the file did not finish in time (code at the top level "\
                        "of the file that never ends?)"
        state.record_rest("timeout", "not run: " + state.message)
    elif state.cases:
        state.record_rest("timeout", f"not run: {budget} were used up")
    else:
        state.message = "the check process did not start in time"


def _died(state: _State, current: int | str | None, process: Any) -> None:
    process.join(5)
    why = _exit_reason(process.exitcode)
    if isinstance(current, int):
        state.record(current, "error", f"the check process {why} during this case: does the "
                                       "code call sys.exit/os._exit, or crash the interpreter?")
    elif current == "import":
        state.message = f"the check process {why} while importing the file"
        state.record_rest("error", "not run: " + state.message)
    elif not state.cases:
        state.message = f"the check process {why} before it could start"


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "stopped"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _stop(process: Any) -> None:
    """End the child and everything it started (it leads its own process group)."""
    if process.is_alive():
        process.join(1.0)
    if process.is_alive() and process.pid is not None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (OSError, AttributeError):  # gone already, or no process groups here
            process.kill()
        process.join(5.0)


# ---- several exercises from one folder ----------------------------------------------------

def copy_impl(impl_dir: Path) -> Path:
    """A private copy of the ``.py`` files of ``impl_dir`` (a temporary folder): the code
    under check is imported from there, never from the learner's own files."""
    target = Path(tempfile.mkdtemp(prefix="mpgpu-check-"))
    for path in sorted(Path(impl_dir).glob("*.py")):
        if path.is_file():
            shutil.copyfile(path, target / path.name)
    return target


def run_many(impl_dir: Path, ids: list[str], *, limits: Limits = Limits(),
             figures: bool = False, display_dir: str | None = None,
             on_result: Callable[[ExerciseResult], None] | None = None
             ) -> list[ExerciseResult]:
    """Check exercises ``ids`` against the modules in ``impl_dir`` (an ``exercises/`` or
    ``solutions/`` folder), each in isolation, in order."""
    copy = copy_impl(impl_dir)
    shown = display_dir if display_dir is not None else str(impl_dir)
    results = []
    try:
        for exercise_id in ids:
            exercise = get(exercise_id)
            file = copy / exercise.filename
            display = f"{shown.rstrip('/')}/{exercise.filename}"
            if not file.is_file():
                result = missing_file(exercise, display)
            else:
                result = run_exercise(exercise.id, file, limits=limits, figures=figures,
                                      display_file=display)
            results.append(result)
            if on_result is not None:
                on_result(result)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    return results


def missing_file(exercise: Exercise, display: str) -> ExerciseResult:
    return ExerciseResult(exercise.id, exercise.title, "error", exercise.points, [],
                          exercise.hint, display, exercise.function, exercise.notebook,
                          f"{display} does not exist")
