"""Checks of exercises 4.2 (GPipe) and 4.3 (1F1B): step orders, read as ``[stage,
microbatch, op, chunk]`` rows (``_support.step_rows``; the chunk is not used here), against
the package's ``gpipe`` and ``one_f_one_b``: valid, in the reference's order, as fast, and
holding no more microbatches than the schedule allows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpgpu_edu.grading.checks import CheckFailure, Evidence
from mpgpu_edu.grading.checks._support import (compute_examples, examples, expect, judge_examples,
                                               step_rows)
from mpgpu_edu.pipeline import (Schedule, ScheduleError, Step, from_order, makespan_ticks,
                                peak_activations, render, steps_of, validate)

Impl = Callable[..., Any]


def _compute_orders(impl: Impl, sizes: list[tuple[int, int]]) -> list[dict]:
    return [{"p": p, "m": m, "orders": step_rows(impl(p, m))} for p, m in sizes]


def _schedule(data: dict, name: str, function: str) -> Schedule:
    p, m, rows = data["p"], data["m"], data["orders"]
    call = f"{function}({p}, {m})"
    expect(isinstance(rows, list) and len(rows) == p,
           f"{call} should return one list of Steps per device ({p} lists, device p's steps "
           "all on stage p), got "
           + (f"{len(rows)} lists" if isinstance(rows, list) else f"{rows!r:.80}")
           + " (are n_stages and n_microbatches swapped?)" * (isinstance(rows, list)
                                                               and len(rows) == m != p))
    for device, row in enumerate(rows):
        for item in row:
            expect(isinstance(item, list), f"{call}: device {device}'s order holds {item}, "
                                           "not a Step")
    orders = [[Step(s, mb, op) for s, mb, op, _chunk in row] for row in rows]
    try:
        schedule = from_order(name, orders, m)
        validate(schedule)
    except ScheduleError as exc:
        raise CheckFailure(f"{call} is not a valid schedule: {exc}") from None
    return schedule


def _valid_judge(name: str, function: str) -> Callable[[list[dict]], Evidence]:
    def judge(records: list[dict]) -> Evidence:
        return Evidence(text="\n\n".join(render(_schedule(r, name, function)) for r in records))
    return judge


def _same_judge(reference: Callable[[int, int], Schedule], name: str, function: str
                ) -> Callable[[list[dict]], None]:
    def judge(records: list[dict]) -> None:
        for r in records:
            got, want = _schedule(r, name, function), reference(r["p"], r["m"])
            if [steps_of(got, d) for d in range(r["p"])] != [steps_of(want, d)
                                                             for d in range(r["p"])]:
                raise CheckFailure(f"{r['p']} stages, {r['m']} microbatches: the step order "
                                   f"differs from {want.name}'s\nyours:\n{render(got)}\n\n"
                                   f"expected:\n{render(want)}")
    return judge


MAKESPAN_SIZES = [(2, 3), (4, 4), (4, 8), (3, 1)]


def _makespan_judge(name: str, function: str) -> Callable[[list[dict]], None]:
    def judge(records: list[dict]) -> None:
        for r in records:
            p, m = r["p"], r["m"]
            ticks = makespan_ticks(_schedule(r, name, function))
            expect(ticks == 2 * (m + p - 1), f"{p} stages, {m} microbatches: your schedule "
                                             f"takes {ticks} ticks, expected 2(M+P-1) = "
                                             f"{2 * (m + p - 1)}")
    return judge


def _gpipe_ticks_memory(records: list[dict]) -> None:
    _makespan_judge("gpipe", "gpipe_orders")(records[:len(MAKESPAN_SIZES)])
    for r in records[len(MAKESPAN_SIZES):]:
        peaks = peak_activations(_schedule(r, "gpipe", "gpipe_orders"))
        expect(peaks[0] == r["m"], f"GPipe's stage 0 holds all M = {r['m']} microbatches "
                                   f"before its first backward; yours peaks at {peaks[0]}")


def _one_f_one_b_memory(records: list[dict]) -> None:
    for r in records:
        p, m = r["p"], r["m"]
        schedule = _schedule(r, "1f1b", "one_f_one_b_orders")
        peaks, bounds = peak_activations(schedule), [min(p - s, m) for s in range(p)]
        expect(all(a <= b for a, b in zip(peaks, bounds)),
               f"{p} stages, {m} microbatches: stages hold {peaks} microbatches' activations "
               f"at most; 1F1B holds at most min(P-p, M) = {bounds}\n{render(schedule)}")


def _hidden_orders(impl: Impl) -> list[dict]:
    return compute_examples(lambda p, m: step_rows(impl(p, m)),
                            examples(30, seed=43, p=(1, 6), m=(1, 9)))


def _hidden_orders_judge(reference: Callable[[int, int], Schedule], name: str,
                         function: str) -> Callable[[list[dict]], None]:
    same = _same_judge(reference, name, function)

    def one(out: Any, p: int, m: int) -> None:
        same([{"p": p, "m": m, "orders": out}])
    return lambda records: judge_examples(records, one)


def _orders_case(sizes: list[tuple[int, int]]) -> Callable[[Impl], list[dict]]:
    return lambda impl: _compute_orders(impl, sizes)
