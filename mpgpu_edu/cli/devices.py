"""``mpgpu-edu devices``: which physical GPU is behind each ``cuda:N``.

    mpgpu-edu devices --cluster 4xRTX4090-pcie --visible 2,3
    mpgpu-edu devices --cluster 8xA100-nvlink --visible 1,2 --device-ids 1,2
    mpgpu-edu devices --cluster 4xRTX4090-pcie --visible 2,3 --json

``--visible`` plays the role of ``CUDA_VISIBLE_DEVICES``; without it the command reads this
shell's ``CUDA_VISIBLE_DEVICES`` (unset: every device), and says which it used. Either is read
with CUDA's own rules (``mpgpu_edu.cluster.visible``); anything CUDA would ignore is reported
as a warning naming the value and why, never an error.
"""

from __future__ import annotations

import argparse
import json
import os

from mpgpu_edu.cli import UsageError
from mpgpu_edu.cluster import Cluster, device_ids_to_physical, format_bytes

DEFAULT_CLUSTER = "4xRTX4090-pcie"
ENV = "CUDA_VISIBLE_DEVICES"


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "devices", help="logical -> physical device map under CUDA_VISIBLE_DEVICES",
        description="Show which physical GPU is behind each cuda:N of a simulated cluster.")
    parser.add_argument("--cluster", default=DEFAULT_CLUSTER, metavar="PRESET",
                        help=f"cluster preset (default {DEFAULT_CLUSTER}); one of: "
                             + ", ".join(Cluster.presets()))
    parser.add_argument("--visible", default=None, metavar="IDS",
                        help='the CUDA_VISIBLE_DEVICES value, e.g. "2,3"; "" for none '
                             "(default: this shell's CUDA_VISIBLE_DEVICES; unset: all devices)")
    parser.add_argument("--device-ids", default=None, metavar="IDS",
                        help="check nn.DataParallel's device_ids, e.g. 1,2 (logical ids)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    visible, source = args.visible, "--visible"
    if visible is None:
        visible, source = os.environ.get(ENV), "environment"
    cluster = Cluster.preset(args.cluster, visible=visible)
    device_ids = _parse_ids(args.device_ids) if args.device_ids is not None else None
    try:
        physical_ids = (device_ids_to_physical(device_ids, cluster.visible)
                        if device_ids is not None else None)
    except ValueError as exc:
        raise UsageError(f"--device-ids {args.device_ids}: {exc}") from None
    report = {
        "cluster": cluster.name,
        "gpu": cluster.gpu.display_name,
        "n_physical": cluster.n_physical,
        "visible": visible,
        "visible_from": None if visible is None else source,
        "logical_to_physical": cluster.logical_to_physical,
        "world_size": cluster.world_size,
        "devices": [{"logical": i, "device": f"cuda:{i}", "physical": p,
                     "memory_bytes": cluster.capacity_bytes(i)}
                    for i, p in enumerate(cluster.visible)],
        "warnings": cluster.visible_warnings(),
        "device_ids": device_ids,
        "device_ids_physical": physical_ids,
        "hint": _hint(cluster.visible),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(_table(cluster, report))
    return 0


def _table(cluster: Cluster, report: dict) -> str:
    value = "unset" if report["visible"] is None else repr(report["visible"])
    if report["visible_from"] == "environment":
        value += " (from the environment; --visible overrides it)"
    lines = [f"{cluster.name}: {cluster.n_physical} x {cluster.gpu.display_name}; "
             f"CUDA_VISIBLE_DEVICES {value}", ""]
    memory = format_bytes(cluster.gpu.memory_bytes)
    lines += [f"  cuda:{i}  ->  GPU {p} ({cluster.gpu.display_name}, {memory})"
              for i, p in enumerate(cluster.visible)]
    if not cluster.visible:
        lines.append("  (no devices visible)")
    hidden = [p for p in range(cluster.n_physical) if p not in cluster.visible]
    if hidden:
        lines.append(f"  hidden from this process: GPU {', '.join(map(str, hidden))}")
    lines += [f"warning: {w}" for w in report["warnings"]]
    if report["device_ids"] is not None:
        lines.append(f"device_ids={report['device_ids']} -> physical GPUs "
                     f"{report['device_ids_physical']}")
    lines += ["", f"hint: {report['hint']}"]
    return "\n".join(lines)


def _hint(visible: list[int]) -> str:
    if not visible:
        return "no device is visible, so no device_ids are valid"
    logical = list(range(len(visible)))
    return (f"inside this process use cuda:0..cuda:{len(visible) - 1}: "
            f"nn.DataParallel(model, device_ids={logical}) runs on physical GPUs {visible}")


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(f"--device-ids must be integers separated by commas, e.g. 0,1; "
                         f"got {text!r}") from None
