"""The exercise registry: every exercise of the course, its file, function, points and hint.

The exercises themselves, with their tiered hints, are data in ``mpgpu_edu.course`` (no torch,
so ``mpgpu-edu progress`` and the CLI start fast); this module indexes them. The checks live in
``mpgpu_edu.grading.checks.lesson_NN``; a test keeps each exercise's points equal to the sum
of its cases' points.

An exercise is one function in ``exercises/exNN_*.py``. Its solution sits in the same
function of ``solutions/exNN_*.py`` between ``### BEGIN SOLUTION <id>`` and
``### END SOLUTION``; ``mpgpu_edu.grading.generate`` turns that into the two-line stub.
"""

from __future__ import annotations

from mpgpu_edu.course import LESSONS as _LESSONS
from mpgpu_edu.course import Exercise

__all__ = ["EXERCISES", "LESSONS", "LESSON_TITLES", "Exercise", "by_lesson", "by_module", "get",
           "max_score", "select"]

# lesson number -> (exercise module, notebook); the lessons themselves live in mpgpu_edu.course
LESSONS: dict[int, tuple[str, str]] = {n: (lesson.module, lesson.notebook)
                                        for n, lesson in _LESSONS.items()}
LESSON_TITLES: dict[int, str] = {n: lesson.title for n, lesson in _LESSONS.items()}
EXERCISES: dict[str, Exercise] = {e.id: e for lesson in _LESSONS.values()
                                   for e in lesson.exercises}


def get(exercise_id: str) -> Exercise:
    """The exercise ``exercise_id`` (e.g. ``"1.3"``); ``KeyError`` with the valid ids."""
    key = str(exercise_id).strip()
    if key not in EXERCISES:
        raise KeyError(f"unknown exercise {exercise_id!r}: choose one of "
                       + ", ".join(EXERCISES))
    return EXERCISES[key]


def by_lesson(lesson: int) -> list[Exercise]:
    return [e for e in EXERCISES.values() if e.lesson == lesson]


def by_module(module: str) -> list[Exercise]:
    return [e for e in EXERCISES.values() if e.module == module]


def max_score() -> int:
    return sum(e.points for e in EXERCISES.values())


def select(words: list[str] | None) -> list[str]:
    """Exercise ids from command-line words: ``"1.3"``, a lesson ``"1"`` (all its
    exercises), or nothing (every exercise). Raises KeyError naming an unknown word."""
    if not words:
        return list(EXERCISES)
    chosen: list[str] = []
    for word in words:
        word = word.strip()
        if word in EXERCISES:
            found = [word]
        elif word.isdigit() and int(word) in LESSONS:
            found = [e.id for e in by_lesson(int(word))]
        else:
            raise KeyError(f"unknown exercise {word!r}: choose from " + ", ".join(EXERCISES)
                           + f" (or a lesson number {min(LESSONS)}-{max(LESSONS)})")
        chosen += [i for i in found if i not in chosen]
    return chosen
