"""Checks of exercise 6.4, the straggler found from per-rank logs: against
``cd.find_straggler_reference`` on logs the grader generates itself (other world sizes,
other slow ranks), naming the mistake of picking the rank that waited longest."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpgpu_edu.grading.checks import Case
from mpgpu_edu.grading.checks._plain import type_name
from mpgpu_edu.grading.checks._support import each, examples, expect
from mpgpu_edu.lessons import choosing_and_debugging as cd

Impl = Callable[..., Any]


def _straggler_logs(world_size: int, slow_rank: int, steps: int,
                    slowdown: list[float]) -> list[list[str]]:
    return cd.run_straggler(world_size, slow_rank, steps, tuple(slowdown)).logs


def _run_find(impl: Impl, world_size: int, slow_rank: int, steps: int,
              slowdown: list[float]) -> Any:
    logs = _straggler_logs(world_size, slow_rank, steps, slowdown)
    return impl([list(lines) for lines in logs])


def _judge_find(got: Any, world_size: int, slow_rank: int, steps: int,
                slowdown: list[float]) -> None:
    logs = _straggler_logs(world_size, slow_rank, steps, slowdown)
    rank, seconds = cd.find_straggler_reference(logs)
    where = (f"{world_size} ranks, {steps} step(s), rank {slow_rank} slowed "
             f"{'x'.join(f'{s:g}' for s in slowdown)}")
    expect(isinstance(got, list) and len(got) == 2,
           f"{where}: expected (rank, seconds), got {type_name(got)}"
           + (f" of length {len(got)}" if isinstance(got, list) else ""))
    got_rank, got_seconds = got
    expect(type(got_rank) is int, f"{where}: the rank should be an int, got {type_name(got_rank)}")
    if got_rank != rank and got_rank == cd.longest_waiter(logs):
        expect(False, f"{where}: you named rank {got_rank}, the rank that waited longest in the "
                      f"all-reduces; the straggler is rank {rank}")
    expect(got_rank == rank, f"{where}: you named rank {got_rank}, the straggler is rank {rank}")
    expect(type(got_seconds) in (int, float),
           f"{where}: seconds should be a number, got {type_name(got_seconds)}")
    expect(abs(got_seconds - seconds) <= 1e-6 + 1e-6 * abs(seconds),
           f"{where}: rank {rank} is right, but it computed {seconds * 1e3:.4f} ms longer "
           f"than the median rank over the run, not {got_seconds * 1e3:.4f} ms")


def _find_case(name: str, points: int, cases: list[dict[str, Any]],
               hidden: bool = False) -> Case:
    return Case(name, points, *each(cases, _run_find, _judge_find), hidden=hidden)


def _straggler(world_size: int, slow_rank: int, steps: int = 3,
               slowdown: tuple[float, ...] = (3.0,)) -> dict[str, Any]:
    return {"world_size": world_size, "slow_rank": slow_rank, "steps": steps,
            "slowdown": list(slowdown)}


def _random_stragglers() -> list[dict[str, Any]]:
    out = []
    for e in examples(8, seed=64, n=(3, 7), slow=(0, 6), steps=(2, 4), a=(15, 40), b=(11, 40)):
        out.append(_straggler(e["n"], e["slow"] % e["n"], e["steps"],
                              (e["a"] / 10, e["b"] / 10)))
    return out
