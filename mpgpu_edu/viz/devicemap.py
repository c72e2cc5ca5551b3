"""Device maps: where each piece lives, what wires the devices together, what the process sees.

``plot_device_map`` draws three rows, top to bottom:

- the interconnect, labelled with its effective bandwidth: a CPU's PCIe root complex, where
  every card has its own uplink but GPU-to-GPU copies are staged in host memory, which they
  *share* (two CPUs are joined by a slower socket link); a PCIe switch whose one uplink its
  cards *share*; an NVSwitch with its own port per GPU; or nodes joined by InfiniBand, one
  NIC per GPU rail. A thicker line is a faster link;
- the physical GPUs, numbered as ``nvidia-smi`` numbers them; the ones CUDA_VISIBLE_DEVICES
  hides are greyed out;
- the logical devices ``cuda:0, cuda:1, ...`` the process sees, each with an arrow from the
  physical GPU behind it, and what is placed on it: a pipeline stage's layers, parameters and
  bytes, and (``memory=``) what the device holds against its capacity.

``plot_visible_devices`` draws the last two rows only, for trying CUDA_VISIBLE_DEVICES values.
The interconnect row is ``fabric``'s; a DP x PP mesh is ``mesh.plot_mesh``.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from mpgpu_edu.cluster import Cluster, check_visible, parse_visible
from mpgpu_edu.cluster.trace import CATEGORIES, Trace
from mpgpu_edu.viz.devicebox import (
    ARROW_COLOR, BOX_W, DEVICE_EDGE, DEVICE_FACE, FABRIC_GAP, FABRIC_H, GAP_H, HIDDEN_FACE,
    HIDDEN_TEXT, LABEL_IN, LOGICAL_FACE, PHYS_H, draw_box, draw_text, short_gpu_name,
)
from mpgpu_edu.viz.fabric import draw_fabric
from mpgpu_edu.viz.palette import (
    FONT_SIZE, MEMORY_COLORS, WARNING_COLOR, format_bytes, new_figure,
)

if TYPE_CHECKING:  # only for the annotations: partition brings torch with it
    from mpgpu_edu.pipeline.partition import Placement, StagePlacement

MemoryPerDevice = Sequence[Mapping[str, int]] | Mapping[int, Mapping[str, int]] | Trace


# ---- the rows ---------------------------------------------------------------------------------

def _physical_row(ax: Axes, n_physical: int, visible: Sequence[int], y: float, gpu: str,
                  noun: str = "GPU") -> None:
    for p in range(n_physical):
        shown = p in visible
        x = p + (1 - BOX_W) / 2
        draw_box(ax, x, y, BOX_W, PHYS_H, f"physical:{p}" if shown else f"hidden:{p}",
                 face=DEVICE_FACE if shown else HIDDEN_FACE, edge=DEVICE_EDGE if shown else
                 HIDDEN_TEXT, dashed=not shown)
        colour = "black" if shown else HIDDEN_TEXT
        draw_text(ax, p + 0.5, y + PHYS_H * 0.66, f"{noun} {p}", "physical-name", color=colour,
                  fontweight="bold")
        draw_text(ax, p + 0.5, y + PHYS_H * 0.28, gpu if shown else "hidden", "physical-model",
                  size=FONT_SIZE - 2, color=colour, style="normal" if shown else "italic")


def _logical_row(ax: Axes, visible: Sequence[int], y: float, h: float, gpu: str,
                 lines: Sequence[Sequence[str]], wide: bool, cpu: bool = False) -> None:
    """One box per logical device; ``lines[i]`` are extra lines (stages) under its name."""
    for i, p in enumerate(visible):
        draw_box(ax, i + (1 - BOX_W) / 2, y, BOX_W, h, f"logical:{i}", face=LOGICAL_FACE,
                 edge=ARROW_COLOR)
        logical, physical = (f"rank {i}", f"process {p}") if cpu else (f"cuda:{i}", f"GPU {p}")
        name = f"{logical} = {physical}" if wide else f"{logical}\n= {physical}"
        top = y + h - 0.06
        draw_text(ax, i + 0.5, top, name, "logical-name", va="top", fontweight="bold",
                  linespacing=1.1)
        top -= 0.2 if wide else 0.36
        draw_text(ax, i + 0.5, top, f"({gpu})", "logical-model", va="top", size=FONT_SIZE - 2,
                  color="#444444")
        for k, line in enumerate(lines[i]):
            draw_text(ax, i + 0.5, top - 0.2 - 0.17 * k, line, "stage", va="top",
                      size=FONT_SIZE - 2)
    if not visible:
        draw_text(ax, 0.05, y + h / 2, "no device is visible: torch.cuda.device_count() == 0",
                  "no-devices", ha="left", color=WARNING_COLOR, fontweight="bold")


def _arrows(ax: Axes, visible: Sequence[int], y_logical_top: float, y_physical: float) -> None:
    for i, p in enumerate(visible):
        ax.add_patch(FancyArrowPatch((p + 0.5, y_physical - 0.02), (i + 0.5, y_logical_top + 0.02),
                                     arrowstyle="-|>", mutation_scale=14, linewidth=1.6,
                                     color=ARROW_COLOR, gid=f"arrow:{p}->{i}"))


def _visible_text(value: str | None) -> str:
    if value is None:
        return "CUDA_VISIBLE_DEVICES unset:\nevery GPU, same order"
    return f"CUDA_VISIBLE_DEVICES\n= {value!r}"


def _row_labels(ax: Axes, left: float, labels: Sequence[tuple[float, str, str]]) -> None:
    for y, text, gid in labels:
        draw_text(ax, left + 0.04, y, text, gid, ha="left", size=FONT_SIZE - 1, color="#333333",
                  linespacing=1.15)


# ---- what is placed on each device ------------------------------------------------------------

def format_count(n: int) -> str:
    """``1_234_567`` -> ``"1.23 M"``; ``512`` -> ``"512"``."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return str(n)


