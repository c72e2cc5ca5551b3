"""Exercise 9.1, what a transformer layer keeps for backward: both halves. The reference is
``memory.models.layer_activation_bytes`` (Korthikanti et al. 2022)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from mpgpu_edu.grading.checks import CheckFailure
from mpgpu_edu.grading.checks._plain import type_name
from mpgpu_edu.grading.checks._support import (compute_examples, examples, expect, judge_examples,
                                               refusal)

Impl = Callable[..., Any]


MODES = ("none", "selective", "full")


def _want_bytes(seq: int, batch: int, d_model: int, n_heads: int, recompute: str) -> int:
    from mpgpu_edu.memory.models import DecoderSpec, layer_activation_bytes

    spec = DecoderSpec("check", 1, d_model, n_heads, 4 * d_model, 1)
    return layer_activation_bytes(spec, batch, seq, "mixed", "eager", recompute)


def _float_formula(s: int, b: int, h: int, a: int, value: int) -> bool:
    """Whether ``value`` is s b h (34 + 5as/h) computed in floats and then cut or rounded."""
    approx = s * b * h * (34 + 5 * a * s / h)
    return value in {int(approx), round(approx), math.floor(approx), math.ceil(approx)}


def _which_term(s: int, b: int, h: int, a: int, mode: str, diff: int) -> str:
    """Which term of the count a wrong answer is off in, when the difference is a small
    whole multiple of one of them; "" when it is not."""
    sbh, scores = s * b * h, a * s * s * b
    if mode == "selective" and diff == 5 * scores:
        return " (the attention scores, 5 a s^2 b bytes, are counted: selective recomputation "\
               "drops them and recomputes them in backward)"
    if mode != "full" and scores and diff % scores == 0 and 0 < abs(diff // scores) <= 5:
        return (f" (off by {diff // scores:+d} x a s^2 b: the attention scores' term; each "
                "score keeps 5 bytes, 2 for the softmax output, 1 for its dropout mask, 2 for "
                "the dropout's output)")
    if diff % sbh == 0 and 0 < abs(diff // sbh) <= 34:
        return (f" (off by {diff // sbh:+d} x s b h: the per-token term; "
                + ("full recomputation keeps the layer's 2-byte input, 2 sbh)" if mode == "full"
                   else "section 1's table adds up to 34 sbh)"))
    return ""


def _bytes(cases: list[tuple[int, int, int, int, str]]) -> Impl:
    def compute(impl: Impl) -> list[Any]:
        return [impl(*case) for case in cases]
    return compute


def _bytes_judge(cases: list[tuple[int, int, int, int, str]]) -> Callable[[list], None]:
    def judge(got: list) -> None:
        for (s, b, h, a, mode), value in zip(cases, got):
            want = _want_bytes(s, b, h, a, mode)
            expect(isinstance(value, (int, float)) and not isinstance(value, bool),
                   f"seq={s}, batch={b}, d_model={h}, n_heads={a}, {mode!r}: returned "
                   f"{type_name(value)}, expected a number of bytes (a Python int)")
            expect(isinstance(value, int),
                   f"seq={s}, batch={b}, d_model={h}, n_heads={a}, {mode!r}: returned the "
                   f"float {value!r}; bytes are a whole number: return an int (write the "
                   f"scores as 5 * a * s * s * b, not s * b * h * 5 * a * s / h)")
            hint = ""
            if mode == "none" and value == 34 * s * b * h:
                hint = (" (the attention scores, 5 a s^2 b bytes, are missing: left out, or "
                        "lost to an integer division 5 a s // h)")
            elif mode == "none" and value == s * b * h * (34 + 5 * a * s // h) != want:
                hint = (" (integer division: 5 a s // h drops a fraction; write the scores as "
                        "5 * a * s * s * b)")
            elif mode == "none" and value != want and _float_formula(s, b, h, a, value):
                hint = (" (off by a few bytes: a float formula rounded or cut to an int loses "
                        "them; count in whole numbers, the scores as 5 * a * s * s * b)")
            elif mode == "full" and value == 34 * s * b * h:
                hint = " (full recomputation keeps only the layer's input)"
            else:
                hint = _which_term(s, b, h, a, mode, value - want)
            expect(value == want, f"seq={s}, batch={b}, d_model={h}, n_heads={a}, {mode!r}: "
                                  f"{value:,} bytes, expected {want:,}{hint}")
    return judge


BYTE_CASES = ([(2048, 4, 4096, 32, m) for m in MODES] + [(512, 2, 768, 12, m) for m in MODES]
              # s b h (34 + 5 a s / h) in floats is 3404.999..., and at a million-token context
              # it rounds to the wrong whole number: the count is exact only in integers
              + [(1, 1, 100, 1, "none"), (999_983, 13, 7168, 96, "none")])


BAD_SIZES = {"recompute='some'": (1024, 1, 1024, 16, "some"), "seq=0": (0, 1, 1024, 16, "none"),
             "n_heads=0": (1024, 1, 1024, 0, "selective"), "batch=0": (1024, 0, 1024, 16, "full"),
             "d_model=0": (1024, 1, 0, 16, "none"), "seq=-2048": (-2048, 1, 1024, 16, "none"),
             "batch=-1": (1024, -1, 1024, 16, "selective")}


def _bytes_refusals(impl: Impl) -> dict[str, str]:
    return {name: refusal(lambda args=args: impl(*args)) for name, args in BAD_SIZES.items()}


def _judge_bytes_refusals(out: dict[str, str]) -> None:
    for name, what in out.items():
        expect(what == "ValueError", f"layer_activation_bytes with {name}: "
               + ("returned a number" if what == "returned" else f"raised {what}")
               + "; it should raise ValueError")


def _modes(impl: Impl) -> dict:
    return {"bytes": _bytes(BYTE_CASES)(impl), "refused": _bytes_refusals(impl)}


def _judge_modes(data: dict) -> None:
    _bytes_judge(BYTE_CASES)(data["bytes"])
    _judge_bytes_refusals(data["refused"])


# The hidden shapes, as the learner's function receives them (d_model a multiple of 64).
BYTE_EXAMPLES = [dict(seq=e["seq"], batch=e["batch"], d_model=e["d_model"] * 64,
                      n_heads=e["n_heads"], recompute=MODES[e["mode"]])
                 for e in examples(8, seed=91, seq=(1, 4096), batch=(1, 16), d_model=(1, 64),
                                   n_heads=(1, 16), mode=(0, 2))]


def _bytes_hidden(impl: Impl) -> list[dict]:
    return compute_examples(impl, BYTE_EXAMPLES)


def _judge_bytes_hidden(records: list[dict]) -> None:
    def one(out: Any, seq: int, batch: int, d_model: int, n_heads: int, recompute: str) -> None:
        try:
            _bytes_judge([(seq, batch, d_model, n_heads, recompute)])([out])
        except CheckFailure as exc:
            raise AssertionError(str(exc)) from None
    judge_examples(records, one)
