"""CUDA_VISIBLE_DEVICES read with CUDA's rules, and the nn.DataParallel device_ids gotcha."""

from __future__ import annotations

import pytest

from mpgpu_edu.cluster.visible import check_visible, device_ids_to_physical, parse_visible


@pytest.mark.parametrize(("value", "n_physical", "expected"), [
    (None, 4, [0, 1, 2, 3]),          # unset: everything, physical order
    (None, 0, []),
    ("", 4, []),                       # set but empty: nothing
    ("   ", 4, []),
    ("2,3", 4, [2, 3]),                # the seed's example
    ("3,1", 4, [3, 1]),                # reordering
    ("3,2,1,0", 4, [3, 2, 1, 0]),
    (" 0 , 2 ", 4, [0, 2]),            # whitespace tolerated
    ("0,\t1", 4, [0, 1]),
    ("0,2,-1,1", 4, [0, 2]),           # stops at the first invalid entry
    ("-1", 4, []),
    ("0,4,1", 4, [0]),                 # out of range stops too
    ("7", 4, []),
    ("a", 4, []),                      # not a number
    ("x,1", 4, []),
    ("0,,1", 4, [0]),                  # an empty entry is invalid
    ("1,", 4, [1]),
    ("1gpu,2", 4, [1, 2]),             # strtoul: leading digits count
    ("+2", 4, [2]),
    ("0,1,0", 4, []),                  # a repeated index hides everything
    ("2,2", 4, []),
    ("0,5,0", 4, [0]),                 # ... but not one after the stopping point
    ("GPU-8f3c2a1b,1", 4, []),         # UUIDs: simulated devices have none
    ("MIG-abcd", 4, []),
])
def test_parse_visible_table(value: str | None, n_physical: int, expected: list[int]) -> None:
    assert parse_visible(value, n_physical) == expected


@pytest.mark.parametrize("value", [None, "0,1", "3,1", " 0 , 2 "])
def test_clean_values_have_no_warnings(value: str | None) -> None:
    assert check_visible(value, 4) == []


def test_invalid_entry_warning_names_entry_and_fix() -> None:
    (warning,) = check_visible("0,2,-1,1", 4)
    assert "entry 3 ('-1') is invalid" in warning
    assert "everything after it" in warning
    assert "'1'" in warning
    assert "remove it" in warning


def test_out_of_range_warning_names_the_device_count() -> None:
    (warning,) = check_visible("0,7", 4)
    assert "GPU 7 does not exist" in warning
    assert "0..3" in warning


def test_empty_and_nothing_visible_warnings() -> None:
    assert "empty" in check_visible("", 4)[0]
    warnings = check_visible("x,1", 4)
    assert "entry 1 ('x')" in warnings[0]
    assert any("no devices are visible" in w for w in warnings)


def test_duplicate_warning() -> None:
    warnings = check_visible("0,1,0", 4)
    assert "entry 3 ('0') repeats GPU 0" in warnings[0]
    assert "no devices at all" in warnings[0]


def test_trailing_text_warning() -> None:
    (warning,) = check_visible("1gpu", 4)
    assert "read as 1" in warning and "write '1'" in warning


def test_uuid_is_unsupported_and_says_so() -> None:
    warnings = check_visible("GPU-8f3c2a1b", 4)
    assert "UUID" in warnings[0]
    assert "indices" in warnings[0]


def test_negative_physical_count_is_an_error() -> None:
    with pytest.raises(ValueError, match="n_physical"):
        parse_visible("0", -1)


def test_device_ids_are_logical() -> None:
    # CUDA_VISIBLE_DEVICES=1,2: cuda:0 is physical 1, cuda:1 is physical 2.
    assert device_ids_to_physical([0, 1], [1, 2]) == [1, 2]
    assert device_ids_to_physical([1, 0], [3, 1]) == [1, 3]
    assert device_ids_to_physical([], [1, 2]) == []


def test_device_ids_written_as_physical_ids_is_the_gotcha() -> None:
    with pytest.raises(ValueError) as info:
        device_ids_to_physical([1, 2], [1, 2])
    message = str(info.value)
    assert "only 2 devices are visible (cuda:0..cuda:1)" in message
    assert "cuda:2 does not exist" in message
    assert "device_ids=[0, 1]" in message  # the fix


def test_device_ids_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"device_ids=\[2\] but only 2 devices are visible"):
        device_ids_to_physical([2], [1, 2])
    with pytest.raises(ValueError, match="use ids 0..0"):
        device_ids_to_physical([5], [3])
    with pytest.raises(ValueError, match="no devices are visible"):
        device_ids_to_physical([0], [])
    with pytest.raises(ValueError, match="cuda:-1"):
        device_ids_to_physical([-1], [0, 1])


def test_device_ids_must_be_ints() -> None:
    with pytest.raises(ValueError, match="integers"):
        device_ids_to_physical(["0"], [0, 1])  # type: ignore[list-item]