def _layers_text(names: Sequence[str]) -> str:
    if len(names) == 1:
        return f"layer {names[0]}"
    return f"layers {names[0]}-{names[-1]}"


def _stage_lines(placement: Placement | None, world_size: int) -> list[list[str]]:
    lines: list[list[str]] = [[] for _ in range(world_size)]
    for stage in placement.stages if placement else ():
        if not 0 <= stage.device < world_size:
            raise ValueError(f"stage {stage.stage} is placed on cuda:{stage.device}, but only "
                             f"{world_size} devices are visible (cuda:0..cuda:{world_size - 1})")
        lines[stage.device] += _one_stage(stage)
    return lines


def _one_stage(stage: StagePlacement) -> list[str]:
    return [f"stage {stage.stage}: {_layers_text(stage.layers)}",
            f"{format_count(stage.n_params)} params, {format_bytes(stage.param_bytes)}"]


def _per_device_memory(memory: MemoryPerDevice, world_size: int) -> list[dict[str, int]]:
    if isinstance(memory, Trace):
        return [memory.peak_memory_by_category(d) for d in range(world_size)]
    if isinstance(memory, Mapping):
        return [dict(memory.get(d, {})) for d in range(world_size)]
    if len(memory) != world_size:
        raise ValueError(f"memory has {len(memory)} entries for {world_size} visible devices")
    return [dict(m) for m in memory]


