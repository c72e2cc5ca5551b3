"""The grader's clock (``grading.checks._clock``): a judge's bytes, messages, makespan and
timeline come from the grader's own replay of the run's record, so a submission that fakes the
simulator's numbers in its own process changes nothing the judge sees; a record that does not
add up, or data that names the grader's facts itself, is refused."""

from __future__ import annotations

import copy
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from mpgpu_edu.comm import base as comm_base
from mpgpu_edu.grading.checks import lesson_03, lesson_07
from mpgpu_edu.grading.checks._clock import MARK, RecordError, resolve
from mpgpu_edu.grading.checks._plain import plain
from mpgpu_edu.grading.checks._support import launch_facts, rank_inputs, run_spmd, uniform
from mpgpu_edu.grading.checks.lesson_03.averaging import _overlap_cluster
from mpgpu_edu.grading.checks.lesson_07.hierarchical import two_level
from tests.test_grading_checks import solution, verdicts

ROOT = Path(__file__).resolve().parents[1]


def _ring(comm: Any) -> torch.Tensor:
    tensor = rank_inputs(comm.world_size, 10)[comm.rank]
    solution("ex01_communication").ring_all_reduce(comm, tensor)
    return tensor


def _overlapped(comm: Any) -> list[torch.Tensor]:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(comm.rank))
    loss = model(x).pow(2).mean()
    with comm.compute("backward", "backward"):
        solution("ex03_data_parallel").backward_with_overlap(comm, model, loss)
    return [p.grad for p in model.parameters()]


def _hierarchical(comm: Any) -> torch.Tensor:
    tensor = rank_inputs(comm.world_size, 24)[comm.rank]
    solution("ex07_many_machines").hierarchical_all_reduce(comm, tensor, 3)
    return tensor


@pytest.mark.parametrize("program, cluster", [(_ring, lambda: uniform(4)),
                                              (_overlapped, lambda: _overlap_cluster(2)),
                                              (_hierarchical, lambda: two_level(2, 3))],
                         ids=["ring", "overlap-on-a-comm-stream", "two-level"])
def test_the_grader_times_a_run_as_the_simulator_did(program: Any, cluster: Any) -> None:
    result = run_spmd(program, cluster())
    facts = resolve(plain(launch_facts(result, with_trace=True)))
    assert facts["stats"] == [s.to_dict() for s in result.stats]
    assert facts["makespan"] == result.trace.makespan > 0
    assert facts["trace"] == result.trace.to_dict()
    for got, want in zip(facts["results"], result.results):
        assert torch.equal(torch.as_tensor(got[0] if isinstance(got, list) else got),
                           torch.as_tensor(want[0] if isinstance(want, list) else want))


NAIVE_DRESSED_AS_RING = textwrap.dedent('''
    import torch

    from mpgpu_edu.comm import base as _base


    def ring_all_reduce(comm, tensor):
        """A naive all-reduce (everything through rank 0) that makes the simulator's own
        stats say it was a ring: each rank's CommStats reports a ring's bytes, messages and
        neighbour."""
        n, r = comm.world_size, comm.rank
        ring = 2 * (n - 1) * tensor.numel() * tensor.element_size() // n

        def ring_numbers(stats, n=n):
            return {"bytes_sent": ring, "bytes_received": ring,
                    "messages_sent": 2 * (n - 1), "messages_received": 2 * (n - 1),
                    "sent_to": {(stats.rank + 1) % n: ring},
                    "received_from": {(stats.rank - 1) % n: ring}}
        comm.stats.rank = r
        _base.CommStats.to_dict = ring_numbers
        if r == 0:
            part = torch.empty_like(tensor)
            for src in range(1, n):
                comm.recv(part, src)
                tensor.add_(part)
            for dst in range(1, n):
                comm.send(tensor, dst)
        else:
            comm.send(tensor, 0)
            comm.recv(tensor, 0)
''')
TRAFFIC = "traffic: 2(N-1)/N of the tensor, to the right neighbour"


