"""What every device figure draws with: the boxes and words of a device, the names of GPUs and
links as a learner reads them, and the sizes of the rows (``devicemap``, ``fabric``, ``mesh``)."""

from __future__ import annotations

import re
from typing import Any

from matplotlib.axes import Axes
from matplotlib.patches import FancyBboxPatch

from mpgpu_edu.cluster.hardware import GPUSpec
from mpgpu_edu.viz.palette import FONT_SIZE, OKABE_ITO

ARROW_COLOR = OKABE_ITO["blue"]
DEVICE_FACE, DEVICE_EDGE = "#F4F4F4", "#555555"
LOGICAL_FACE = "#EAF4FB"
HIDDEN_FACE, HIDDEN_TEXT = "#E4E4E4", "#8C8C8C"
FABRIC_FACE = "#FFF3D6"
BOX_W = 0.86          # a device box's width, in columns
LABEL_IN = 1.55       # width of the row labels on the left, in inches
PHYS_H, GAP_H = 0.55, 0.95   # heights in inches: a physical box, the arrows' gap
FABRIC_GAP, FABRIC_H = 0.5, 0.5
_LINK_NAMES = {"pcie4-x16": "PCIe 4 x16", "pcie5-x16": "PCIe 5 x16", "nvlink3": "NVLink 3",
               "nvlink4-nvswitch": "NVLink 4", "ib-hdr": "InfiniBand HDR",
               "ib-ndr": "InfiniBand NDR", "upi-xeon": "UPI socket link",
               "loopback-gloo": "gloo over TCP loopback"}


def short_gpu_name(gpu: GPUSpec | str) -> str:
    """``"RTX4090-24GB"`` -> ``"RTX 4090"``; ``"A100-80GB"`` -> ``"A100"``; ``"CPU-16GB"`` ->
    ``"CPU"``. A name with no profile passes through."""
    name = gpu.name if isinstance(gpu, GPUSpec) else gpu
    return re.sub(r"^([A-Za-z]{2,})(\d)", r"\1 \2", name.split("-")[0]) if "-" in name else name


def link_name(spec_name: str) -> str:
    """A link profile's name as a learner reads it: ``"pcie4-x16"`` -> ``"PCIe 4 x16"``."""
    return _LINK_NAMES.get(spec_name, spec_name)


def gbps(beta_bps: float) -> str:
    return f"{beta_bps / 1e9:g} GB/s"


def link_width(beta_bps: float) -> float:
    return 1.0 + 1.3 * max(0.0, (beta_bps / 1e9) ** 0.25 - 1)


def draw_box(ax: Axes, x: float, y: float, w: float, h: float, gid: str, *, face: str = DEVICE_FACE,
             edge: str = DEVICE_EDGE, dashed: bool = False) -> FancyBboxPatch:
    """A rounded box with its lower-left corner at (x, y)."""
    box = FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=0.06",
                         facecolor=face, edgecolor=edge, linewidth=1.1,
                         linestyle="--" if dashed else "-", gid=gid)
    ax.add_patch(box)
    return box


def draw_text(ax: Axes, x: float, y: float, text: str, gid: str, *, size: float = FONT_SIZE - 1,
              **kwargs: Any) -> None:
    ax.text(x, y, text, ha=kwargs.pop("ha", "center"), va=kwargs.pop("va", "center"),
            fontsize=size, gid=gid, **kwargs)
