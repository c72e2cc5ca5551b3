"""Lesson 08's checks say what is wrong: the failing case of each plausible wrong answer and
its message (the mutants themselves are in tests/mutants/lesson_08.py), and the list a stub
shows is the check's own cases."""

from __future__ import annotations

import pytest

from mpgpu_edu.grading.registry import EXERCISES
from mpgpu_edu.grading import check
from mpgpu_edu.grading.checks import cases_for
from tests.mutants import failures
from tests.mutants import lesson_08 as mutants


def test_a_finish_that_never_clears_is_named_where_the_gradients_first_go_wrong() -> None:
    failed = failures("8.2", mutants.fsdp_never_clears, only="3 ranks")
    message = next(m for c, m in failed.items() if c.startswith("3 ranks"))
    assert "step 1" in message and "finish() clear self.reducing" in message, message


def test_a_backward_that_waits_for_its_reduce_scatter_fails_the_timeline() -> None:
    failed = failures("8.2", mutants.fsdp_waits_on_reduce_scatter)
    assert list(failed) == [next(c.name for c in cases_for("8.2")
                                 if c.name.startswith("timeline"))], failed
    assert "wait for its own reduce-scatter" in next(iter(failed.values()))


def test_a_view_of_the_padded_copy_is_named_in_the_feedback_case_only() -> None:
    """Its values are right; the memory it shares is seen only inside the learner's process,
    so only the feedback case (worth no points) names it."""
    failed = failures("8.1", mutants.shard_view_of_padded)
    memory = next(c for c in cases_for("8.1") if c.name.startswith("each a tensor of its own"))
    assert list(failed) == [memory.name] and memory.points == 0, failed
    assert "storage" in failed[memory.name] and "48 bytes" in failed[memory.name], failed


@pytest.mark.parametrize(("exercise_id", "name", "case", "words"), [
    ("8.2", "fsdp_overwrites_grad", "gradients accumulate", ("only batch 1's gradient",)),
])
def test_the_wrong_answer_fails_one_case_that_names_it(exercise_id: str, name: str, case: str,
                                                       words: tuple[str, ...]) -> None:
    failed = failures(exercise_id, getattr(mutants, name))
    assert len(failed) == 1, failed
    (failed_case, message), = failed.items()
    assert case in failed_case
    assert all(word in message for word in words), message


def test_collectives_off_the_comm_stream_are_named() -> None:
    prefetch = next(c for c in cases_for("8.2") if c.name.startswith("timeline"))
    with pytest.raises(Exception, match=r"not on its comm stream.*comm\.run_async"):
        prefetch.run(mutants.fsdp_synchronous)
    with pytest.raises(Exception, match="does not run while this layer computes"):
        prefetch.run(mutants.fsdp_ignores_prefetch)
    calls = next(c.name for c in cases_for("8.2") if c.name.startswith("the calls"))
    first = failures("8.2", mutants.fsdp_synchronous, only="the calls")[calls]
    assert "before its own gather was started on the comm stream" in first, first
    assert "-1" not in first, first


def test_a_prefetch_started_after_the_layers_compute_is_told_it_starts_too_late() -> None:
    """The same wrapper with the next gather started just after ``run_layer`` (in backward
    before the reduce-scatter) hides far less of it: the timeline case fails and says where
    the gather belongs, and the prefetch case sees each layer compute before the next
    layer's gather was started."""
    assert set(failures("8.2", mutants.fsdp_prefetches_after_compute)) == {
        next(c.name for c in cases_for("8.2") if c.name.startswith(start))
        for start in ("timeline", "prefetch on")}
    prefetch = next(c for c in cases_for("8.2") if c.name.startswith("timeline"))
    with pytest.raises(Exception, match="starts too late.*before its compute"):
        prefetch.run(mutants.fsdp_prefetches_after_compute)


def test_a_stubs_report_lists_the_checks_own_cases() -> None:
    """The not-implemented report of 8.2 is built from its cases, names and points."""
    result = check("8.2", impl="exercises", figures=False)
    assert result.status == "not_implemented"
    cases = cases_for("8.2")
    assert [(c.name, c.max_points) for c in result.cases] == [(c.name, c.points)
                                                               for c in cases]
    assert sum(c.points for c in cases) == EXERCISES["8.2"].points


@pytest.mark.parametrize(("name", "case", "words"), [
    ("fsdp_prefetches_every_layer", "prefetch on", ("gathers of 2 later layers",
                                                      "at most two layers")),
    ("fsdp_prefetch_skips_first_layer", "prefetch on", ("layer 0", "the first included")),
    ("fsdp_prefetches_always", "the calls", ("with prefetch=False", "already started")),
])
def test_a_prefetch_that_gathers_the_wrong_layers_is_named(name: str, case: str,
                                                            words: tuple[str, ...]) -> None:
    """What each layer's forward found started: every later layer (all held at once), not
    the next one (the first layer's gather never hidden), or one without prefetch."""
    checked = next(c for c in cases_for("8.2") if c.name.startswith(case))
    with pytest.raises(Exception) as failed:  # only the case that names it: each run costs
        checked.run(getattr(mutants, name))
    assert all(word in str(failed.value) for word in words), failed.value
