"""Checks that catch plausible wrong answers: every mutant in ``tests/mutants/`` fails its
exercise's check, and every exercise has at least one mutant.

The cases run in this process (compute, then judge, as in the grader's child) and stop at the
first case that rejects the mutant: a process per mutant would cost minutes for nothing. One
test goes through ``check`` end to end."""

from __future__ import annotations

import copy
import importlib

import pytest

from mpgpu_edu.course import LESSONS
from mpgpu_edu.grading import check
from mpgpu_edu.grading.checks import cases_for
from mpgpu_edu.grading.checks._clock import resolve
from mpgpu_edu.grading.checks._plain import plain
from mpgpu_edu.grading.compute import ranks_apart
from mpgpu_edu.grading.registry import EXERCISES
from tests.test_grading_compute_reports import forged

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


# Mistakes that only the rank's own process can see (which functions it called, what it
# kept alive, what a tensor held inside it, whether it changed or returned the tensors it
# was handed, the autograd graph of what it returned): where the ranks run apart in class grading,
# such facts earn no points (``checks.FEEDBACK``), so these wrong answers fail a feedback
# case and lose nothing. The messages the grader sees are the same as a right answer's.
# So are the last three's, whose mistake is only where compute falls against their jobs:
# the rank's process reports its own compute (``checks.FEEDBACK_COMPUTE``).
SEEN_ONLY_INSIDE = {
    "composed_of_the_ring", "reduce_scatter_in_place", "all_gather_own_entry_is_input",
    "server_steps_per_gradient_exactly",
    "server_steps_per_arrival_on_a_copy", "loop_updates_each_arrival_by_its_share",
    "sharded_updates_per_arrival", "executor_never_frees", "executor_keeps_loop_variables",
    "executor_holds_every_send", "fsdp_autograd_keeps_weights", "fsdp_holds_gathered",
    "worker_receives_into_grad", "sharded_adds_into_grad",
    "forward_cuts_the_graph", "forward_returns_detached", "column_zeroes_callers_x",
    "zero1_divides_callers_grad", "swap_alone_returns_input", "smooth_in_place",
    "smooth_overwrites_block", "smooth_zero_steps_returns_block",
    "ddp_all_reduce_in_finish", "fsdp_waits_on_reduce_scatter",
    "fsdp_prefetch_skips_first_layer",
    # exercises whose whole run is the submission's process: what it did to its inputs, what
    # its forward kept alive and how often it ran are seen only there
    "shard_as_view", "shard_view_of_padded", "recompute_nothing", "recompute_one_segment",
    "recompute_keeps_outputs", "recompute_from_the_start", "recompute_with_torch",
    "recompute_marks_the_input",
}


def _first_failure(exercise_id: str, fn: object, scored: bool = True) -> str | None:
    """Run the exercise's cases that earn points in this process (both halves, as the grader
    does) until one rejects ``fn``; the failing case's name and message, or None if every
    case passes. ``scored=False``: the feedback cases too.

    Where the ranks run apart, a scored case that rejects ``fn`` must reject it still when
    every compute report in the run's record is dropped, multiplied by ten or moved after the
    rank's last message: a rank could report its compute so, and a lost point must not rest
    on what the rank says of itself (``test_grading_compute_reports`` holds the right
    answers to the same)."""
    apart = exercise_id in ranks_apart(exercise_id)
    for case in cases_for(exercise_id):
        if scored and not case.points:  # feedback only: a wrong answer must lose points
            continue
        data = None
        try:
            data = plain(case.compute(fn))
            case.judge(resolve(copy.deepcopy(data)))
        except NotImplementedError:
            raise
        except BaseException as exc:  # noqa: BLE001 - a failure, or an error the grader reports
            if apart and case.points and data is not None:
                for how in ("drop", "ten", "late"):
                    try:
                        case.judge(resolve(forged(data, how)))
                    except BaseException:  # noqa: BLE001, S112 - rejected still: as it should
                        continue
                    pytest.fail(f"{exercise_id} {case.name!r} rejects the wrong answer only "
                                f"by what its ranks report of their compute: with the "
                                f"reports changed ({how}) it passes")
            return f"{case.name}: {type(exc).__name__}: {exc}"
    return None


@pytest.mark.parametrize(("exercise_id", "module", "name"), MUTANTS,
                         ids=[f"{e}-{n}" for e, _, n in MUTANTS])
def test_mutant_fails_its_check(exercise_id: str, module: str, name: str) -> None:
    fn = getattr(importlib.import_module(module), name)
    assert fn.__doc__, f"{name}: say in its docstring which mistake it makes"
    failure = _first_failure(exercise_id, fn, scored=name not in SEEN_ONLY_INSIDE)
    assert failure is not None, (
        f"the check of {exercise_id} passes the wrong answer {name} ({fn.__doc__.strip()})")


def test_the_grader_rejects_a_mutant_end_to_end() -> None:
    """The same verdict through ``check`` (a grading child process, as for a learner)."""
    exercise_id, module, name = next(m for m in MUTANTS if m[0] == "1.3")
    fn = getattr(importlib.import_module(module), name)
    result = check(exercise_id, fn, figures=False, strict=False, timeout=120)
    assert result.status == "failed", result
