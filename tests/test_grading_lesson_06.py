"""Lesson 06's checks: that the examples built to tell a mistake apart really do (an exact fit,
an optimizer, a precision and activations that each change the answer, an exact tie, a rank
that waits least without computing most, one slow step that is not the most compute, time
stamps past 10 000 ms), and that each mistake is named as such, a barrier not as a chain."""

from __future__ import annotations

import importlib.util
import re
import statistics
from pathlib import Path
from typing import Any

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.grading.checks import FEEDBACK, cases_for
from mpgpu_edu.grading.checks.lesson_06.straggler import _straggler_logs
from mpgpu_edu.lessons import choosing_and_debugging as cd
from mpgpu_edu.memory import estimate_memory

ROOT = Path(__file__).resolve().parents[1]


def _solution(name: str) -> Any:
    spec = importlib.util.spec_from_file_location("solution_ex06", ROOT / "solutions"
                                                  / "ex06_choosing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _examples(exercise_id: str, case_name: str) -> list[dict[str, Any]]:
    """The examples a listed case runs, read back from its compute half's records."""
    case = next(c for c in cases_for(exercise_id) if c.name == case_name)
    solution = _solution({"6.1": "choose_strategy", "6.4": "find_straggler"}[exercise_id])
    return [record["example"] for record in case.compute(solution)]


def _failure(exercise_id: str, case_name: str, impl: Any) -> str:
    case = next(c for c in cases_for(exercise_id) if c.name == case_name)
    try:
        case.run(impl)
    except AssertionError as exc:
        return str(exc)
    return ""


# ---- 6.1: an exact fit -----------------------------------------------------------------------

def test_the_exact_fit_examples_fill_a_device_to_the_byte() -> None:
    exact = over = 0
    for name in ("one device: single, or none",
                 "data parallel when a replica fits, even with no byte to spare"):
        for e in _examples("6.1", name):
            cluster = Cluster.preset(e["preset"], visible=e["visible"])
            first = "single" if cluster.world_size == 1 else "dp"
            need = estimate_memory(e["n_params"], e["optimizer"], e["precision"], first,
                                   cluster.world_size, e["activations_bytes"]).per_device_total
            exact += need == cluster.capacity_bytes(0)
            over += need == cluster.capacity_bytes(0) + 1
    assert exact == 2 and over == 2


def test_a_strict_fit_is_told_that_an_exact_fit_fits() -> None:
    from tests.mutants.lesson_06 import choose_strict_fit

    message = _failure("6.1", "data parallel when a replica fits, even with no byte to spare",
                       choose_strict_fit)
    assert "you chose 'zero1', expected 'dp'" in message
    assert "needs exactly the device's" in message


def test_each_argument_changes_an_answer_of_the_named_case() -> None:
    from mpgpu_edu.grading.checks.lesson_06.choice import _reference_choice

    changed = set()
    for e in _examples("6.1", "activations, fp32 and the optimizer count too"):
        cluster = Cluster.preset(e["preset"], visible=e["visible"])
        args = (e["optimizer"], e["precision"], e["activations_bytes"])
        want = _reference_choice(e["n_params"], cluster, *args)
        other = "mixed" if e["precision"] == "fp32" else "fp32"
        for name, variant in (("activations", (args[0], args[1], 0)),
                              ("optimizer", ("adam", args[1], args[2])),
                              ("precision", (args[0], other, args[2]))):
            if _reference_choice(e["n_params"], cluster, *variant) != want:
                changed.add(name)
    assert changed == {"activations", "optimizer", "precision"}


def test_a_left_out_argument_is_named() -> None:
    from tests.mutants.lesson_06 import choose_always_adam, choose_ignoring_precision

    name = "activations, fp32 and the optimizer count too"
    message = _failure("6.1", name, choose_always_adam)
    assert "expected 'dp'" in message and "would be right for Adam" in message
    assert "would be right for mixed precision" in _failure("6.1", name,
                                                            choose_ignoring_precision)


# ---- 6.2 and 6.3: what the record shows -------------------------------------------------------

def test_isend_in_the_swap_is_named() -> None:
    from tests.mutants.lesson_06 import swap_send_never_waited, swap_with_isend

    assert "used isend/irecv: exercise 6.2 is the blocking" in _failure(
        "6.2", "two ranks swap", swap_with_isend)
    assert "never waited on 1 of its works" in _failure("6.2", "two ranks swap",
                                                        swap_send_never_waited)


def test_a_swap_keeps_the_tensors_dtype() -> None:
    from tests.mutants.lesson_06 import swap_through_float32

    message = _failure("6.2", "any dtype and shape: float64 2-D, bfloat16 3-D, int64",
                       swap_through_float32)
    assert "returned float32 for a float64 tensor" in message


def test_a_swap_rounded_through_float32_shows_the_digits_that_differ() -> None:
    from tests.mutants.lesson_06 import swap_rounded_through_float32

    message = _failure("6.2", "any dtype and shape: float64 2-D, bfloat16 3-D, int64",
                       swap_rounded_through_float32)
    assert "right to float32's precision only" in message
    got, want = re.search(r"element \d+ is ([^,]+), expected ([^)]+)\)", message).groups()
    assert got != want and float(got) != float(want)


# Seen only inside a rank's process: a feedback case (no points) in class grading.
KEPT = "returns a new block and leaves the caller's as it was " + FEEDBACK


def test_zero_steps_still_return_a_new_tensor() -> None:
    from tests.mutants.lesson_06 import smooth_zero_steps_returns_block

    message = _failure("6.3", KEPT, smooth_zero_steps_returns_block)
    assert "0 steps" in message and "with 0 steps too, return a copy" in message


def test_a_barrier_is_named_a_barrier_not_a_chain() -> None:
    from tests.mutants.lesson_06 import smooth_chain, smooth_with_barrier

    chain = "7 ranks: no rank waits for a chain of others"
    message = _failure("6.3", chain, smooth_with_barrier)
    assert "comm.barrier()" in message and "chain" not in message
    assert "a chain of others" in _failure("6.3", chain, smooth_chain)
    assert "comm.barrier()" in _failure("6.3", "traffic: one element to each neighbour per step",
                                        smooth_with_barrier)


def test_a_smoothing_run_in_a_comm_stream_job_loses_the_no_chain_point() -> None:
    """The timeline places a job's messages from its submission on, whatever the job waited
    for, so a job could draw a chain away; 6.3 is built from send/recv/isend/irecv alone, and
    the grader sees every job a rank starts."""
    right = _solution("smooth_ring")

    def in_a_job(comm: Any, block: Any, steps: int) -> Any:
        out: list = []
        comm.run_async(lambda: out.append(right(comm, block, steps))).wait()
        return out[0]

    message = _failure("6.3", "7 ranks: no rank waits for a chain of others", in_a_job)
    assert "comm-stream job" in message and "isend/irecv" in message


def test_halos_swapped_are_named_as_such() -> None:
    """Without tags, 2 ranks' halos arrive in the order the neighbour sent them: swapped. The
    message says so, and why tags tell them apart; halos padded on the wrong sides are told
    where each goes."""
    from tests.mutants.lesson_06 import smooth_halos_swapped, smooth_without_tags

    message = _failure("6.3", "two ranks: left and right neighbour are one rank",
                       smooth_without_tags)
    assert "its two halos swapped" in message and "a tag of its own" in message
    message = _failure("6.3", "4 ranks, blocks of 3, one step", smooth_halos_swapped)
    assert "its two halos swapped" in message and "[from the left, block, from the right]" \
        in message
    assert "halos swapped" not in _failure("6.3", "4 ranks, blocks of 3, one step",
                                           smooth_without_tags)


def test_the_callers_block_and_its_dtype_are_kept() -> None:
    from tests.mutants.lesson_06 import (smooth_halos_through_float32, smooth_in_place,
                                         smooth_overwrites_block, smooth_sends_never_waited)

    first = "4 ranks, blocks of 3, one step"
    assert "returned the block it was given" in _failure("6.3", KEPT, smooth_in_place)
    assert "changed the block it was given in place" in _failure("6.3", KEPT,
                                                                 smooth_overwrites_block)
    assert "never waited on" in _failure("6.3", first, smooth_sends_never_waited)
    assert "float32's precision only" in _failure(
        "6.3", "float64 blocks stay float64, halos included", smooth_halos_through_float32)


# ---- 6.4: logs where the ranks differ ----------------------------------------------------------

def _phases(example: dict[str, Any]) -> tuple[list[list[str]], list[float], list[float]]:
    logs = _straggler_logs(**example)
    phases = cd.phase_seconds(logs)
    return logs, [p["compute"] for p in phases], [p["wait"] for p in phases]


def test_the_tie_examples_are_exact_ties() -> None:
    examples = _examples("6.4", "two ranks equally slow: the lower one")
    assert examples
    for e in examples:
        logs, totals, _ = _phases(e)
        low, high = sorted([e["slow_rank"], e["also_slow"]])
        assert totals[low] == totals[high] == max(totals), e
        assert cd.find_straggler_reference(logs)[0] == low
        timed = [[line for line in logs[r] if "compute" in line] for r in (low, high)]
        assert timed[0] == timed[1], e  # identical stamps: a tie for any way of parsing them


def test_the_loader_waits_least_without_computing_most() -> None:
    examples = _examples("6.4", "a rank that loads data between steps: only compute counts")
    assert examples
    for e in examples:
        logs, _, waits = _phases(e)
        rank, seconds = cd.find_straggler_reference(logs)
        assert rank == e["slow_rank"] != e["loader"]
        assert min(range(len(waits)), key=waits.__getitem__) == e["loader"]
        assert abs(statistics.median(waits) - waits[rank] - seconds) > 1e-4, e
        assert any("loading the batch" in line for line in logs[e["loader"]])


def test_each_straggler_mistake_is_named() -> None:
    from tests.mutants.lesson_06 import (straggler_least_waiter, straggler_seconds_from_waits,
                                         straggler_ties_to_highest)

    loader = "a rank that loads data between steps: only compute counts"
    assert "the rank that waited least" in _failure("6.4", loader, straggler_least_waiter)
    assert "how much less it waited" in _failure("6.4", loader, straggler_seconds_from_waits)
    assert "on a tie the straggler is the lowest rank, 2" in _failure(
        "6.4", "two ranks equally slow: the lower one", straggler_ties_to_highest)


def test_one_slow_step_is_not_the_most_compute() -> None:
    from mpgpu_edu.grading.checks.lesson_06.straggler import _slowest_steps

    examples = [e for e in _examples("6.4", "every step counts: the most compute in all, not "
                                            "the slowest step") if "spiky" in e]
    assert examples
    for e in examples:
        logs, totals, _ = _phases(e)
        slowest = _slowest_steps(logs)
        assert max(range(len(slowest)), key=slowest.__getitem__) == e["spiky"], e
        assert cd.find_straggler_reference(logs)[0] == e["slow_rank"] != e["spiky"], e
        assert totals[e["spiky"]] < totals[e["slow_rank"]], e


def test_a_long_run_stamps_past_10_seconds_without_a_space() -> None:
    examples = _examples("6.4", "a long run: time stamps past 10 000 ms")
    assert examples
    for e in examples:
        logs, _, _ = _phases(e)
        stamps = [line for lines in logs for line in lines]
        assert any(line.startswith("[ ") for line in stamps), e
        assert any(line[1].isdigit() and float(line[1:line.index(" ms]")]) >= 10_000
                   for line in stamps), e


def test_the_slowest_step_and_a_split_on_spaces_are_caught() -> None:
    from tests.mutants.lesson_06 import straggler_slowest_step, straggler_split_on_spaces

    message = _failure("6.4", "every step counts: the most compute in all, not the slowest "
                              "step", straggler_slowest_step)
    assert "whose slowest single step" in message and "summed over every step" in message
    case = next(c for c in cases_for("6.4") if c.name == "a long run: time stamps past 10 000 ms")
    try:
        case.run(straggler_split_on_spaces)
    except Exception as exc:  # noqa: BLE001 - the learner's error, as the grader reports it
        assert "could not convert string to float" in str(exc)
    else:
        raise AssertionError("a split on spaces passed the long run")
