"""Checks that catch plausible wrong answers: every mutant in ``tests/mutants/`` fails its
exercise's check, and every exercise has at least one mutant."""

from __future__ import annotations

import importlib

import pytest

from mpgpu_edu.course import LESSONS
from mpgpu_edu.grading import check
from mpgpu_edu.grading.registry import EXERCISES

pytestmark = pytest.mark.mutants


def _mutants() -> list[tuple[str, str, str]]:
    found = []
    for number in LESSONS:
        module = importlib.import_module(f"tests.mutants.lesson_{number:02d}")
        for exercise_id, names in module.MUTANTS.items():
            found += [(exercise_id, module.__name__, name) for name in names]
    return found


MUTANTS = _mutants()


def test_every_exercise_has_a_mutant() -> None:
    covered = {exercise_id for exercise_id, _, _ in MUTANTS}
    missing = sorted(set(EXERCISES) - covered)
    assert not missing, f"exercises without a plausible wrong answer: {missing}"
    unknown = sorted(covered - set(EXERCISES))
    assert not unknown, f"mutants for unknown exercises: {unknown}"


@pytest.mark.parametrize(("exercise_id", "module", "name"), MUTANTS,
                         ids=[f"{e}-{n}" for e, _, n in MUTANTS])
def test_mutant_fails_its_check(exercise_id: str, module: str, name: str) -> None:
    fn = getattr(importlib.import_module(module), name)
    assert fn.__doc__, f"{name}: say in its docstring which mistake it makes"
    result = check(exercise_id, fn, figures=False, strict=False, timeout=120)
    assert result.status != "passed", (
        f"the check of {exercise_id} passes the wrong answer {name} ({fn.__doc__.strip()})")
    assert result.status in ("failed", "error"), f"{name}: {result.status}: {result}"
