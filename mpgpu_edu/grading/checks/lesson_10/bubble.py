"""Exercise 10.1, interleaved 1F1B's bubble in closed form: both halves. The reference is the
simulated schedule, ``pipeline.interleaved_1f1b``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpgpu_edu.grading.checks._support import (compute_examples, examples, expect, judge_examples,
                                               refusal)

Impl = Callable[..., Any]


def _bubbles(cases: list[tuple[int, int, int]]) -> Impl:
    def compute(impl: Impl) -> list[float]:
        return [float(impl(p, m, v)) for p, m, v in cases]
    return compute


def _bubble_judge(cases: list[tuple[int, int, int]]) -> Callable[[list], None]:
    def judge(got: list) -> None:
        from mpgpu_edu.pipeline import bubble_overhead, interleaved_1f1b

        for (p, m, v), value in zip(cases, got):
            simulated = bubble_overhead(interleaved_1f1b(p, m, v))
            expect(abs(value - simulated) < 1e-9,
                   f"P={p}, M={m}, V={v}: {value:.6g}, but the simulated schedule's bubble is "
                   f"{simulated:.6g} of its compute time")
    return judge


REFUSED = {"M=6 on P=4": (4, 6, 2), "V=0": (4, 8, 0), "P=0": (0, 4, 1)}


VALID = (4, 8, 2)


def _refusals(impl: Impl) -> dict[str, str]:
    out = {name: refusal(lambda args=args: impl(*args)) for name, args in REFUSED.items()}
    out["valid"] = refusal(lambda: impl(*VALID))
    return out


def _judge_refusals(out: dict[str, str]) -> None:
    out = dict(out)
    valid = out.pop("valid", "returned")
    expect(valid == "returned", "interleaved_bubble_overhead({}, {}, {}) raised {}: these "
                                "sizes are valid (a refusal earns its point only beside "
                                "answers)".format(*VALID, valid))
    for name, what in out.items():
        args = "interleaved_bubble_overhead({}, {}, {})".format(*REFUSED[name])
        expect(what != "returned", f"{args} ({name}) returned a number: it should raise "
                                   "ValueError, the schedule cannot run these sizes")
        expect(what == "ValueError", f"{args} ({name}) raised {what}; it should raise "
                                     "ValueError, the schedule cannot run these sizes")


BUBBLE_EXAMPLES = examples(8, seed=82, p=(2, 8), rounds=(1, 6), v=(1, 4))


def _bubble_hidden(impl: Impl) -> list[dict]:
    return compute_examples(lambda p, rounds, v: float(impl(p, p * rounds, v)),
                            BUBBLE_EXAMPLES)


def _judge_bubble_hidden(records: list[dict]) -> None:
    def one(out: float, p: int, rounds: int, v: int) -> None:
        _bubble_judge([(p, p * rounds, v)])([out])
    judge_examples(records, one)
