"""Checks of exercise 3.2: buckets of parameters, against the package's ``make_buckets``.
Whether the caller's list was left as it was is seen only inside the learner's process: a
feedback case, worth no points."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.dp import make_buckets
from mpgpu_edu.grading.checks import CheckFailure
from mpgpu_edu.grading.checks._support import compute_examples, expect, judge_examples

Impl = Callable[..., Any]


def _reference_buckets(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """The package's ``make_buckets``, on byte-sized meta tensors, as parameter indices."""
    params = [torch.empty(size, dtype=torch.uint8, device="meta") for size in sizes]
    index = {id(p): i for i, p in enumerate(params)}
    return [[index[id(p)] for p in bucket] for bucket in make_buckets(params, bucket_bytes)]


def _bucket_outputs(impl: Impl, cases: list[tuple[list[int], int]]) -> list[dict]:
    out = []
    for sizes, bucket_bytes in cases:
        given = list(sizes)
        out.append({"sizes": list(sizes), "bucket_bytes": bucket_bytes,
                    "got": impl(given, bucket_bytes), "after": given})
    return out


def _judge_one_bucketing(out: dict, sizes: list[int], bucket_bytes: int) -> None:
    """Scored: the buckets returned, against the package's ``make_buckets``."""
    got = out["got"] if isinstance(out, dict) and "got" in out else out
    want = _reference_buckets(sizes, bucket_bytes)
    if got != want:
        flat = ([i for bucket in got for i in bucket]
                if isinstance(got, list) and all(isinstance(b, list) for b in got) else None)
        why = ("every parameter must be in exactly one bucket"
               if flat is None or sorted(flat) != list(range(len(sizes)))
               else "the buckets do not follow the order and the limit the docstring states")
        raise CheckFailure(f"make_buckets({sizes}, {bucket_bytes}) returned {got}, expected "
                           f"{want}: {why}")


def _judge_one_input_kept(out: dict, sizes: list[int], bucket_bytes: int) -> None:
    """Feedback: the caller's list as it was after the call, seen only inside the
    learner's process."""
    expect(out["after"] == sizes, f"make_buckets({sizes}, {bucket_bytes}) changed its input: "
                                  f"{sizes} became {out['after']}")


def _bucket_case(cases: list[tuple[list[int], int]],
                 judge_one: Callable[[dict, list[int], int], None] = _judge_one_bucketing
                 ) -> tuple[Impl, Impl]:
    """*compute* and *judge* over listed (sizes, bucket_bytes): by default the buckets
    returned (scored)."""
    def judge(outputs: list[dict]) -> None:
        for out in outputs:
            judge_one(out, out["sizes"], out["bucket_bytes"])
    return (lambda impl: _bucket_outputs(impl, cases)), judge


def _bucket_input_case(cases: list[tuple[list[int], int]]) -> tuple[Impl, Impl]:
    """The feedback case's halves: whether the caller's list was left as it was."""
    return _bucket_case(cases, _judge_one_input_kept)


def _bucket_examples(count: int = 60, seed: int = 5) -> list[dict]:
    """Random size lists, shortest first (so the first failure reported is a short one)."""
    rng = random.Random(seed)
    drawn = [{"sizes": [rng.randint(1, 64) for _ in range(rng.randint(0, 12))],
              "bucket_bytes": rng.randint(1, 100)} for _ in range(count)]
    return sorted(drawn, key=lambda d: (len(d["sizes"]), sum(d["sizes"]), d["bucket_bytes"]))


BUCKET_EXAMPLES = _bucket_examples()


def _buckets_hidden(impl: Impl) -> list[dict]:
    def body(sizes: list[int], bucket_bytes: int) -> dict:
        return {"got": impl(list(sizes), bucket_bytes)}
    return compute_examples(body, BUCKET_EXAMPLES)


def _judge_buckets_hidden(records: list[dict]) -> None:
    judge_examples(records, _judge_one_bucketing)
