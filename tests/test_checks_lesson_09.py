"""Lesson 09's checks say what is wrong: the failing case of each plausible wrong answer and
its message (the mutants themselves are in tests/mutants/lesson_09.py), and the package's and
torch's recomputation are out of reach while the learner's code is checked."""

from __future__ import annotations

import pytest

from mpgpu_edu.grading import check
from tests.mutants import failures
from tests.mutants import lesson_09 as mutants


@pytest.mark.parametrize(("exercise_id", "name", "case", "words"), [
    ("9.1", "bytes_without_scores", "the docstring's example", ("scores", "missing")),
    ("9.1", "bytes_as_float", "the docstring's example", ("float", "return an int")),
    ("9.1", "bytes_scores_six_bytes", "the docstring's example",
     ("off by +1 x a s^2 b", "scores' term", "1 for its dropout mask")),
    ("9.2", "recompute_without_parameters", "data that needs no gradient",
     ("does not require a gradient", "makes autograd call a node's backward")),
    ("9.2", "recompute_overwrites_grad", "gradients accumulate", ("2 backward passes",)),
    ("9.2", "recompute_keeps_outputs", "keeps only each segment's input", ("still alive",)),
])
def test_the_wrong_answer_fails_a_case_that_names_it(exercise_id: str, name: str, case: str,
                                                     words: tuple[str, ...]) -> None:
    failed = failures(exercise_id, getattr(mutants, name))
    assert any(case in c for c in failed), failed
    message = next(m for c, m in failed.items() if case in c)
    assert all(word in message for word in words), message


def test_recomputing_nothing_fails_on_memory_and_calls_not_on_values() -> None:
    """What forward kept and how often each layer ran are seen only inside the learner's
    process: the cases that say so are feedback, worth no points."""
    from mpgpu_edu.grading.checks import FEEDBACK, cases_for

    failed = failures("9.2", mutants.recompute_nothing)
    assert not any("equal the model's" in c for c in failed), failed
    assert any("keeps only each segment's input" in c for c in failed)
    assert any("runs twice" in c for c in failed)
    points = {case.name: case.points for case in cases_for("9.2")}
    assert all(c.endswith(FEEDBACK) and points[c] == 0 for c in failed), failed


def test_switching_on_the_callers_requires_grad_is_named_in_feedback() -> None:
    """Right values; the caller's x changed is seen only inside the learner's process: one
    feedback case fails, with the hint on what else makes autograd call the first segment."""
    failed = failures("9.2", mutants.recompute_marks_the_input)
    assert len(failed) == 1, failed
    (case, message), = failed.items()
    assert case.startswith("the caller's x left as it was"), case
    assert "changed the caller's x" in message and "second hint" in message, message


def test_the_learner_cannot_call_the_package_or_torch_for_9_2(tmp_path) -> None:
    """Through the grader's child: a submission that returns the package's ``checkpointed``
    (or torch's ``checkpoint_sequential``) is stopped by REFERENCES, not graded."""
    folder = tmp_path / "exercises"
    folder.mkdir()
    (folder / "ex09_memory_for_time.py").write_text(
        "from mpgpu_edu.memory.recompute import checkpointed as _theirs\n"
        "def layer_activation_bytes(*a, **k):\n    raise NotImplementedError\n"
        "def checkpointed(model, segments):\n    return _theirs(model, segments)\n")
    result = check("9.2", impl=str(folder), figures=False)
    assert result.points == 0
    assert "yours to write" in str(result)


@pytest.mark.parametrize(("name", "words"), [
    ("recompute_without_detach", "detach the kept input"),
    ("recompute_backward_twice", "back-propagated twice"),
    ("recompute_without_grad_mode", "torch.enable_grad()"),
])
def test_torchs_error_inside_a_segments_backward_is_explained(name: str, words: str) -> None:
    """torch's own error (a second backward through a freed graph; an output without a graph)
    comes with what it means inside a recomputing segment, in every case it stops."""
    failed = failures("9.2", getattr(mutants, name))
    assert failed and all(words in message for message in failed.values()), failed
