"""Checks of exercise 4.1: balanced stage boundaries, against the largest stage of the
package's ``partition_balanced`` (whole costs) or of every split tried (fractional costs).
Whether the caller's list of costs was left as it was is seen only inside the learner's
process: a feedback case, worth no points."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from mpgpu_edu.grading.checks._support import (compute_examples, each, examples, expect,
                                               judge_examples)
from mpgpu_edu.pipeline import LayerCost, partition_balanced

Impl = Callable[..., Any]


def _stage_costs(costs: list[float], boundaries: list[int]) -> list[float]:
    edges = [0, *boundaries, len(costs)]
    add = sum if all(type(c) is int for c in costs) else math.fsum
    return [add(costs[a:b]) for a, b in zip(edges, edges[1:])]


def _optimal_max(costs: list[float], n_stages: int) -> float:
    """The smallest possible largest stage: the package's ``partition_balanced`` for whole
    costs, and for fractional ones every split point tried (the check's layer counts are
    small)."""
    if all(float(c).is_integer() for c in costs):
        layers = [LayerCost(f"l{i}", n_params=int(c), flops=0) for i, c in enumerate(costs)]
        return max(stage.n_params for stage in partition_balanced(layers, n_stages).stages)
    best = [[math.inf] * (len(costs) + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0  # best[k][i]: the first i layers in k stages
    for k in range(1, n_stages + 1):
        for i in range(k, len(costs) + 1):
            best[k][i] = min(max(best[k - 1][j], math.fsum(costs[j:i])) for j in range(k - 1, i))
    return best[n_stages][len(costs)]


def _partition_one(impl: Impl, costs: list[float], n_stages: int) -> dict:
    given = list(costs)
    got = impl(given, n_stages)
    return {"got": got, "input_after": given}


def _judge_partition(out: dict, costs: list[float], n_stages: int) -> None:
    shown = costs if len(costs) <= 12 else f"[{len(costs)} costs: {costs[:4]} ...]"
    got, call = out["got"], f"balanced_boundaries({shown}, {n_stages})"
    expect(isinstance(got, list) and len(got) == n_stages - 1,
           f"{call} returned {got!r}; expected a list of {n_stages - 1} boundaries")
    expect(all(type(b) is int for b in got) and all(0 < b < len(costs) for b in got)
           and all(a < b for a, b in zip(got, got[1:])),
           f"{call} returned {got}: boundaries increase strictly and lie in "
           f"1..{len(costs) - 1}, so every stage holds at least one layer")
    best, mine = _optimal_max(costs, n_stages), max(_stage_costs(costs, got))
    stages = [c if type(c) is int else float(format(c, ".6g")) for c in _stage_costs(costs, got)]
    expect(mine <= best + 1e-9 * abs(best),  # relative: costs may be seconds (1e-6 and less)
           f"{call} returned {got}: stage costs {stages}, largest {mine:g}; the best split has "
           f"largest stage {best:g}"
           + ("" if all(float(c).is_integer() for c in costs) else
              " (the costs are fractions here: the best largest stage need not be a whole "
              "number)"))


def _judge_input_kept(out: dict, costs: list[float], n_stages: int) -> None:
    """Feedback: the caller's list of costs after the call, seen only inside the learner's
    process."""
    shown = costs if len(costs) <= 12 else f"[{len(costs)} costs: {costs[:4]} ...]"
    expect(out["input_after"] == costs, f"balanced_boundaries({shown}, {n_stages}) changed "
                                        f"its input to {out['input_after']}")


def _partition_case(cases: list[tuple[list[float], int]]) -> tuple[Callable, Callable]:
    """*compute* and *judge* over listed (costs, n_stages): the boundaries returned."""
    return each([{"costs": costs, "n_stages": n} for costs, n in cases], _partition_one,
                _judge_partition)


def _partition_input_case(cases: list[tuple[list[float], int]]) -> tuple[Callable, Callable]:
    """The feedback case's halves: whether the caller's costs were left as they were."""
    return each([{"costs": costs, "n_stages": n} for costs, n in cases], _partition_one,
                _judge_input_kept)


def _compute_bad(impl: Impl) -> list[dict]:
    records = []
    for costs, n_stages in [([1, 2, 3], 4), ([1, 2], 0)]:
        try:
            got = impl(list(costs), n_stages)
        except ValueError:
            got = "raised ValueError"
        records.append({"costs": costs, "n_stages": n_stages, "got": got})
    return records


def _judge_bad(records: list[dict]) -> None:
    for r in records:
        expect(r["got"] == "raised ValueError",
               f"balanced_boundaries({r['costs']}, {r['n_stages']}) returned {r['got']!r}; it "
               "should raise ValueError (each stage needs at least one layer)")


DEEP_COSTS = [(7 * i) % 23 + 1 for i in range(96)]  # a deep model: too many splits to try


def _random_costs(n_layers: int, draw: int) -> list[float]:
    """Whole costs 0-20, or (every third draw) milliseconds with two decimals."""
    rng = random.Random(draw)
    if draw % 3 == 0:
        return [rng.randint(1, 400) / 100 for _ in range(n_layers)]
    return [rng.randint(0, 20) for _ in range(n_layers)]


def _compute_partition_hidden(impl: Impl) -> list[dict]:
    def body(n_layers: int, n_stages: int, draw: int) -> dict:
        return _partition_one(impl, _random_costs(n_layers, draw), min(n_stages, n_layers))
    return compute_examples(body, examples(40, seed=41, n_layers=(1, 9), n_stages=(1, 5),
                                           draw=(0, 10_000)))


def _judge_partition_hidden(records: list[dict]) -> None:
    def one(out: dict, n_layers: int, n_stages: int, draw: int) -> None:
        _judge_partition(out, _random_costs(n_layers, draw), min(n_stages, n_layers))
    judge_examples(records, one)
