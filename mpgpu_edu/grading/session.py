"""The grader's side of one exercise's run: follow a child's messages, judge each case's data
here (never in the child), and turn deaths and overruns into results.

``State`` is what the grader knows so far; ``follow`` reads one child until it is done, dies
or misses a deadline. The cases, their names and points come from the grader's own copy of
the checks, never from the child.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from mpgpu_edu.grading.checks import Case, cases_for
from mpgpu_edu.grading.checks._clock import resolve
from mpgpu_edu.grading.registry import Exercise
from mpgpu_edu.grading.report import CaseResult
from mpgpu_edu.grading.wire import BadMessage, decode

GRACE_S = 5.0
BETWEEN_CASES_S = 30.0  # import, start-up: work outside a case's own timeout
NOT_PASSING = ("failed", "error", "timeout", "not_implemented")


@dataclass(frozen=True)
class CaseInfo:
    """A case's name, points and whether it is hidden (what a result needs of it)."""

    name: str
    points: int
    hidden: bool = False


def verdict(case: Case, data: Any) -> tuple[str, str, Any]:
    """``(status, message, evidence)``: the *judge* half of ``case`` on ``data``."""
    try:
        assert case.judge is not None, f"case {case.name!r} has no judge half"
        return "passed", "", case.judge(resolve(data))  # the grader times every run itself
    except AssertionError as exc:
        return "failed", str(exc) or "a check failed", getattr(exc, "evidence", None)
    except Exception as exc:  # noqa: BLE001 - data the judge could not read
        return "error", (f"the result could not be judged ({type(exc).__name__}: "
                         f"{str(exc)[:300]}): does the function return what the exercise "
                         "asks for?"), None


@dataclass
class State:
    """What the grader knows about one exercise's run so far. ``trust_child``: the child
    judges its own cases and names them (a learner's own ``check``, where speed matters
    and nobody is cheating but on themselves); otherwise this process judges, with its own
    copy of the checks (class grading)."""

    exercise: Exercise
    figures: bool = False
    trust_child: bool = False
    cases: list[Any] = field(default_factory=list)
    results: dict[int, CaseResult] = field(default_factory=dict)
    figure: str = ""
    message: str = ""
    budget_end: float | None = None

    def __post_init__(self) -> None:
        if not self.trust_child:
            self.cases = cases_for(self.exercise.id)

    @property
    def next_index(self) -> int:
        return max(self.results, default=-1) + 1

    def finished(self) -> bool:
        return bool(self.cases) and self.next_index >= len(self.cases)

    def record(self, index: int, status: str, message: str, output: str = "",
               seconds: float = 0.0, text: str = "") -> None:
        case = self.cases[index]
        self.results[index] = CaseResult(case.name, case.points, status, message, case.hidden,
                                         output, seconds, text)

    def record_rest(self, status: str, message: str) -> None:
        for index in range(self.next_index, len(self.cases)):
            self.record(index, status, message)

    def judge(self, index: int, data: Any, output: str, seconds: float) -> None:
        """The verdict on case ``index``'s data, reached in this process."""
        status, message, evidence = verdict(self.cases[index], data)
        text = getattr(evidence, "text", "") or ""
        self.record(index, status, message, output, seconds, text)
        if self.figures and not self.figure and getattr(evidence, "traces", None):
            from mpgpu_edu.grading._outcome import figure_png

            self.figure = figure_png(evidence)


Phase = tuple[Any, float]  # (the case running, or "import"..., its deadline)


