"""Plausible wrong answers for lesson 00 (see tests/mutants/__init__.py)."""

from __future__ import annotations

import re


def _leading(entry: str) -> str:
    """The bare digits at the start of an entry (no sign)."""
    digits = ""
    for char in entry.strip():
        if not char.isdigit():
            break
        digits += char
    return digits


def _number(entry: str) -> int | None:
    """The number at the start of an entry, sign included, as the contract reads it."""
    match = re.match(r"[+-]?[0-9]+", entry.strip())
    return None if match is None else int(match.group())


# ---- 0.1 ------------------------------------------------------------------------------------

def visible_skips_bad_entries(value: str | None, n_physical: int) -> list[int]:
    """Skips an invalid entry and goes on, instead of ending the list at the first one."""
    if value is None:
        return list(range(n_physical))
    devices: list[int] = []
    for entry in value.split(","):
        gpu = _number(entry)
        if gpu is None or not 0 <= gpu < n_physical:
            continue
        if gpu in devices:
            return []
        devices.append(gpu)
    return devices


def visible_keeps_duplicates_once(value: str | None, n_physical: int) -> list[int]:
    """Drops a repeated GPU instead of making the whole list invalid."""
    if value is None:
        return list(range(n_physical))
    devices: list[int] = []
    for entry in value.split(","):
        gpu = _number(entry)
        if gpu is None or not 0 <= gpu < n_physical:
            break
        if gpu not in devices:
            devices.append(gpu)
    return devices


def visible_sorted(value: str | None, n_physical: int) -> list[int]:
    """Returns the visible GPUs in physical order instead of the order listed."""
    if value is None:
        return list(range(n_physical))
    devices: list[int] = []
    for entry in value.split(","):
        gpu = _number(entry)
        if gpu is None or not 0 <= gpu < n_physical:
            break
        if gpu in devices:
            return []
        devices.append(gpu)
    return sorted(devices)


def visible_keeps_order_strict(value: str | None, n_physical: int) -> list[int]:
    """Treats "1gpu" as invalid (int() of the whole entry) instead of reading its digits."""
    if value is None:
        return list(range(n_physical))
    devices: list[int] = []
    for entry in value.split(","):
        try:
            gpu = int(entry)
        except ValueError:
            break
        if not 0 <= gpu < n_physical:
            break
        if gpu in devices:
            return []
        devices.append(gpu)
    return devices


def visible_rejects_plus(value: str | None, n_physical: int) -> list[int]:
    """Reads only bare digits (str.isdigit), so "+2" ends the list instead of reading as 2."""
    if value is None:
        return list(range(n_physical))
    devices: list[int] = []
    for entry in value.split(","):
        digits = _leading(entry)
        if not digits or int(digits) >= n_physical:
            break
        if int(digits) in devices:
            return []
        devices.append(int(digits))
    return devices


# ---- 0.2 ------------------------------------------------------------------------------------

def device_ids_physical(visible: list[int], physical_gpus: list[int]) -> list[int]:
    """Returns the physical ids themselves (the classic device_ids=[1, 2] mistake)."""
    for gpu in physical_gpus:
        if gpu not in visible:
            raise ValueError(f"GPU {gpu} is not visible")
    return list(physical_gpus)


def device_ids_no_check(visible: list[int], physical_gpus: list[int]) -> list[int]:
    """Right for visible GPUs, but returns -1 for one that is not visible instead of raising."""
    return [visible.index(gpu) if gpu in visible else -1 for gpu in physical_gpus]


def device_ids_drop_repeats(visible: list[int], physical_gpus: list[int]) -> list[int]:
    """Treats the request as a set of GPUs: a GPU asked for twice gets one id, not two."""
    ids: list[int] = []
    for gpu in physical_gpus:
        if gpu not in visible:
            raise ValueError(f"GPU {gpu} is not visible")
        if visible.index(gpu) not in ids:
            ids.append(visible.index(gpu))
    return ids


def device_ids_sorted(visible: list[int], physical_gpus: list[int]) -> list[int]:
    """The right logical ids, sorted instead of in the order requested."""
    for gpu in physical_gpus:
        if gpu not in visible:
            raise ValueError(f"GPU {gpu} is not visible")
    return sorted(visible.index(gpu) for gpu in physical_gpus)


MUTANTS: dict[str, list[str]] = {
    "0.1": ["visible_skips_bad_entries", "visible_keeps_duplicates_once", "visible_sorted",
            "visible_keeps_order_strict", "visible_rejects_plus"],
    "0.2": ["device_ids_physical", "device_ids_no_check", "device_ids_drop_repeats",
            "device_ids_sorted"],
}
