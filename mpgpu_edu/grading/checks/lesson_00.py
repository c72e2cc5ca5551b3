"""Checks of lesson 00: CUDA_VISIBLE_DEVICES and nn.DataParallel's device_ids.

Reference: ``mpgpu_edu.cluster.parse_visible`` and ``device_ids_to_physical``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpgpu_edu.cluster import device_ids_to_physical, parse_visible
from mpgpu_edu.grading.checks import Case, CheckFailure
from mpgpu_edu.grading.checks._support import expect, property_check

Impl = Callable[..., Any]


def _agrees(impl: Impl, value: str | None, n_physical: int) -> None:
    want = parse_visible(value, n_physical)
    got = impl(value, n_physical)
    expect(isinstance(got, list), f"visible_devices({value!r}, {n_physical}) should return a "
                                  f"list, got {type(got).__name__}")
    expect(got == want, f"visible_devices({value!r}, {n_physical}) returned {got}, "
                        f"expected {want}")


def _cases(pairs: list[tuple[str | None, int]]) -> Callable[[Impl], None]:
    def run(impl: Impl) -> None:
        for value, n in pairs:
            _agrees(impl, value, n)
    return run


def _visible_property(impl: Impl) -> None:
    from hypothesis import strategies as st

    entry = st.one_of(st.integers(0, 9).map(str), st.integers(0, 9).map(lambda i: f" {i} "),
                      st.sampled_from(["-1", "", "x", "gpu", "1gpu", "3a", "12", "GPU-1"]))

    def body(entries: list[str], n_physical: int) -> None:
        _agrees(impl, ",".join(entries), n_physical)

    property_check(body, max_examples=60, entries=st.lists(entry, min_size=1, max_size=6),
                   n_physical=st.integers(1, 8))


def _device_ids_examples(impl: Impl) -> None:
    for visible, physical, want in [([1, 2], [1, 2], [0, 1]), ([2, 3], [3], [1]),
                                    ([3, 1, 2], [1, 2, 3], [1, 2, 0]),
                                    ([0, 1, 2, 3], [2, 0], [2, 0])]:
        got = impl(list(visible), list(physical))
        expect(got == want, f"data_parallel_device_ids({visible}, {physical}) returned {got}, "
                            f"expected {want}: device_ids are positions in the visible list")


def _device_ids_invisible(impl: Impl) -> None:
    for visible, physical in [([1, 2], [0]), ([2, 3], [2, 4]), ([], [0])]:
        try:
            got = impl(list(visible), list(physical))
        except ValueError:
            continue
        raise CheckFailure(f"data_parallel_device_ids({visible}, {physical}) returned {got}; "
                           "a GPU that is not visible should raise ValueError")


def _device_ids_property(impl: Impl) -> None:
    from hypothesis import strategies as st

    def body(visible: list[int], picks: list[int]) -> None:
        physical = [visible[i % len(visible)] for i in picks]
        physical = list(dict.fromkeys(physical))
        ids = impl(list(visible), list(physical))
        expect(device_ids_to_physical(ids, visible) == physical,
               f"device_ids {ids} map to physical GPUs "
               f"{device_ids_to_physical(ids, visible)}, not {physical}")

    property_check(body, visible=st.lists(st.integers(0, 15), min_size=1, max_size=8,
                                          unique=True),
                   picks=st.lists(st.integers(0, 7), min_size=1, max_size=4))


CASES: dict[str, list[Case]] = {
    "0.1": [
        Case("unset and plain lists", 1,
             _cases([(None, 4), ("2,3", 4), ("3,1", 4), ("0", 1), (None, 0)])),
        Case("blanks and leading digits", 1, _cases([(" 1 , 2 ", 4), ("1gpu,0", 4)])),
        Case("empty: no device", 1, _cases([("", 4), ("  ", 2)])),
        Case("invalid entry ends the list, duplicates empty it", 1,
             _cases([("0,2,-1,1", 4), ("1,7,2", 4), ("0,x,1", 2), ("1,1", 4),
                     ("0,1,0", 4), ("4", 4)])),
        Case("hidden: random values", 1, _visible_property, hidden=True),
    ],
    "0.2": [
        Case("logical ids, not physical ones", 1, _device_ids_examples),
        Case("a GPU that is not visible raises ValueError", 1, _device_ids_invisible),
        Case("hidden: random visible lists", 1, _device_ids_property, hidden=True),
    ],
}
