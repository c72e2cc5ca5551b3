"""Lesson 07's checks: the solution earns every case; wrong answers fail the right cases."""

from __future__ import annotations

from typing import Any

import pytest

from mpgpu_edu.course import LESSONS
from mpgpu_edu.grading.checks import cases_for
from tests.mutants import lesson_07 as wrong
from tests.test_grading_checks import failing, verdicts
from tests.test_grading_checks import solution as solution_of


def solution() -> Any:
    return solution_of("ex07_many_machines")


@pytest.mark.parametrize("exercise_id", ["7.1", "7.2"])
def test_the_solution_earns_every_case(exercise_id: str) -> None:
    """(7.2's solution reuses lesson 01's two ring halves and all-reduces the chunk the
    reduce-scatter finished, (local + 1) % G: the version the notebook offers.)"""
    exercise = next(e for e in LESSONS[7].exercises if e.id == exercise_id)
    results = verdicts(exercise_id, getattr(solution(), exercise.function))
    assert failing(results) == set(), results


def test_the_mutants_builder_without_a_switch_earns_every_case() -> None:
    """Each 7.2 mutant built on ``_three_phases`` differs from a right answer in one switch."""
    def right(comm, tensor, per_node, op="sum") -> None:  # noqa: ANN001
        wrong._three_phases(comm, tensor, per_node, op)

    assert failing(verdicts("7.2", right)) == set()


def test_the_capstone_is_most_of_the_lesson() -> None:
    points = {e.id: e.points for e in LESSONS[7].exercises}
    assert points["7.2"] * 2 >= sum(points.values())
    assert sum(c.points for c in cases_for("7.2")) == points["7.2"]


def test_a_flat_ring_has_the_right_sums_and_the_wrong_links() -> None:
    results = verdicts("7.2", wrong.hier_flat_ring)
    assert results["sums and means in place on 2 nodes x 4"][0] == "passed"
    assert "traffic: 2(G-1)/G S inside the node, 2(M-1)/(GM) S across, on its own rail" \
        in failing(results)
    assert "time: the closed form on a two-level cluster" in failing(results)


def test_sending_whole_tensors_across_is_told_the_bytes() -> None:
    status, message = verdicts("7.2", wrong.hier_whole_tensor_across)[
        "traffic: 2(G-1)/G S inside the node, 2(M-1)/(GM) S across, on its own rail"]
    assert status == "failed" and "across the network" in message and "3200" in message


def test_calling_the_package_fails_every_case() -> None:
    results = verdicts("7.2", wrong.hier_calls_the_package)
    assert all(status == "failed" for status, _ in results.values())
    assert "mpgpu_edu.collectives.hierarchical" in results[
        "sums and means in place on 2 nodes x 4"][1]
    import mpgpu_edu.collectives.hierarchical as package  # restored afterwards

    assert package.all_reduce_hierarchical.__name__ == "all_reduce_hierarchical"


@pytest.mark.parametrize("mutant", [wrong.hier_wrong_chunk_on_the_rail, wrong.hier_lesson01_loops])
def test_lesson_01s_reduce_scatter_loop_is_named_as_the_mistake(mutant: Any) -> None:
    """Named on even sizes and on sizes that do not divide (tensor_split's uneven chunks)."""
    results = verdicts("7.2", mutant)
    for case in ("sums and means in place on 2 nodes x 4",
                 "sizes that do not divide, 3 nodes, 1 node, 1 GPU per node"):
        status, message = results[case]
        assert status == "failed", case
        assert "leaves local rank i with chunk (i + 1) % per_node finished" in message, case
        assert "your rail summed another chunk" in message, case


def test_other_wrong_values_are_not_blamed_on_phase_one() -> None:
    status, message = verdicts("7.2", wrong.hier_mean_over_node)[
        "sums and means in place on 2 nodes x 4"]
    assert status == "failed" and "wrong values" in message and "chunk i + 1" not in message


def test_phase_two_on_comm_instead_of_the_rail_is_named() -> None:
    status, message = verdicts("7.2", wrong.hier_phase_two_on_comm)[
        "sums and means in place on 2 nodes x 4"]
    assert status == "failed" and "not on its rail" in message
    assert "phase 2 run on comm instead of the rail's group" in message


def test_the_hidden_case_judges_bytes_per_link() -> None:
    """A flat ring has the right sums everywhere: the hidden case must still fail it."""
    status, message = verdicts("7.2", wrong.hier_flat_ring)["hidden: random clusters, sizes and ops"]
    assert status == "failed" and "across the network, expected" in message


def test_chunks_of_rows_of_a_2d_tensor_send_the_wrong_bytes() -> None:
    """"Any shape": a split of the tensor itself, not its flat view, has right sums but
    uneven chunks on a (10, 80) tensor split 4 ways, so the bytes on the links are wrong."""
    results = verdicts("7.2", wrong.hier_split_rows)
    assert results["sums and means in place on 2 nodes x 4"][0] == "passed"
    status, message = results[
        "traffic: 2(G-1)/G S inside the node, 2(M-1)/(GM) S across, on its own rail"]
    assert status == "failed" and "shape (10, 80): are the chunks cut from its flat view" in message


def test_a_flat_ring_with_wrong_values_is_named_a_flat_ring() -> None:
    def flat_ring_no_mean(comm, tensor, per_node, op="sum") -> None:  # noqa: ANN001
        wrong.hier_flat_ring(comm, tensor, per_node, "sum")  # forgets the mean

    status, message = verdicts("7.2", flat_ring_no_mean)["sums and means in place on 2 nodes x 4"]
    assert status == "failed" and "a ring over all the ranks" in message
    assert "rail's group?" not in message


def test_a_missing_value_error_names_what_was_raised_instead() -> None:
    def divides_blindly(world_size: int, per_node: int) -> dict:
        nodes = world_size // per_node  # (4, 0): ZeroDivisionError
        return {"node": [list(range(n * per_node, (n + 1) * per_node)) for n in range(nodes)],
                "rail": []}

    name = "ValueError: sizes below 1, or per_node not dividing world_size"
    case = next(c for c in cases_for("7.1") if c.name == name)
    with pytest.raises(Exception, match=r"must raise ValueError.*\(4, 0\) raised "
                                        r"ZeroDivisionError"):
        case.run(divides_blindly)


def test_an_all_reduce_on_a_clone_is_told_the_callers_tensor_is_unchanged() -> None:
    from tests.mutants import failures

    failed = failures("7.2", wrong.hier_on_a_clone, only="sums and means")
    (message,) = failed.values()
    assert "rank 0's tensor is unchanged: the all-reduce works in place" in message, message


def test_a_collective_method_the_communicator_lacks_is_explained() -> None:
    """``comm.all_reduce`` raises AttributeError in a rank: the report says that a
    communicator has no collectives, and why."""
    from mpgpu_edu.grading._outcome import classify

    case = cases_for("7.2")[0]
    with pytest.raises(BaseException) as raised:
        case.run(wrong.hier_calls_comm_all_reduce)
    status, message = classify(raised.value, 5.0, 2**30, "ex07.py", "ex07.py")
    assert status == "error" and "has no attribute 'all_reduce'" in message
    assert "it has no collectives" in message, message
