"""``CUDA_VISIBLE_DEVICES``: which physical GPUs a process sees, and in which order.

A process numbers the GPUs it can see ``cuda:0, cuda:1, ...`` (logical ids), in the order
the variable lists them. With ``CUDA_VISIBLE_DEVICES=2,3`` physical GPU 2 is ``cuda:0``
and physical GPU 3 is ``cuda:1``; physical GPUs 0 and 1 do not exist for the process.

The rules CUDA follows (NVIDIA CUDA C++ Programming Guide, "CUDA Environment Variables";
PyTorch mirrors them in ``torch.cuda._parse_visible_devices`` so that it can count devices
without initialising CUDA):

* unset: every device is visible, in physical order;
* set but empty: no device is visible;
* a comma-separated list of indices, whitespace around them tolerated, in any order;
* each entry is read like C's ``strtoul``: the leading digits count and the rest is
  ignored, so ``"1gpu"`` reads as 1;
* enumeration stops at the first invalid entry (not a number, negative, or not an existing
  device) and everything after it is ignored: ``"0,2,-1,1"`` gives ``[0, 2]``;
* a repeated index makes the *whole* list invalid: no device is visible. This is what
  PyTorch's parser encodes ("Repeated ordinal results in empty set"). We apply it to the
  entries before the stopping point; what the driver does with a duplicate that comes
  after an invalid entry is not documented, and we ignore it like any other entry there.

UUIDs (``GPU-8f3c...``, ``MIG-...``) are accepted by real CUDA; simulated devices have no
UUIDs, so here a UUID entry counts as invalid and ``check_visible`` says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ENTRY = re.compile(r"([+-]?\d+)(.*)", re.DOTALL)


@dataclass(frozen=True)
class _Scan:
    devices: list[int]
    warnings: list[str]


def parse_visible(value: str | None, n_physical: int) -> list[int]:
    """The physical ids a process sees under ``CUDA_VISIBLE_DEVICES=value``, in logical order.

    ``parse_visible("2,3", 4) == [2, 3]``; ``parse_visible(None, 4) == [0, 1, 2, 3]``.
    Never raises on a malformed value: like CUDA it silently shows fewer devices. Call
    ``check_visible`` to learn why.
    """
    return _scan(value, n_physical).devices


def check_visible(value: str | None, n_physical: int) -> list[str]:
    """Human-readable warnings about ``value``: every entry CUDA ignores or reads oddly,
    and why. An empty list means the value is clean."""
    return _scan(value, n_physical).warnings


def device_ids_to_physical(device_ids: list[int], visible: list[int]) -> list[int]:
    """The physical GPUs behind ``device_ids`` (logical ids, as ``nn.DataParallel`` takes).

    With ``CUDA_VISIBLE_DEVICES=1,2`` (``visible=[1, 2]``), ``device_ids=[0, 1]`` are
    physical GPUs 1 and 2. Writing the physical ids, ``device_ids=[1, 2]``, is the classic
    mistake: ``cuda:2`` does not exist in this process. Raises ``ValueError`` naming the
    problem and the fix.
    """
    n = len(visible)
    for device_id in device_ids:
        if isinstance(device_id, bool) or not isinstance(device_id, int):
            raise ValueError(f"device_ids must be integers (logical ids), got {device_id!r}")
        if not 0 <= device_id < n:
            raise ValueError(_bad_device_ids_message(device_ids, visible))
    return [visible[device_id] for device_id in device_ids]


def _bad_device_ids_message(device_ids: list[int], visible: list[int]) -> str:
    n = len(visible)
    if n == 0:
        return (f"device_ids={device_ids} but no devices are visible "
                "(CUDA_VISIBLE_DEVICES selects none); set it to list at least one GPU")
    missing = [f"cuda:{d}" for d in device_ids if not 0 <= d < n]
    exist = "does not exist" if len(missing) == 1 else "do not exist"
    are = "devices are" if n != 1 else "device is"
    message = (f"device_ids={device_ids} but only {n} {are} visible (cuda:0..cuda:{n - 1}), "
               f"so {', '.join(missing)} {exist}: device_ids are logical ids counted after "
               "CUDA_VISIBLE_DEVICES, which maps "
               + ", ".join(f"cuda:{i} -> GPU {p}" for i, p in enumerate(visible)))
    if all(d in visible for d in device_ids):
        logical = [visible.index(d) for d in device_ids]
        message += (f"; these look like physical ids: to use physical GPUs {device_ids} "
                    f"write device_ids={logical}")
    else:
        message += f"; use ids 0..{n - 1}, or make more GPUs visible"
    return message


def _scan(value: str | None, n_physical: int) -> _Scan:
    if n_physical < 0:
        raise ValueError(f"n_physical must be >= 0, got {n_physical}")
    if value is None:
        return _Scan(list(range(n_physical)), [])
    if value.strip() == "":
        return _Scan([], ["CUDA_VISIBLE_DEVICES is set but empty: CUDA sees no devices "
                          "(torch.cuda.device_count() == 0); unset it to see all "
                          f"{n_physical}"])
    entries = value.split(",")
    devices: list[int] = []
    warnings: list[str] = []
    for position, raw in enumerate(entries, start=1):
        entry = raw.strip()
        where = f"entry {position} ({raw!r})"
        index, problem, fix = _read_entry(entry, n_physical)
        if problem:
            rest = entries[position:]
            ignored = f" (here: {','.join(rest)!r})" if rest else ""
            warnings.append(f"{where} {problem} and everything after it{ignored}; {fix}")
            break
        if index in devices:
            warnings.append(f"{where} repeats GPU {index}: a repeated index makes CUDA show "
                            "no devices at all; list each GPU once")
            return _Scan([], warnings + _none_visible())
        if not re.fullmatch(r"\d+", entry):
            warnings.append(f"{where} is read as {index}: CUDA reads the leading digits and "
                            f"ignores the rest; write {str(index)!r}")
        devices.append(index)
    if not devices:
        warnings += _none_visible()
    return _Scan(devices, warnings)


def _read_entry(entry: str, n_physical: int) -> tuple[int, str, str]:
    """(index, "", "") for a usable entry, or (-1, why it stops the enumeration, the fix)."""
    if entry.upper().startswith(("GPU-", "MIG-")):
        return -1, ("is a UUID: real CUDA accepts UUIDs, but simulated devices have none, "
                    "so the simulator ignores it"), "write indices such as '0,1'"
    match = _ENTRY.fullmatch(entry)
    if match is None:
        why = "empty" if entry == "" else "not a device index"
    elif int(match.group(1)) < 0:
        why = "negative"
    elif int(match.group(1)) >= n_physical:
        why = (f"GPU {int(match.group(1))} does not exist; this machine has {n_physical}: "
               f"{_id_range(n_physical)}")
    else:
        return int(match.group(1)), "", ""
    return -1, f"is invalid ({why}): CUDA ignores it", "remove it"


def _id_range(n: int) -> str:
    return "none" if n == 0 else ("0" if n == 1 else f"0..{n - 1}")


def _none_visible() -> list[str]:
    return ["no devices are visible: torch.cuda.device_count() will be 0"]