def _memory_bar(ax: Axes, i: int, y: float, held: Mapping[str, int], capacity: int) -> None:
    """A bar the width of the device's capacity, filled by category, and "x of capacity"."""
    width, left = BOX_W * 0.86, i + 0.5 - BOX_W * 0.43
    total = sum(held.values())
    x = left
    for category in [c for c in CATEGORIES if held.get(c)] + sorted(set(held) - set(CATEGORIES)):
        w = width * min(held[category] / capacity, (left + width - x) / width)
        ax.add_patch(Rectangle((x, y), w, 0.13, facecolor=MEMORY_COLORS.get(category, "#999999"),
                               edgecolor="none", gid=f"memory:{category}"))
        x += w
    ax.add_patch(Rectangle((left, y), width, 0.13, facecolor="none", edgecolor="black",
                           linewidth=0.8, gid="capacity"))
    oom = total > capacity
    share = total / capacity
    text = (f"{format_bytes(total)} of {format_bytes(capacity)} "
            + ("OOM" if oom else f"({share:.0%})" if share >= 0.01 or not total else "(<1%)"))
    draw_text(ax, i + 0.5, y - 0.04, text, "memory-label", va="top", size=FONT_SIZE - 2,
              color=WARNING_COLOR if oom else "black", fontweight="bold" if oom else "normal")


def _memory_legend(ax: Axes, held: Sequence[Mapping[str, int]]) -> None:
    present = [c for c in CATEGORIES if any(m.get(c) for m in held)]
    handles = [Patch(color=MEMORY_COLORS[c], label=c) for c in present]
    handles.append(Patch(facecolor="none", edgecolor="black", label="bar width = capacity"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, 0.0), ncol=len(handles),
              frameon=False, fontsize=FONT_SIZE - 2, handlelength=1.2)


# ---- the figures ------------------------------------------------------------------------------

def _canvas(n_cols: int, col_in: float, height_in: float) -> tuple[Axes, float]:
    """A figure with one axes whose x unit is a device column and whose y unit is an inch;
    returns the axes and the x where the row labels start (left of column 0)."""
    left = -LABEL_IN / col_in
    ax = new_figure(LABEL_IN + n_cols * col_in + 0.2, height_in + 0.6).add_subplot()
    ax.set_xlim(left, n_cols + 0.05)
    ax.set_ylim(-0.05, height_in)
    ax.axis("off")
    return ax, left


def plot_device_map(cluster: Cluster, placement: Placement | None = None, *,
                    memory: MemoryPerDevice | None = None, title: str | None = None) -> Figure:
    """The cluster's interconnect, its physical GPUs, the logical ``cuda:i`` devices the process
    sees (arrows from the GPU behind each) and, from ``placement``, each pipeline stage's layers,
    parameters and parameter bytes on its device. ``memory`` (per logical device ``{category:
    bytes}``, or a Trace whose peak per device is used) adds a bar per device against its
    capacity. Logical ids are the cluster's: stage p on ``cuda:p``, which is physical GPU
    ``cluster.physical(p)``."""
    visible, n = cluster.visible, cluster.n_physical
    lines = _stage_lines(placement, cluster.world_size)
    held = _per_device_memory(memory, cluster.world_size) if memory is not None else None
    col_in = (1.8 if n <= 8 else 1.5) if placement or held else (1.5 if n <= 8 else 1.05)
    wide = col_in >= 1.5  # room for "cuda:0 = GPU 2" on one line
    logical_h = 0.62 + 0.17 * max(map(len, lines), default=0) + (0.42 if held else 0)
    logical_h += 0.0 if wide else 0.16
    y_phys = 0.1 + logical_h + GAP_H
    extra = {"multi_node": 2.2, "pcie_host_bridge": 2.3, "pcie_switch": 2.3,
             }.get(cluster.topology.kind, 1.1)
    ax, left = _canvas(n, col_in, y_phys + PHYS_H + extra)
    gpu = short_gpu_name(cluster.gpu)
    cpu = gpu == "CPU"  # the gloo presets: one CPU process per rank, no CUDA involved
    draw_fabric(ax, cluster, y_phys + PHYS_H)
    _physical_row(ax, n, visible, y_phys, gpu, "process" if cpu else "GPU")
    _arrows(ax, visible, 0.1 + logical_h, y_phys)
    _logical_row(ax, visible, 0.1, logical_h, gpu, lines, wide, cpu)
    for i, device_memory in enumerate(held or []):
        _memory_bar(ax, i, 0.32, device_memory, cluster.capacity_bytes(i))
    if held:
        _memory_legend(ax, held)
    names = (("processes", "one process per rank", "ranks") if cpu else
             ("physical GPUs\n(nvidia-smi ids)", _visible_text(cluster.visible_value),
              "logical devices\n(what PyTorch sees)"))
    _row_labels(ax, left, [(y_phys + PHYS_H + FABRIC_GAP + FABRIC_H / 2, "interconnect",
                            "row-label"), (y_phys + PHYS_H / 2, names[0], "row-label"),
                           (0.1 + logical_h + GAP_H / 2, names[1], "visible-label"),
                           (0.1 + logical_h / 2, names[2], "row-label")])
    if title is None:
        title = (f"{cluster.name}: {n} x {cluster.gpu.display_name} "
                 f"({format_bytes(cluster.gpu.memory_bytes)} each), "
                 f"{cluster.world_size} visible")
        if placement is not None:
            title += f"; a pipeline of {placement.n_stages} stages"
    ax.set_title(title, loc="left", fontsize=FONT_SIZE + 1)
    return ax.figure


