"""Exercise 10.2, the interleaved 1F1B schedule as step orders: both halves.

*compute* reads the learner's orders as plain ``[stage, microbatch, op, chunk]`` rows (or the
type name of anything that is not a Step), and what each refused size did. *judge* rebuilds
the schedule in the grader (``pipeline.from_order`` with V chunks) and holds it to what
interleaving promises: valid (every step once, on its device, after what it needs), a bubble of
(P-1)/(V M) of the compute time with a chunk step 1/V of a stage's (``timed_bubble_overhead``,
free sends), no device holding more microbatch-chunks than the package's
``interleaved_1f1b``, and with V = 1 exactly lesson 04's 1F1B."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpgpu_edu.grading.checks import CheckFailure, Evidence
from mpgpu_edu.grading.checks._support import (compute_examples, examples, expect, judge_examples,
                                               refusal, step_rows)
from mpgpu_edu.pipeline import (Schedule, ScheduleError, Step, from_order, interleaved_1f1b,
                                one_f_one_b, peak_activations, render, steps_of, validate)
from mpgpu_edu.pipeline.timing import timed_bubble_overhead

Impl = Callable[..., Any]
Sizes = tuple[int, int, int]


def _orders(sizes: list[Sizes]) -> Impl:
    def compute(impl: Impl) -> list[dict]:
        return [{"sizes": [p, m, v], "orders": step_rows(impl(p, m, v))} for p, m, v in sizes]
    return compute


def _schedule(record: dict) -> Schedule:
    p, m, v = record["sizes"]
    rows, call = record["orders"], f"interleaved_orders({p}, {m}, {v})"
    expect(isinstance(rows, list) and len(rows) == p,
           f"{call} should return one list of Steps per device ({p} lists), got {rows!r:.80}")
    for device, row in enumerate(rows):
        for item in row:
            expect(isinstance(item, list), f"{call}: device {device}'s order holds {item}, "
                                           "not a Step")
        for op, name in (("F", "forwards"), ("B", "backwards")):
            count = sum(1 for item in row if item[2] == op)
            expect(count == m * v,
                   f"{call}: device {device} runs {count} {name}; it needs M x V = {m * v}, "
                   "one per microbatch and chunk (is the warm-up capped at M x V, and does the "
                   "drain take the last w backwards?)")
    orders = [[Step(s, mb, op, c) for s, mb, op, c in row] for row in rows]
    try:
        schedule = from_order("yours", orders, m, v)
        validate(schedule)
    except ScheduleError as exc:
        raise CheckFailure(f"{call} is not a valid schedule: {exc}\n{_rules_and_orders(orders)}"
                           ) from None
    return schedule


def _rules_and_orders(orders: list[list[Step]]) -> str:
    """The learner's orders, token by token as the lesson prints the package's (cell after
    section 4's heading), and the three rules to hold them against."""
    lines = ["Check it against the three rules: 1. the order of the work (rounds of P "
             "microbatches, chunk by chunk; backwards chunk V-1 first), 2. the warm-up, 3. one "
             "forward, one backward after it. Your orders:"]
    lines += [f"device {device}: " + " ".join(step.token for step in order)
              for device, order in enumerate(orders)]
    return "\n".join(lines)


def _judge_valid(records: list[dict]) -> Evidence:
    return Evidence(text="\n\n".join(render(_schedule(r)) for r in records))


def _judge_bubble(records: list[dict]) -> None:
    for r in records:
        p, m, v = r["sizes"]
        schedule = _schedule(r)
        got = timed_bubble_overhead(schedule, 1 / v, 2 / v)
        want = (p - 1) / (v * m)
        expect(abs(got - want) < 1e-9,
               f"P={p}, M={m}, V={v}: your schedule idles {got:.2%} of its compute time "
               f"(a chunk step 1/V of a stage's, backward twice forward); interleaved 1F1B "
               f"idles (P-1)/(V M) = {want:.2%}. Check the order of the work (rounds of P "
               f"microbatches, chunk by chunk) and the warm-up\nyours:\n{render(schedule)}")


def _judge_memory(records: list[dict]) -> None:
    for r in records:
        p, m, v = r["sizes"]
        schedule = _schedule(r)
        got, bound = peak_activations(schedule), peak_activations(interleaved_1f1b(p, m, v))
        warmup = "P-1-p" if v == 1 else "2(P-1-p) + (V-1)P"
        expect(all(a <= b for a, b in zip(got, bound)),
               f"P={p}, M={m}, V={v}: your devices hold {got} microbatch-chunks' activations "
               f"at most; interleaved 1F1B's warm-up ({warmup} forwards, at most M x V) "
               f"holds {bound}. A longer warm-up keeps more activations for no gain\n"
               f"yours:\n{render(schedule)}")


def _judge_warmup(records: list[dict]) -> None:
    """Rule 2: each device runs its warm-up's w forwards, then one more before its first
    backward (the steady state starts with a forward), w + 1 in all, at most M x V."""
    for r in records:
        p_, m, v = r["sizes"]
        schedule = _schedule(r)
        for p in range(p_):
            ops = [step.op for step in steps_of(schedule, p)]
            before = ops.index("B") if "B" in ops else len(ops)
            w = min(p_ - 1 - p, m) if v == 1 else min(2 * (p_ - 1 - p) + (v - 1) * p_, m * v)
            want = min(w + 1, m * v)
            rule = ("min(P-1-p, M)" if v == 1 else "min(2(P-1-p) + (V-1)P, M x V)")
            expect(before == want,
                   f"P={p_}, M={m}, V={v}: device {p} runs {before} forwards before its first "
                   f"backward; rule 2's warm-up is w = {rule} = {w}, then the steady state "
                   f"starts with one more forward: {want}. (The 2 in 2(P-1-p): a "
                   "microbatch-chunk that leaves device p still passes the devices after it and "
                   "comes back before p can run its backward.)\nyours:\n" + render(schedule))


def _judge_memory_and_warmup(records: list[dict]) -> None:
    _judge_memory(records)
    _judge_warmup(records)


def _judge_plain_1f1b(records: list[dict]) -> None:
    for r in records:
        p, m, _ = r["sizes"]
        got, want = _schedule(r), one_f_one_b(p, m)
        if [steps_of(got, d) for d in range(p)] != [steps_of(want, d) for d in range(p)]:
            raise CheckFailure(f"P={p}, M={m}, V=1: one chunk per device is plain 1F1B (warm-up "
                               f"P-1-p), but the order differs\nyours:\n{render(got)}\n\n"
                               f"1F1B:\n{render(want)}")


REFUSED = {"M=6 on P=4": (4, 6, 2), "V=0": (4, 8, 0), "P=0": (0, 4, 1), "M=0": (2, 0, 2)}


VALID: Sizes = (4, 8, 2)


def _refusals(impl: Impl) -> dict[str, str]:
    out = {name: refusal(lambda args=args: impl(*args)) for name, args in REFUSED.items()}
    out["valid"] = refusal(lambda: impl(*VALID))
    return out


def _judge_refusals(out: dict[str, str]) -> None:
    out = dict(out)
    valid = out.pop("valid", "returned")
    expect(valid == "returned", "interleaved_orders({}, {}, {}) raised {}: these sizes are "
                                "valid (a refusal earns its point only beside answers)"
                                .format(*VALID, valid))
    for name, what in out.items():
        call = "interleaved_orders({}, {}, {})".format(*REFUSED[name])
        expect(what == "ValueError",
               f"{call} ({name}) {'returned' if what == 'returned' else 'raised ' + what}; it "
               "should raise ValueError: the schedule cannot run these sizes")


HIDDEN = examples(10, seed=102, p=(2, 6), rounds=(1, 3), v=(1, 4))


def _hidden(impl: Impl) -> list[dict]:
    return compute_examples(lambda p, rounds, v: step_rows(impl(p, p * rounds, v)), HIDDEN)


def _judge_hidden(records: list[dict]) -> None:
    def one(out: Any, p: int, rounds: int, v: int) -> None:
        record = [{"sizes": [p, p * rounds, v], "orders": out}]
        _judge_bubble(record)
        _judge_memory_and_warmup(record)
    judge_examples(records, one)
