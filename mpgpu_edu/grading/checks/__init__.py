"""The checks: for every exercise, a list of named cases, each worth some points.

A case has two halves. *compute* calls the learner's implementation (the exercise's function)
and returns plain data only: ``torch.Tensor``, ``float``, ``int``, ``bool``, ``str``, ``None``,
and lists and dicts of them (``plain`` copies whatever it returns into exactly those types, so
a returned object cannot lie about equality). *judge* takes that data, never the learner's
code, and returns normally when it passes, raises ``CheckFailure`` with a message for the
learner when it does not, and may return ``Evidence``: timelines to draw next to the
reference's (as ``Trace.to_dict()`` data), or text such as a rendered schedule. Only
*compute* ever needs to run beside the learner's code; the verdict can be reached where that
code cannot reach.

Cases test structure as well as numbers: bytes and messages per rank, the makespan and the
timeline of a simulated run (timed by the grader from the run's record: ``_clock``),
schedules' activations, optimizer state per rank. The reference is the package's own
implementation. Cases marked ``hidden`` run on reproducible examples (``_support.examples``,
seeded, smallest first): the learner sees their name and, on failure, the first failing
example.

Modules: ``lesson_00`` .. ``lesson_10``, each with ``CASES: dict[str, list[Case]]`` (and
``REFERENCES`` where the package's own implementation must not run while an exercise is
checked). A lesson with many cases is a package: its ``__init__`` holds ``CASES``, its
modules the halves of one exercise or of a few that share them. What lessons share is in
``_support`` (running SPMD code, ``from_scratch``, ``rebound``, examples, comparisons),
``_ledger`` (``WorkLedger``: what a tensor held at each receive), ``_plain`` and
``_clock`` (the grader's replay of a run's record).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mpgpu_edu.grading.registry import get

DEFAULT_CASE_TIMEOUT_S = 20.0
# A case whose facts only the submission's own process can see (which functions it called,
# what a tensor held inside it, what it kept alive): its name ends so, and it is worth 0.
# Where the ranks run apart in class grading, every fact that earns points is one the
# grader sees itself (the messages, its own clock) or a rank's result.
FEEDBACK = "(feedback, no points: seen only inside your process)"
# A timeline case whose verdict rests on where the compute falls: the rank's own process
# reports its FLOPs to the clock, so it could report them anywhere. Worth 0 likewise; the
# messages on the same timeline are judged by a case that earns points.
FEEDBACK_COMPUTE = "(feedback, no points: your process reports its own compute)"


class CheckFailure(AssertionError):
    """A case failed: the message says what was expected and what came back."""


@dataclass
class Evidence:
    """What a case can show beside its verdict: timelines (``{"yours": trace, "reference":
    trace}``, drawn side by side) and text (a schedule grid, a table)."""

    traces: dict[str, Any] = field(default_factory=dict)
    text: str = ""


@dataclass(frozen=True)
class Case:
    """One named check worth ``points``: ``judge(plain(compute(impl)))`` raises on failure."""

    name: str
    points: int
    compute: Callable[[Callable[..., Any]], Any]
    judge: Callable[[Any], Evidence | None] | None
    hidden: bool = False
    timeout_s: float = DEFAULT_CASE_TIMEOUT_S

    def run(self, impl: Callable[..., Any],
            guard: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
            ) -> Evidence | None:
        """Both halves in this process (the data crosses ``plain`` in between); *compute*
        runs inside ``guard()`` (the in-kernel check blocks the references there)."""
        from mpgpu_edu.grading.checks._clock import resolve
        from mpgpu_edu.grading.checks._plain import plain

        if self.judge is None:
            raise TypeError(f"case {self.name!r} has no judge half")
        with guard():
            data = plain(self.compute(impl))
        return self.judge(resolve(data))


def lesson_module(lesson: int) -> Any:
    """``mpgpu_edu.grading.checks.lesson_NN`` (imports torch)."""
    return importlib.import_module(f"{__name__}.lesson_{lesson:02d}")


def cases_for(exercise_id: str) -> list[Case]:
    """The cases of exercise ``exercise_id``."""
    exercise = get(exercise_id)
    return list(lesson_module(exercise.lesson).CASES[exercise.id])