def follow(state: State, child: Any, limits: Any) -> None:
    """Read the child's messages until it is done, dies, or misses a deadline."""
    conn = child.conns[0]
    phase: Phase | None = ("startup", time.monotonic() + BETWEEN_CASES_S + 60.0)
    while phase is not None:
        assert state.budget_end is not None
        current, deadline = phase
        wait = min(deadline, state.budget_end + GRACE_S) - time.monotonic()
        if wait <= 0:
            overran(state, current, limits)
            return
        try:
            data = conn.recv_bytes() if conn.poll(min(wait, 0.5)) else None
        except (EOFError, OSError):
            died(state, current, child)
            return
        if data is None:
            if not child.is_alive() and not conn.poll(0):
                died(state, current, child)
                return
            continue
        try:
            message = decode(data)
            if message["type"] == "seed" and not state.trust_child:
                _answer_seed(conn, message)
                continue
            phase = handle(state, message, phase)
        except (BadMessage, KeyError, TypeError, ValueError, IndexError):
            state.message = "the check process sent something that is not a check's message"
            state.record_rest("error", "not run: " + state.message)
            return


def _answer_seed(conn: Any, message: dict) -> None:
    """A class-grading child asks for the seed of inputs: made here, with the key that never
    leaves this process (``checks._support.secret_seed``)."""
    from mpgpu_edu.grading.checks._support import secret_seed

    seed = message["seed"]
    if type(seed) is not int or abs(seed) > 2**63:
        raise ValueError("a seed is an int")
    conn.send_bytes(json.dumps({"id": message.get("id"), "seed": secret_seed(seed)}).encode())


def handle(state: State, message: dict, phase: Phase) -> Phase | None:
    """Record one message; the next phase, or None when the child is done."""
    kind, now = message["type"], time.monotonic()
    if kind == "import":
        return "import", now + BETWEEN_CASES_S
    if kind == "import_error":
        status = message["status"] if message["status"] in NOT_PASSING else "error"
        state.message = str(message["message"])
        state.record_rest(status, "not run: the file could not be imported")
        return None
    if kind == "cases" and state.trust_child and not state.cases:
        state.cases = [CaseInfo(str(c["name"]), int(c["points"]), bool(c["hidden"]))
                       for c in message["cases"]]
        return phase[0], now + BETWEEN_CASES_S
    index = message.get("index")
    if kind == "judged" and state.trust_child and index == state.next_index:
        status = message["status"] if message["status"] in NOT_PASSING + ("passed",) \
            else "error"
        state.record(index, status, str(message["message"]),
                     str(message["output"]), float(message["seconds"]), str(message["text"]))
        if message.get("figure") and not state.figure:
            state.figure = str(message["figure"])
        return None, now + BETWEEN_CASES_S
    if kind == "start" and index == state.next_index:
        return index, now + float(message["timeout_s"]) + GRACE_S
    if kind == "computed" and index == state.next_index:
        state.judge(index, message["data"], str(message["output"]), float(message["seconds"]))
        return None, now + BETWEEN_CASES_S
    if kind == "ended" and index == state.next_index:
        status = message["status"] if message["status"] in NOT_PASSING else "error"
        state.record(index, status, str(message["message"]), str(message["output"]),
                     float(message["seconds"]))
        return None, now + BETWEEN_CASES_S
    if kind == "done":
        return None
    raise BadMessage(f"unexpected {kind!r}")


def overran(state: State, current: Any, limits: Any) -> None:
    if isinstance(current, int):
        state.record(current, "timeout", "still running when its time was up, so its "
                     "process was stopped (an endless loop? a rank waiting for a message "
                     "nobody sends?)")
    elif current == "import":
        state.message = "importing the file did not finish in time (code at the top level "\
                        "of the file that never ends?)"
        state.record_rest("timeout", "not run: " + state.message)
    else:
        state.record_rest("timeout", f"not run: the exercise's {limits.timeout_s:g} s were "
                                     "used up")


def died(state: State, current: Any, child: Any) -> None:
    why = exit_reason(child.join(5.0))
    if isinstance(current, int):
        state.record(current, "error", f"the check process {why} during this case: does the "
                                       "code call sys.exit/os._exit, or crash the interpreter?")
    elif current == "import":
        state.message = f"the check process {why} while importing the file"
        state.record_rest("error", "not run: " + state.message)
    elif state.next_index == 0 and current == "startup":
        state.message = f"the check process {why} before it could start"


def exit_reason(code: int | None) -> str:
    if code is None:
        return "stopped"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"
