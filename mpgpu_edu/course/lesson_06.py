"""Lesson 06: choosing and debugging."""

from __future__ import annotations

from mpgpu_edu.course._types import Lesson, ex

EXERCISES = (
    ex('6.1', 'choose_strategy', 'Choosing a strategy that fits', 5,
       ('estimate_memory(...).fits(cluster.capacity_bytes(0)).',
        'estimate_memory(...).fits(cluster.capacity_bytes(0)).',
        'estimate_memory(...).fits(cluster.capacity_bytes(0)).')),
    ex('6.2', 'exchange_with_partner', 'Debugging: a swap that cannot deadlock', 5,
       ('the lower rank of a pair sends first.',
        'the lower rank of a pair sends first.',
        'the lower rank of a pair sends first.')),
)

PREDICTIONS = ()

LESSON = Lesson(6, 'choosing and debugging', 'ex06_choosing', 'notebooks/06_choosing_and_debugging.ipynb', EXERCISES, PREDICTIONS)
