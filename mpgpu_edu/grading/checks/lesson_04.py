"""Checks of lesson 04: partition, GPipe and 1F1B schedules, the executor's forward step.

Schedules are checked as values (``from_order``, ``validate``, ``makespan_ticks``,
``peak_activations``) against the package's ``gpipe`` and ``one_f_one_b``; the forward step
runs a real pipeline on the simulator against the whole model on one device.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mpgpu_edu.grading.checks import Case, CheckFailure, Evidence
from mpgpu_edu.grading.checks._support import (bytes_of, expect, expect_close, property_check,
                                               run_spmd, uniform)
from mpgpu_edu.pipeline import (LayerCost, Schedule, ScheduleError, Step, from_order, gpipe,
                                makespan_ticks, one_f_one_b, partition_balanced,
                                peak_activations, render, steps_of, validate)

Impl = Callable[..., Any]


# ---- 4.1 partition ------------------------------------------------------------------------------

def _stage_costs(costs: list[int], boundaries: list[int]) -> list[int]:
    edges = [0, *boundaries, len(costs)]
    return [sum(costs[a:b]) for a, b in zip(edges, edges[1:])]


def _optimal_max(costs: list[int], n_stages: int) -> int:
    layers = [LayerCost(f"l{i}", n_params=c, flops=0) for i, c in enumerate(costs)]
    return max(stage.n_params for stage in partition_balanced(layers, n_stages).stages)


def _partition_agrees(impl: Impl, costs: list[int], n_stages: int) -> None:
    given = list(costs)
    got = impl(given, n_stages)
    call = f"balanced_boundaries({costs}, {n_stages})"
    expect(given == costs, f"{call} changed its input to {given}")
    expect(isinstance(got, list) and len(got) == n_stages - 1,
           f"{call} returned {got!r}; expected a list of {n_stages - 1} boundaries")
    expect(all(isinstance(b, int) for b in got) and all(0 < b < len(costs) for b in got)
           and all(a < b for a, b in zip(got, got[1:])),
           f"{call} returned {got}: boundaries increase strictly and lie in "
           f"1..{len(costs) - 1}, so every stage holds at least one layer")
    best = _optimal_max(costs, n_stages)
    mine = max(_stage_costs(costs, got))
    expect(mine == best, f"{call} returned {got}: stage costs {_stage_costs(costs, got)}, "
                         f"largest {mine}; the best split has largest stage {best}")


def _partition_cases(examples: list[tuple[list[int], int]]) -> Callable[[Impl], None]:
    def run(impl: Impl) -> None:
        for costs, n_stages in examples:
            _partition_agrees(impl, costs, n_stages)
    return run


def _partition_bad(impl: Impl) -> None:
    for costs, n_stages in [([1, 2, 3], 4), ([1, 2], 0)]:
        try:
            got = impl(list(costs), n_stages)
        except ValueError:
            continue
        raise CheckFailure(f"balanced_boundaries({costs}, {n_stages}) returned {got}; it "
                           "should raise ValueError (each stage needs at least one layer)")


def _partition_property(impl: Impl) -> None:
    from hypothesis import strategies as st

    def body(costs: list[int], n_stages: int) -> None:
        _partition_agrees(impl, costs, min(n_stages, len(costs)))

    property_check(body, max_examples=40, costs=st.lists(st.integers(0, 20), min_size=1,
                                                         max_size=9),
                   n_stages=st.integers(1, 5))


# ---- 4.2 / 4.3 schedules ----------------------------------------------------------------------

def _schedule(impl: Impl, name: str, n_stages: int, n_microbatches: int) -> Schedule:
    got = impl(n_stages, n_microbatches)
    call = f"{impl.__name__}({n_stages}, {n_microbatches})"
    if isinstance(got, Schedule):
        got = [steps_of(got, d) for d in range(got.n_stages)]
    expect(isinstance(got, (list, tuple)) and len(got) == n_stages
           and all(isinstance(row, (list, tuple)) for row in got),
           f"{call} should return one list of Steps per device ({n_stages} lists)")
    for device, row in enumerate(got):
        for step in row:
            expect(isinstance(step, Step), f"{call}: device {device}'s order holds "
                                           f"{step!r}, not a Step")
    try:
        schedule = from_order(name, got, n_microbatches)
        validate(schedule)
    except ScheduleError as exc:
        raise CheckFailure(f"{call} is not a valid schedule: {exc}") from None
    return schedule


def _same_as(reference: Callable[[int, int], Schedule], examples: list[tuple[int, int]],
             name: str) -> Callable[[Impl], Evidence | None]:
    def run(impl: Impl) -> Evidence | None:
        for p, m in examples:
            got = _schedule(impl, name, p, m)
            want = reference(p, m)
            if [steps_of(got, d) for d in range(p)] != [steps_of(want, d) for d in range(p)]:
                raise _mismatch(got, want, f"{p} stages, {m} microbatches")
        return None
    return run


def _mismatch(got: Schedule, want: Schedule, what: str) -> CheckFailure:
    text = f"yours:\n{render(got)}\n\nexpected:\n{render(want)}"
    return CheckFailure(f"{what}: the step order differs from {want.name}'s\n{text}")


def _valid(name: str, examples: list[tuple[int, int]]) -> Callable[[Impl], Evidence]:
    def run(impl: Impl) -> Evidence:
        texts = [render(_schedule(impl, name, p, m)) for p, m in examples]
        return Evidence(text="\n\n".join(texts))
    return run


def _makespan(name: str) -> Callable[[Impl], None]:
    def run(impl: Impl) -> None:
        for p, m in [(2, 3), (4, 4), (4, 8), (3, 1)]:
            ticks = makespan_ticks(_schedule(impl, name, p, m))
            expect(ticks == 2 * (m + p - 1), f"{p} stages, {m} microbatches: your schedule "
                                             f"takes {ticks} ticks, expected 2(M+P-1) = "
                                             f"{2 * (m + p - 1)}")
    return run


def _gpipe_memory(impl: Impl) -> None:
    for p, m in [(4, 6), (2, 3)]:
        peaks = peak_activations(_schedule(impl, "gpipe", p, m))
        expect(peaks[0] == m, f"GPipe's stage 0 holds all M = {m} microbatches before its "
                              f"first backward; yours peaks at {peaks[0]}")


def _one_f_one_b_memory(impl: Impl) -> None:
    for p, m in [(4, 8), (4, 2), (3, 5), (5, 12)]:
        schedule = _schedule(impl, "1f1b", p, m)
        peaks = peak_activations(schedule)
        bounds = [min(p - s, m) for s in range(p)]
        expect(all(a <= b for a, b in zip(peaks, bounds)),
               f"{p} stages, {m} microbatches: stages hold {peaks} microbatches' activations "
               f"at most; 1F1B holds at most min(P-p, M) = {bounds}\n{render(schedule)}")


def _schedule_property(name: str, reference: Callable[[int, int], Schedule]
                       ) -> Callable[[Impl], None]:
    def run(impl: Impl) -> None:
        from hypothesis import strategies as st

        def body(n_stages: int, n_microbatches: int) -> None:
            got = _schedule(impl, name, n_stages, n_microbatches)
            want = reference(n_stages, n_microbatches)
            expect([steps_of(got, d) for d in range(n_stages)]
                   == [steps_of(want, d) for d in range(n_stages)],
                   f"the step order differs from {want.name}'s:\nyours:\n{render(got)}\n"
                   f"expected:\n{render(want)}")

        property_check(body, max_examples=30, n_stages=st.integers(1, 6),
                       n_microbatches=st.integers(1, 9))
    return run


# ---- 4.4 the executor's forward step ------------------------------------------------------

WIDTH, ROWS = 8, 4


def _stages(n_stages: int) -> list[nn.Module]:
    torch.manual_seed(4)
    return [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(n_stages)]


def _run_forward(impl: Impl, n_stages: int, n_microbatches: int) -> tuple[Any, torch.Tensor]:
    stages = _stages(n_stages)
    batch = torch.randn(n_microbatches * ROWS, WIDTH, generator=torch.Generator().manual_seed(5))
    microbatches = torch.tensor_split(batch, n_microbatches)
    schedule = gpipe(n_stages, n_microbatches)

    def program(comm: Any) -> list[Any]:
        stage = copy.deepcopy(stages[comm.rank])
        outputs = []
        for step in steps_of(schedule, comm.rank):
            if step.op == "F":
                x = microbatches[step.microbatch] if comm.rank == 0 else None
                outputs.append(impl(comm, stage, step, n_stages, x, (ROWS, WIDTH)))
        return outputs

    result = run_spmd(program, uniform(n_stages))
    with torch.no_grad():
        want = nn.Sequential(*stages)(batch)
    last = result.results[-1]
    expect(isinstance(last, list) and all(isinstance(y, torch.Tensor) for y in last),
           "pipeline_forward_step should return the stage's output tensor")
    expect_close(torch.cat([y.detach() for y in last]), want,
                 f"{n_stages} stages, {n_microbatches} microbatches: the last stage's outputs "
                 "against the whole model on one device")
    return result, want


def _forward_values(impl: Impl) -> None:
    _run_forward(impl, 3, 4)
    _run_forward(impl, 1, 2)


def _forward_traffic(impl: Impl) -> None:
    p, m = 3, 4
    result, _ = _run_forward(impl, p, m)
    size = bytes_of(ROWS * WIDTH)
    for rank, stats in enumerate(result.stats):
        want = {rank + 1: m * size} if rank < p - 1 else {}
        expect(dict(stats.sent_to) == want and stats.messages_sent == len(want) * m,
               f"rank {rank} sent {dict(stats.sent_to)} (bytes per peer) in "
               f"{stats.messages_sent} messages; expected {want}: one activation per "
               "microbatch, to the next stage only")


def _forward_timed(impl: Impl) -> None:
    p, m = 2, 3
    result, _ = _run_forward(impl, p, m)
    for rank in range(p):
        forwards = [e for e in result.trace.on(rank, "compute") if e.kind == "forward"]
        expect(len(forwards) == m, f"rank {rank} has {len(forwards)} forward compute events "
                                   f"on the timeline, expected {m}: run the stage inside "
                                   "comm.compute('forward', ...)")
        outputs = result.results[rank]
        expect(all(y.grad_fn is not None for y in outputs),
               f"rank {rank}'s outputs are detached from the autograd graph: return the "
               "stage's output itself (send a detached copy)")


CASES: dict[str, list[Case]] = {
    "4.1": [
        Case("the docstring's example", 1, _partition_cases([([3, 1, 1, 1, 2], 2)])),
        Case("the best split, uneven layers", 2,
             _partition_cases([([5, 1, 1, 1, 1, 1], 2), ([1, 2, 3, 4, 5, 6, 7, 8, 9], 3),
                               ([4, 4, 4], 3), ([7, 2], 1), ([0, 0, 9, 0], 2)])),
        Case("too many or too few stages raise ValueError", 1, _partition_bad),
        Case("hidden: random costs", 1, _partition_property, hidden=True),
    ],
    "4.2": [
        Case("a valid schedule", 1, _valid("gpipe", [(2, 2), (4, 3)])),
        Case("the GPipe order", 1, _same_as(gpipe, [(3, 4), (1, 2), (4, 1)], "gpipe")),
        Case("2(M+P-1) ticks; stage 0 holds M microbatches", 1,
             lambda impl: (_makespan("gpipe")(impl), _gpipe_memory(impl))[0]),
        Case("hidden: random sizes", 1, _schedule_property("gpipe", gpipe), hidden=True),
    ],
    "4.3": [
        Case("a valid schedule", 1, _valid("1f1b", [(2, 2), (4, 6)])),
        Case("as fast as GPipe: 2(M+P-1) ticks", 1, _makespan("1f1b")),
        Case("memory: stage p holds at most min(P-p, M) microbatches", 2, _one_f_one_b_memory),
        Case("the 1F1B order", 1, _same_as(one_f_one_b, [(4, 6), (3, 2), (1, 3)], "1f1b")),
        Case("hidden: random sizes", 1, _schedule_property("1f1b", one_f_one_b), hidden=True),
    ],
    "4.4": [
        Case("matches the whole model on one device", 2, _forward_values),
        Case("traffic: one activation per microbatch, to the next stage", 2, _forward_traffic),
        Case("timed as forward compute; output keeps its graph", 2, _forward_timed),
    ],
}
