"""The course as data: three hint levels per exercise, capstones worth at least half of each
lesson's points, at least two predictions per lesson, and hints that do not give the
solution away in docstrings."""

from __future__ import annotations

import pytest

from mpgpu_edu.course import CAPSTONE, LESSONS, WARM_UP, prediction
from mpgpu_edu.grading.registry import EXERCISES


@pytest.mark.parametrize("exercise_id", list(EXERCISES))
def test_three_distinct_hint_levels(exercise_id: str) -> None:
    hints = EXERCISES[exercise_id].hints
    assert len(hints) == 3 and all(h.strip() for h in hints)
    assert len(set(hints)) == 3, f"{exercise_id}: the idea, the structure and near-code differ"
    assert EXERCISES[exercise_id].kind in (WARM_UP, CAPSTONE)


@pytest.mark.parametrize("number", [n for n in LESSONS if n >= 1])
def test_capstones_hold_half_the_points(number: int) -> None:
    exercises = LESSONS[number].exercises
    capstone = sum(e.points for e in exercises if e.kind == CAPSTONE)
    total = sum(e.points for e in exercises)
    assert capstone >= 1 and 2 * capstone >= total, (
        f"lesson {number}: capstones {capstone} of {total} points")


@pytest.mark.parametrize("number", list(LESSONS))
def test_at_least_two_predictions(number: int) -> None:
    items = LESSONS[number].predictions
    assert len(items) >= 2
    for item in items:
        assert item.key.startswith(f"{number:02d}.")
        assert len(item.choices) >= 2 and 0 <= item.answer < len(item.choices)
        assert item.why.strip()
        assert prediction(item.key) is item


def test_demo_exercises_exist() -> None:
    for number, lesson in LESSONS.items():
        for exercise_id in lesson.drives_demos:
            assert EXERCISES[exercise_id].lesson == number
    for number in (1, 2, 3, 4, 5):
        assert LESSONS[number].drives_demos, f"lesson {number}: no demo runs the learner's code"


def test_readme_lists_every_lessons_exercises() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for number, lesson in LESSONS.items():
        ids = [e.id for e in lesson.exercises]
        row = next(line for line in readme.splitlines() if line.startswith(f"| {number:02d} |"))
        assert f"{ids[0]} - {ids[-1]}" in row, (row, ids)
