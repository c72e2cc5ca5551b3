"""Checks of exercise 3.2: buckets of parameters, against the package's ``make_buckets``."""

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
    got = out["got"] if isinstance(out, dict) and "got" in out else out
    if isinstance(out, dict) and "after" in out:
        expect(out["after"] == sizes, f"make_buckets changed its input: {sizes} became "
                                      f"{out['after']}")
    want = _reference_buckets(sizes, bucket_bytes)
    if got != want:
        flat = ([i for bucket in got for i in bucket]
                if isinstance(got, list) and all(isinstance(b, list) for b in got) else None)
        why = ("every parameter must be in exactly one bucket"
               if flat is None or sorted(flat) != list(range(len(sizes)))
               else "the buckets do not follow the order and the limit the docstring states")
        raise CheckFailure(f"make_buckets({sizes}, {bucket_bytes}) returned {got}, expected "
                           f"{want}: {why}")


def _bucket_case(cases: list[tuple[list[int], int]]) -> tuple[Impl, Impl]:
    def judge(outputs: list[dict]) -> None:
        for out in outputs:
            _judge_one_bucketing(out, out["sizes"], out["bucket_bytes"])
    return (lambda impl: _bucket_outputs(impl, cases)), judge


def _bucket_examples(count: int = 60, seed: int = 5) -> list[dict]:
    """Random size lists, shortest first (so the first failure reported is a short one)."""
    rng = random.Random(seed)
    drawn = [{"sizes": [rng.randint(1, 64) for _ in range(rng.randint(0, 12))],
              "bucket_bytes": rng.randint(1, 100)} for _ in range(count)]
    return sorted(drawn, key=lambda d: (len(d["sizes"]), sum(d["sizes"]), d["bucket_bytes"]))


BUCKET_EXAMPLES = _bucket_examples()


def _buckets_hidden(impl: Impl) -> list[dict]:
    def body(sizes: list[int], bucket_bytes: int) -> dict:
        given = list(sizes)
        return {"got": impl(given, bucket_bytes), "after": given}
    return compute_examples(body, BUCKET_EXAMPLES)


def _judge_buckets_hidden(records: list[dict]) -> None:
    judge_examples(records, _judge_one_bucketing)