def plot_visible_devices(n_physical: int, visible_value: str | None,
                         gpu_name: str = "") -> Figure:
    """What ``CUDA_VISIBLE_DEVICES=visible_value`` does on a machine of ``n_physical`` GPUs:
    the physical row, the logical ``cuda:i`` row, an arrow from each visible GPU to its new
    number, and below, every warning ``check_visible`` has about the value."""
    visible = parse_visible(visible_value, n_physical)
    warnings = check_visible(visible_value, n_physical)
    gpu = short_gpu_name(gpu_name) if gpu_name else "GPU"
    col_in = 1.5 if n_physical <= 8 else 1.05
    wrapped = [textwrap.fill(w, width=max(40, int((LABEL_IN + n_physical * col_in) * 13)))
               for w in warnings]
    warn_h = 0.25 + 0.19 * sum(w.count("\n") + 1 for w in wrapped) if warnings else 0.0
    logical_h = 0.62 if n_physical <= 8 else 0.78
    base = 0.1 + warn_h
    y_phys = base + logical_h + GAP_H
    ax, left = _canvas(n_physical, col_in, y_phys + PHYS_H + 0.15)
    _physical_row(ax, n_physical, visible, y_phys, gpu)
    _arrows(ax, visible, base + logical_h, y_phys)
    _logical_row(ax, visible, base, logical_h, gpu, [[] for _ in visible], n_physical <= 8)
    _row_labels(ax, left, [(y_phys + PHYS_H / 2, "physical GPUs\n(nvidia-smi ids)", "row-label"),
                           (base + logical_h + GAP_H / 2, _visible_text(visible_value),
                            "visible-label"),
                           (base + logical_h / 2, "logical devices\n(what PyTorch sees)",
                            "row-label")])
    if warnings:
        draw_text(ax, left + 0.04, base - 0.12, "\n".join("! " + w for w in wrapped), "warnings",
                  ha="left", va="top", size=FONT_SIZE - 2, color=WARNING_COLOR,
                  bbox={"facecolor": "#FFF0F0", "edgecolor": WARNING_COLOR, "pad": 4})
    shown = "unset" if visible_value is None else repr(visible_value)
    mapping = (", ".join(f"cuda:{i} = GPU {p}" for i, p in enumerate(visible))
               or "no device is visible")
    ax.set_title(f"CUDA_VISIBLE_DEVICES={shown} on {n_physical} GPUs: "
                 f"torch.cuda.device_count() == {len(visible)}\n{mapping}", loc="left",
                 fontsize=FONT_SIZE + 1)
    return ax.figure
