"""The course as data: lessons, their exercises (with tiered hints) and predictions.

Plain data, no torch, so the command line starts fast. One module per lesson
(``lesson_00`` ... ``lesson_10``), each defining ``LESSON``; the grader's registry, ``mp.hint``
and ``mp.predict`` all read from here.
"""

from __future__ import annotations

import importlib

from mpgpu_edu.course._types import CAPSTONE, WARM_UP, Exercise, Lesson, Prediction, ex

__all__ = ["CAPSTONE", "LESSONS", "WARM_UP", "Exercise", "Lesson", "Prediction", "ex",
           "prediction"]

LESSON_NUMBERS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)

LESSONS: dict[int, Lesson] = {
    n: importlib.import_module(f"{__name__}.lesson_{n:02d}").LESSON for n in LESSON_NUMBERS}


def prediction(key: str) -> Prediction:
    """The prediction ``key`` (e.g. ``"01.ring-vs-naive"``); KeyError naming the valid keys."""
    for lesson in LESSONS.values():
        for item in lesson.predictions:
            if item.key == key:
                return item
    known = [p.key for lesson in LESSONS.values() for p in lesson.predictions]
    raise KeyError(f"unknown prediction {key!r}: choose one of {', '.join(known)}")