def test_stats_faked_in_the_submissions_process_do_not_reach_the_judge(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(comm_base.CommStats, "to_dict", comm_base.CommStats.to_dict)
    namespace: dict[str, Any] = {}
    exec(NAIVE_DRESSED_AS_RING, namespace)  # noqa: S102 - the test's own cheat
    cheat = namespace["ring_all_reduce"]
    inputs = rank_inputs(4, 1000)

    def program(comm: Any) -> torch.Tensor:
        tensor = inputs[comm.rank].clone()
        cheat(comm, tensor)
        return tensor

    result = run_spmd(program, 4)
    faked = [s.to_dict() for s in result.stats]
    assert faked[0]["sent_to"] == {1: 6000}  # the simulator's own numbers now lie
    graders = resolve(plain(launch_facts(result)))["stats"]
    assert graders[0]["sent_to"] == {1: 4000, 2: 4000, 3: 4000}
    assert graders[1]["sent_to"] == {0: 4000}
    status, message = verdicts("1.3", cheat)[TRAFFIC]
    assert status == "failed" and "rank 0" in message, message


def test_a_checker_child_that_fakes_the_simulators_numbers_is_judged_on_the_grader_s(
        tmp_path: Path) -> None:
    """End to end: the learner's code runs in the checker's child, the grader judges."""
    from mpgpu_edu.grading.runner import run_exercise

    source = (ROOT / "exercises" / "ex01_communication.py").read_text()
    learner = tmp_path / "ex01_communication.py"
    # the patch wrapped so that it does not look like the learner's code in the package's
    # class (which the child's own watch would name first: the next test)
    hidden = NAIVE_DRESSED_AS_RING.replace(
        "_base.CommStats.to_dict = ring_numbers",
        "import functools\n    _base.CommStats.to_dict = functools.partialmethod(ring_numbers)")
    assert hidden != NAIVE_DRESSED_AS_RING
    learner.write_text(source + "\n" + hidden)
    result = run_exercise("1.3", learner, judge_here=True)
    by_name = {case.name: case for case in result.cases}
    assert by_name[TRAFFIC].status == "failed" and "rank 0" in by_name[TRAFFIC].message
    assert by_name["sums in place on 4 ranks"].status == "passed"


def test_a_child_that_patches_the_packages_class_with_its_own_code_is_told_so(
        tmp_path: Path) -> None:
    from mpgpu_edu.grading.runner import run_exercise

    source = (ROOT / "exercises" / "ex01_communication.py").read_text()
    learner = tmp_path / "ex01_communication.py"
    learner.write_text(source + "\n" + NAIVE_DRESSED_AS_RING)
    result = run_exercise("1.3", learner, judge_here=True)
    assert result.points == 0
    assert all(case.status == "failed" for case in result.cases)
    assert "changed the package's own mpgpu_edu.comm.base.CommStats" in result.cases[0].message


def _record() -> dict:
    return plain(launch_facts(run_spmd(_ring, uniform(3)), with_trace=True))


def _ops(record: dict, rank: int) -> list:
    return next(row[2] for row in record[MARK]["ops"] if row[0] == rank and row[1] == 0)


def _drop_first(record: dict, kind: str, rank: int) -> dict:
    ops = _ops(record, rank)
    ops.remove(next(op for op in ops if op[0] == "post" and op[1] == kind))
    return record


@pytest.mark.parametrize("tamper, words", [
    (lambda r: dict(r, stats=[]), "names 'stats' itself"),
    (lambda r: [{"makespan": 0.0}], "names 'makespan' itself"),
    (lambda r: dict(r, **{MARK: dict(r[MARK], recipe=["os:system", ["true"], {}])}),
     "not from a check"),
    (lambda r: dict(r, **{MARK: dict(r[MARK], recipe=[
        "mpgpu_edu.grading.checks._support:run_spmd", [], {}])}), "not a check's cluster"),
    (lambda r: dict(r, **{MARK: dict(r[MARK], recipe=[
        "mpgpu_edu.grading.checks._support:uniform", [4], {}])}), "3 ranks on a cluster of 4"),
    (lambda r: _drop_first(r, "recv", 1), "does not add up"),
    (lambda r: _drop_first(r, "send", 0), "does not add up"),
    (lambda r: _set_post(r, 0, 7, 123), "sizes differ"),
    (lambda r: _set_post(r, 0, 7, -4), "could post"),
    (lambda r: _set_post(r, 0, 2, 1), "could post"),
    (lambda r: _set_post(r, 0, 7, 4.0), "wrong types"),
    (lambda r: _set_compute(r, float("nan")), "negative or endless"),
    (lambda r: dict(r, **{MARK: dict(r[MARK], world_size=0)}), "no valid world size"),
    (lambda r: _append(r, ["wait", 10**9]), "does not add up"),
    (lambda r: _append(r, ["shell", "rm"]), "unknown operation"),
], ids=["stats", "makespan", "foreign-recipe", "not-a-builder", "wrong-cluster-size",
        "send-without-recv", "recv-without-send", "sizes-differ", "negative-bytes",
        "posted-for-another-rank", "float-bytes", "nan-seconds", "no-world-size",
        "wait-on-nothing", "unknown-op"])
def test_a_record_that_does_not_add_up_is_refused(tamper: Any, words: str) -> None:
    with pytest.raises(RecordError, match=words):
        resolve(tamper(copy.deepcopy(_record())))


def _set_post(record: dict, rank: int, position: int, value: Any) -> dict:
    """Set field ``position`` of the rank's first send (``["post", op, src, dst, tag, lane,
    seq, nbytes, blocking, handle]``)."""
    ops = _ops(record, rank)
    post = next(op for op in ops if op[0] == "post" and op[1] == "send")
    post[position] = value
    return record


def _set_compute(record: dict, seconds: float) -> dict:
    _ops(record, 0).insert(0, ["compute", seconds, "compute", "x", 0.0])
    return record


def _append(record: dict, op: list) -> dict:
    _ops(record, 0).append(op)
    return record


def test_every_check_that_times_a_run_builds_its_cluster_from_a_recipe() -> None:
    """The checks of lessons 03 and 07 (overlap timelines, time against a closed form) pass on
    the solutions with the grader's replay: their clusters carry recipes."""
    for exercise, module, function in (("3.3", "ex03_data_parallel", "backward_with_overlap"),
                                       ("7.2", "ex07_many_machines", "hierarchical_all_reduce")):
        impl = getattr(solution(module), function)
        assert all(status == "passed" for status, _ in verdicts(exercise, impl).values())
    assert lesson_03 and lesson_07


def test_the_grader_counts_works_left_unwaited() -> None:
    """``works``: isend/irecv works per rank and those never waited on, from the record."""
    def program(comm: Any) -> None:
        data = torch.ones(4)
        if comm.rank == 0:
            comm.isend(data, 1)  # never waited on
            comm.isend(data, 1).wait()
        else:
            comm.recv(data, 0)
            work = comm.irecv(data, 0)
            comm.wait_any([work])

    result = run_spmd(program, 2)
    works = resolve(plain(launch_facts(result)))["works"]
    assert works[0] == {"isend": 2, "irecv": 0, "isend_unwaited": 1, "irecv_unwaited": 0}
    assert works[1] == {"isend": 0, "irecv": 1, "isend_unwaited": 0, "irecv_unwaited": 0}


def test_the_grader_lists_every_send_with_its_tag() -> None:
    """``sends``: each rank's messages in the order it posted them, peer, tag and bytes, from
    the record; data that brings ``sends`` itself is refused."""
    def program(comm: Any) -> None:
        if comm.rank == 0:
            works = [comm.isend(torch.ones(3), 1, tag=5), comm.isend(torch.ones(2), 1, tag=2)]
            for work in works:
                work.wait()
        else:
            small, big = torch.empty(2), torch.empty(3)
            comm.recv(small, 0, tag=2)  # received in another order than sent
            comm.recv(big, 0, tag=5)

    facts = resolve(plain(launch_facts(run_spmd(program, 2))))
    assert facts["sends"] == [[[1, 5, 12], [1, 2, 8]], []]
    with pytest.raises(RecordError, match="'sends'"):
        resolve({"sends": [[[1, 0, 4]]]})
