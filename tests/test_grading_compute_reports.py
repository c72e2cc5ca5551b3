"""No point rests on the compute a rank reports about itself.

Where the ranks run apart in class grading, a rank's process reports its own compute to the
grader's clock (FLOPs and seconds, counted where the ops ran): it could report any amounts,
at any places among its messages. So, for every case that earns points in an exercise whose
ranks run apart, the verdict on the right answer must not change when every compute report in
the run's record is dropped, multiplied by ten, or moved after the rank's last message: only
the messages (which the grader's router saw), the jobs the program started and the values the
ranks returned may decide it. Feedback cases (0 points) may read the reports; they show the
timeline the learner drew.

One run per case (the right answer's, in this process), then three judges of it, each on a
record changed as a forging rank would change it."""

from __future__ import annotations

import copy
import importlib
from typing import Any

import pytest

from mpgpu_edu.grading.checks import cases_for, lesson_module
from mpgpu_edu.grading.checks._clock import MARK, resolve
from mpgpu_edu.grading.checks._plain import plain
from mpgpu_edu.grading.registry import EXERCISES, LESSONS
from tests.test_grading_checks import solution

pytestmark = pytest.mark.slow


def _apart() -> list[str]:
    found = []
    for number in LESSONS:
        found += [e for e in getattr(lesson_module(number), "RANKS_APART", ())]
    return sorted(found, key=lambda e: [int(p) for p in e.split(".")])


def _scored(exercise_id: str) -> list[Any]:
    return [case for case in cases_for(exercise_id) if case.points]


SCORED = [(e, case.name) for e in _apart() for case in _scored(e)]


def forged(data: Any, how: str) -> Any:
    """``data`` with every run record's compute reports changed: ``drop`` (none at all),
    ``ten`` (every one ten times as long and as many FLOPs), ``late`` (each rank's program
    reports all of them after its last op)."""
    if isinstance(data, list):
        return [forged(item, how) for item in data]
    if not isinstance(data, dict):
        return data
    out = {key: forged(value, how) for key, value in data.items() if key != MARK}
    if MARK in data:
        record = copy.deepcopy(data[MARK])
        record["ops"] = [[rank, lane, _forged_ops(op_list, how)]
                         for rank, lane, op_list in record["ops"]]
        out[MARK] = record
    return out


def _forged_ops(op_list: list[Any], how: str) -> list[Any]:
    compute = [op for op in op_list if op and op[0] == "compute"]
    rest = [op for op in op_list if not (op and op[0] == "compute")]
    if how == "drop":
        return rest
    if how == "ten":
        return [["compute", op[1] * 10, op[2], op[3], op[4] * 10] if op and op[0] == "compute"
                else op for op in op_list]
    return rest + compute


def _solution_of(exercise_id: str) -> Any:
    exercise = EXERCISES[exercise_id]
    module = LESSONS[exercise.lesson][0]
    return getattr(solution(module), exercise.function)


@pytest.mark.parametrize(("exercise_id", "name"), SCORED, ids=[f"{e}-{n[:40]}" for e, n in SCORED])
def test_a_scored_verdict_does_not_rest_on_reported_compute(exercise_id: str,
                                                               name: str) -> None:
    case = next(c for c in cases_for(exercise_id) if c.name == name)
    data = plain(case.compute(_solution_of(exercise_id)))
    case.judge(resolve(copy.deepcopy(data)))  # the right answer passes as it ran
    for how in ("drop", "ten", "late"):
        try:
            case.judge(resolve(forged(data, how)))
        except AssertionError as exc:
            pytest.fail(f"{exercise_id} {name!r} ({case.points} points) fails the right answer "
                        f"once its compute reports are changed ({how}): {exc}")


def test_every_exercise_whose_ranks_run_apart_is_covered() -> None:
    assert {e for e, _ in SCORED} == set(_apart()), "an apart exercise with no scored case"
    assert importlib.import_module("mpgpu_edu.grading.checks._clock").MARK == MARK
