"""Lesson 10's checks say what is wrong: the failing case of each plausible wrong answer and
its message (the mutants themselves are in tests/mutants/lesson_10.py), and the package's
interleaved schedule is out of reach while the learner's is checked."""

from __future__ import annotations

import pytest

from mpgpu_edu.grading import check
from tests.mutants import failures
from tests.mutants import lesson_10 as mutants


@pytest.mark.parametrize(("exercise_id", "name", "case", "words"), [
    ("10.1", "bubble_unchecked", "refuses sizes", ("(4, 8, 0)", "raised ZeroDivisionError",
                                                  "ValueError")),
    ("10.1", "bubble_ignores_chunks", "agrees with the simulated schedule",
     ("P=2, M=4, V=3", "simulated schedule's bubble")),
    ("10.1", "bubble_idle_fraction", "the docstring's example", ("P=4, M=8, V=1",)),
])
def test_the_wrong_answer_fails_a_case_that_names_it(exercise_id: str, name: str, case: str,
                                                     words: tuple[str, ...]) -> None:
    failed = failures(exercise_id, getattr(mutants, name))
    assert any(case in c for c in failed), failed
    message = next(m for c, m in failed.items() if case in c)
    assert all(word in message for word in words), message


@pytest.mark.parametrize(("name", "case", "words"), [
    ("orders_plain_warmup", "a valid schedule", ("can never finish", "B(stage 0, mb 0, chunk 1)")),
    ("orders_chunks_not_reversed", "a valid schedule", ("can never finish", "three rules",
                                                        "device 0: F0 F1 F0.1")),
    ("orders_microbatch_major", "the bubble is", ("50.00%", "(P-1)/(V M) = 12.50%",
                                                 "rounds of P microbatches")),
    ("orders_all_forwards_first", "memory", ("[16, 16, 16, 16]", "[11, 9, 7, 5]")),
    ("orders_never_refuses", "refuses sizes", ("interleaved_orders(4, 6, 2)", "ValueError")),
    ("orders_uncapped_warmup", "memory", ("interleaved_orders(3, 3, 2): device 0 runs 1 b",
                                          "capped at M x V")),
])
def test_each_wrong_schedule_fails_the_case_that_names_its_mistake(name: str, case: str,
                                                                   words: tuple[str, ...]) -> None:
    failed = failures("10.2", getattr(mutants, name))
    message = next((m for c, m in failed.items() if case in c), None)
    assert message is not None, failed
    assert all(word in message for word in words), message


def test_the_learner_cannot_call_the_package_for_10_2(tmp_path) -> None:
    """Through the grader's child: a submission that returns the package's interleaved 1F1B
    orders is stopped by REFERENCES, not graded."""
    folder = tmp_path / "exercises"
    folder.mkdir()
    (folder / "ex10_planning.py").write_text(
        "from tests.mutants.lesson_10 import orders_from_the_package\n"
        "def interleaved_bubble_overhead(*a):\n    raise NotImplementedError\n"
        "def interleaved_orders(p, m, v):\n    return orders_from_the_package(p, m, v)\n")
    result = check("10.2", impl=str(folder), figures=False)
    assert result.points == 0
    assert "yours to write" in str(result)
