"""Checks of lesson 00: CUDA_VISIBLE_DEVICES and nn.DataParallel's device_ids.

Reference: ``mpgpu_edu.cluster.parse_visible`` and ``device_ids_to_physical``. Every case
runs the learner's function on a list of examples (*compute*) and compares each answer with
the reference (*judge*).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from mpgpu_edu.cluster import device_ids_to_physical, parse_visible
from mpgpu_edu.grading.checks import Case
from mpgpu_edu.grading.checks._plain import type_name
from mpgpu_edu.grading.checks._support import (compute_examples, examples, expect,
                                               judge_examples)

Impl = Callable[..., Any]


# ---- 0.1 visible_devices --------------------------------------------------------------------

def _judge_visible(got: Any, value: str | None, n_physical: int) -> None:
    want = parse_visible(value, n_physical)
    call = f"visible_devices({value!r}, {n_physical})"
    expect(isinstance(got, list), f"{call} should return a list, got {type_name(got)}")
    expect(got == want, f"{call} returned {got}, expected {want}")


def _visible_case(name: str, points: int, pairs: list[tuple[str | None, int]],
                  hidden: bool = False) -> Case:
    cases = [{"value": value, "n_physical": n} for value, n in pairs]
    return Case(name, points,
                lambda impl: compute_examples(lambda value, n_physical: impl(value, n_physical),
                                              cases),
                lambda records: judge_examples(records, _judge_visible), hidden=hidden)


_ENTRIES = [str(i) for i in range(10)] + [f" {i} " for i in range(10)] + [
    "-1", "", "x", "gpu", "1gpu", "3a", "12", "GPU-1", "+2", "+", "+1x", "-", "++2"]


def _random_visible() -> list[tuple[str, int]]:
    pairs = []
    for e in examples(60, seed=1, entries=(1, 6), n=(1, 8), seed_=(0, 10_000)):
        rng = random.Random(e["seed_"])
        pairs.append((",".join(rng.choice(_ENTRIES) for _ in range(e["entries"])), e["n"]))
    return pairs


# ---- 0.2 data_parallel_device_ids -----------------------------------------------------------

def _call_ids(impl: Impl, visible: list[int], physical: list[int]) -> dict[str, Any]:
    """The learner's ids, or the name of the exception it raised (ValueError is expected for
    a GPU that is not visible)."""
    try:
        return {"ids": impl(list(visible), list(physical)), "raised": None}
    except ValueError as exc:
        return {"ids": None, "raised": type(exc).__name__}


def _judge_ids(out: dict[str, Any], visible: list[int], physical: list[int]) -> None:
    call = f"data_parallel_device_ids({visible}, {physical})"
    if any(gpu not in visible for gpu in physical):
        expect(out["raised"] is not None, f"{call} returned {out['ids']}; a GPU that is not "
                                          "visible should raise ValueError")
        return
    expect(out["raised"] is None, f"{call} raised ValueError, but every GPU asked for is "
                                  f"visible")
    ids = out["ids"]
    expect(isinstance(ids, list) and all(type(i) is int for i in ids),
           f"{call} should return a list of ints, got {type_name(ids)}: {ids}")
    expect(len(ids) == len(physical),
           f"{call} returned {len(ids)} id{'s' if len(ids) != 1 else ''} for {len(physical)} "
           f"requested GPU{'s' if len(physical) != 1 else ''}: {ids}")
    try:
        runs_on = device_ids_to_physical(ids, visible)
    except ValueError:
        runs_on = None
    missing = list(dict.fromkeys(f"cuda:{i}" for i in ids if not 0 <= i < len(visible)))
    expect(not missing,
           f"{call} returned {ids}: {' and '.join(missing)} "
           f"{'does' if len(missing) == 1 else 'do'} not exist in a process that sees "
           f"{len(visible)} GPU{'s' if len(visible) != 1 else ''}, where "
           + ", ".join(f"cuda:{i} is GPU {gpu}" for i, gpu in enumerate(visible))
           + "; device_ids count in the process's own numbering")
    wrong_order = (runs_on is not None and runs_on != physical
                   and sorted(runs_on) == sorted(physical))
    expect(not wrong_order,
           f"{call} returned {ids}: the right GPUs in the wrong order (DataParallel would run "
           f"on physical GPUs {runs_on}, not {physical}): device_ids follow the order "
           "requested, and device_ids[0] is DataParallel's primary device")
    expect(runs_on == physical,
           f"{call} returned {ids}: DataParallel would run on "
           f"{'no valid GPUs' if runs_on is None else f'physical GPUs {runs_on}'}, not on "
           f"{physical}; device_ids count in the process's own numbering")


def _ids_case(name: str, points: int, cases: list[dict[str, Any]],
              hidden: bool = False) -> Case:
    return Case(name, points,
                lambda impl: compute_examples(lambda **e: _call_ids(impl, **e), cases),
                lambda records: judge_examples(records, _judge_ids), hidden=hidden)


def _random_ids() -> list[dict[str, Any]]:
    out = []
    for e in examples(40, seed=2, n_visible=(1, 8), n_picks=(1, 4), seed_=(0, 10_000)):
        rng = random.Random(e["seed_"])
        visible = rng.sample(range(16), e["n_visible"])
        physical = [rng.choice(visible) for _ in range(e["n_picks"])]  # repeats included
        out.append({"visible": visible, "physical": physical})
    return out


# The package's own implementation of each exercise: unavailable to the learner's code while
# it is checked (``grading.compute``); the judges here still compare with it.
REFERENCES = {"0.1": ["mpgpu_edu.cluster.visible:parse_visible",
                      "mpgpu_edu.cluster.visible:_scan",
                      "mpgpu_edu.cluster.visible:_read_entry"],
              "0.2": ["mpgpu_edu.cluster.visible:device_ids_to_physical",
                      "mpgpu_edu.lessons.welcome:device_ids_for",
                      "mpgpu_edu.cluster.visible:_bad_device_ids_message"]}

CASES: dict[str, list[Case]] = {
    "0.1": [
        _visible_case("unset and plain lists", 1,
                      [(None, 4), ("2,3", 4), ("3,1", 4), ("0", 1), (None, 0)]),
        _visible_case("blanks, signs and leading digits", 1,
                      [(" 1 , 2 ", 4), ("1gpu,0", 4), ("+2,0", 4), (" +1gpu , 3", 4),
                       ("0,+,1", 4), ("1,+-2,0", 4), ("2,- 1", 4)]),
        _visible_case("empty: no device", 1, [("", 4), ("  ", 2)]),
        _visible_case("invalid entry ends the list, duplicates empty it", 1,
                      [("0,2,-1,1", 4), ("1,7,2", 4), ("0,x,1", 2), ("1,1", 4),
                       ("0,1,0", 4), ("4", 4)]),
        _visible_case("hidden: random values", 1, _random_visible(), hidden=True),
    ],
    "0.2": [
        _ids_case("logical ids, not physical ones", 1,
                  [{"visible": v, "physical": p} for v, p in
                   [([1, 2], [1, 2]), ([2, 3], [3]), ([3, 1, 2], [1, 2, 3]),
                    ([0, 1, 2, 3], [2, 0]), ([1, 2], [1, 1]), ([3, 1, 2], [1, 3, 1])]]),
        _ids_case("a GPU that is not visible raises ValueError", 1,
                  [{"visible": v, "physical": p} for v, p in
                   [([1, 2], [0]), ([2, 3], [2, 4]), ([], [0])]]),
        _ids_case("hidden: random visible lists", 1, _random_ids(), hidden=True),
    ],
}
