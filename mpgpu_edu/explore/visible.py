"""The CUDA_VISIBLE_DEVICES sandbox: type a value, see which physical GPUs become ``cuda:0``,
``cuda:1``, ... and what CUDA would silently ignore.

    fig, info = visible_view("2,3", n_physical=4)
    info["visible"], info["device_count"]       # [2, 3], 2
"""

from __future__ import annotations

import ipywidgets as widgets
from matplotlib.figure import Figure

from mpgpu_edu.cluster import check_visible, parse_visible
from mpgpu_edu.explore.live import Explorer, dropdown, slider
from mpgpu_edu.cluster.hardware import GPUS
from mpgpu_edu.viz.devicemap import plot_visible_devices


def visible_view(value: str | None = "2,3", n_physical: int = 4,
                 gpu: str = "RTX4090-24GB") -> tuple[Figure, dict]:
    """The mapping ``CUDA_VISIBLE_DEVICES=value`` gives on ``n_physical`` GPUs (``value=None``:
    the variable is unset). Returns ``(figure, info)``; ``info`` holds ``visible`` (physical
    ids in logical order), ``device_count``, ``mapping`` ({"cuda:i": physical id}) and
    ``warnings``."""
    if n_physical < 0:
        raise ValueError(f"n_physical must be >= 0, got {n_physical}")
    visible = parse_visible(value, n_physical)
    info = {"value": value, "n_physical": n_physical, "visible": visible,
            "device_count": len(visible),
            "mapping": {f"cuda:{i}": p for i, p in enumerate(visible)},
            "warnings": check_visible(value, n_physical)}
    return plot_visible_devices(n_physical, value, gpu), info


def describe(info: dict) -> str:
    mapping = ", ".join(f"{k} = GPU {p}" for k, p in info["mapping"].items()) or "none"
    return (f"<b>torch.cuda.device_count()</b> == {info['device_count']} &nbsp; "
            f"<b>logical devices</b>: {mapping}")


def _sandbox_view(value: str, unset: bool, n_physical: int, gpu: str) -> tuple[Figure, dict]:
    return visible_view(None if unset else value, n_physical, gpu)


def visible_devices_sandbox(value: str = "2,3", n_physical: int = 4) -> Explorer:
    """A text box for the value (applied on Enter), a switch for "unset", a slider for the
    machine's GPUs: the map from physical GPUs to ``cuda:i`` redraws on every change.
    Try "3,1", "1,1", "0,2,-1,1", "1gpu", ""."""
    controls = {
        "value": widgets.Text(value=value, description="CUDA_VISIBLE_DEVICES=",
                              continuous_update=False, style={"description_width": "initial"}),
        "unset": widgets.Checkbox(value=False, description="unset (not set at all)"),
        "n_physical": slider("physical GPUs", n_physical, 1, 16),
        "gpu": dropdown("gpu", list(GPUS), "RTX4090-24GB"),
    }
    return Explorer(_sandbox_view, controls, describe)
