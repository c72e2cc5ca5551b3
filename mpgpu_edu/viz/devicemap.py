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

``plot_visible_devices`` draws the last two rows only, for trying CUDA_VISIBLE_DEVICES values;
``plot_mesh`` draws the ranks of a data-parallel x pipeline-parallel mesh and their groups.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch, Rectangle

from mpgpu_edu.cluster import Cluster, check_visible, parse_visible
from mpgpu_edu.hardware import GPUSpec
from mpgpu_edu.trace import CATEGORIES, Trace
from mpgpu_edu.viz.palette import (
    FONT_SIZE, MEMORY_COLORS, OKABE_ITO, WARNING_COLOR, format_bytes, new_figure,
)

if TYPE_CHECKING:  # only for the annotations: partition brings torch with it
    from mpgpu_edu.pipeline.partition import Placement, StagePlacement

MemoryPerDevice = Sequence[Mapping[str, int]] | Mapping[int, Mapping[str, int]] | Trace

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


def _gbps(beta_bps: float) -> str:
    return f"{beta_bps / 1e9:g} GB/s"


def _link_width(beta_bps: float) -> float:
    return 1.0 + 1.3 * max(0.0, (beta_bps / 1e9) ** 0.25 - 1)


def _box(ax: Axes, x: float, y: float, w: float, h: float, gid: str, *, face: str = DEVICE_FACE,
         edge: str = DEVICE_EDGE, dashed: bool = False) -> FancyBboxPatch:
    """A rounded box with its lower-left corner at (x, y)."""
    box = FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=0.06",
                         facecolor=face, edgecolor=edge, linewidth=1.1,
                         linestyle="--" if dashed else "-", gid=gid)
    ax.add_patch(box)
    return box


def _text(ax: Axes, x: float, y: float, text: str, gid: str, *, size: float = FONT_SIZE - 1,
          **kwargs: Any) -> None:
    ax.text(x, y, text, ha=kwargs.pop("ha", "center"), va=kwargs.pop("va", "center"),
            fontsize=size, gid=gid, **kwargs)


# ---- the rows ---------------------------------------------------------------------------------

def _physical_row(ax: Axes, n_physical: int, visible: Sequence[int], y: float, gpu: str,
                  noun: str = "GPU") -> None:
    for p in range(n_physical):
        shown = p in visible
        x = p + (1 - BOX_W) / 2
        _box(ax, x, y, BOX_W, PHYS_H, f"physical:{p}" if shown else f"hidden:{p}",
             face=DEVICE_FACE if shown else HIDDEN_FACE, edge=DEVICE_EDGE if shown else
             HIDDEN_TEXT, dashed=not shown)
        colour = "black" if shown else HIDDEN_TEXT
        _text(ax, p + 0.5, y + PHYS_H * 0.66, f"{noun} {p}", "physical-name", color=colour,
              fontweight="bold")
        _text(ax, p + 0.5, y + PHYS_H * 0.28, gpu if shown else "hidden", "physical-model",
              size=FONT_SIZE - 2, color=colour, style="normal" if shown else "italic")


def _logical_row(ax: Axes, visible: Sequence[int], y: float, h: float, gpu: str,
                 lines: Sequence[Sequence[str]], wide: bool, cpu: bool = False) -> None:
    """One box per logical device; ``lines[i]`` are extra lines (stages) under its name."""
    for i, p in enumerate(visible):
        _box(ax, i + (1 - BOX_W) / 2, y, BOX_W, h, f"logical:{i}", face=LOGICAL_FACE,
             edge=ARROW_COLOR)
        logical, physical = (f"rank {i}", f"process {p}") if cpu else (f"cuda:{i}", f"GPU {p}")
        name = f"{logical} = {physical}" if wide else f"{logical}\n= {physical}"
        top = y + h - 0.06
        _text(ax, i + 0.5, top, name, "logical-name", va="top", fontweight="bold",
              linespacing=1.1)
        top -= 0.2 if wide else 0.36
        _text(ax, i + 0.5, top, f"({gpu})", "logical-model", va="top", size=FONT_SIZE - 2,
              color="#444444")
        for k, line in enumerate(lines[i]):
            _text(ax, i + 0.5, top - 0.2 - 0.17 * k, line, "stage", va="top",
                  size=FONT_SIZE - 2)
    if not visible:
        _text(ax, 0.05, y + h / 2, "no device is visible: torch.cuda.device_count() == 0",
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
        _text(ax, left + 0.04, y, text, gid, ha="left", size=FONT_SIZE - 1, color="#333333",
              linespacing=1.15)


# ---- the interconnect -------------------------------------------------------------------------

def _port_lines(ax: Axes, devices: Sequence[int], y_from: float, y_to: float, beta: float,
                visible: Sequence[int], gid: str) -> None:
    for p in devices:
        ax.plot([p + 0.5, p + 0.5], [y_from, y_to], color="#333333" if p in visible else
                HIDDEN_TEXT, linewidth=_link_width(beta), solid_capstyle="butt", gid=gid,
                zorder=0.5)


def _fabric(ax: Axes, cluster: Cluster, y: float) -> float:
    """Draw the interconnect above the physical row (whose top is ``y``); returns its top."""
    topo, visible = cluster.topology, cluster.visible
    links = topo.links()
    groups = topo.groups()
    base = y + FABRIC_GAP
    for g, (name, devices) in enumerate(groups.items()):
        first, last = min(devices), max(devices)
        gpu_links = [info for info in links if info.a.startswith("gpu")
                     and int(info.a[3:]) in devices]
        beta, spec = gpu_links[0].beta_Bps, link_name(gpu_links[0].spec_name)
        _port_lines(ax, devices, y, base, beta, visible, "link")
        if topo.kind == "pcie_host_bridge":
            memory = _share(cluster, devices, "memory")
            title = "CPU root complex" + (f" {g}" if len(groups) > 1 else "")
            note = (f"{spec}: {_gbps(beta)} per card, each its own uplink" if len(groups) == 1
                    else f"{spec}: {_gbps(beta)} per card; copies via host memory, "
                    f"{_gbps(memory)} shared")
        elif topo.kind == "pcie_switch":
            uplink = _share(cluster, devices, ".up")
            title = "PCIe switch" + (f" {g}" if len(groups) > 1 else "")
            note = (f"{spec}: {_gbps(beta)} per card, to the switch" if len(groups) == 1
                    else f"{spec}: one {_gbps(uplink)} uplink to the CPU, shared by "
                    f"{len(devices)} cards")
        elif topo.kind == "uniform":
            title, note = "network", f"{spec}: {_gbps(beta)} per device, own port"
        else:
            title, note = "NVSwitch", f"{spec}: {_gbps(beta)} per GPU"
        _box(ax, first + 0.08, base, last - first + 0.84, FABRIC_H, f"fabric:{name}",
             face=FABRIC_FACE if "shared" in note else DEVICE_FACE)
        _text(ax, (first + last + 1) / 2, base + FABRIC_H * 0.68, title, "fabric-name",
              fontweight="bold")
        _text(ax, (first + last + 1) / 2, base + FABRIC_H * 0.3, note, "link-label",
              size=FONT_SIZE - 2)
    top = base + FABRIC_H
    if topo.kind == "multi_node":
        top = _nodes(ax, cluster, y, top)
    elif topo.kind == "pcie_host_bridge" and len(groups) > 1:
        top = _host(ax, groups, top, links[-1])
    elif topo.kind == "pcie_host_bridge" and len(devices) > 1:  # one CPU
        memory = _share(cluster, devices, "memory")
        top = _above(ax, first, last, top, "host memory",
                     f"every copy between two cards is staged here: {_gbps(memory)} "
                     f"shared by all", memory, "fabric:memory")
    elif topo.kind == "pcie_switch" and len(groups) == 1 and len(devices) > 1:
        uplink = _share(cluster, devices, ".up")
        top = _above(ax, first, last, top, "CPU root complex",
                     f"one x16 uplink from the switch: {_gbps(uplink)} shared by "
                     f"{len(devices)} cards", uplink, "fabric:cpu")
    return top


def _above(ax: Axes, first: int, last: int, y: float, title: str, note: str, beta: float,
           gid: str) -> float:
    """One box above the fabric (whose top is ``y``) joined to it by ONE line: the shared
    resource every copy between cards goes through; returns the new top."""
    base, centre = y + FABRIC_GAP, (first + last + 1) / 2
    ax.plot([centre, centre], [y, base], color="#333333", linewidth=_link_width(beta),
            solid_capstyle="butt", gid="link", zorder=0.5)
    _box(ax, first + 0.08, base, last - first + 0.84, FABRIC_H, gid, face=FABRIC_FACE)
    _text(ax, centre, base + FABRIC_H * 0.68, title, "fabric-name", fontweight="bold")
    _text(ax, centre, base + FABRIC_H * 0.3, note, "link-label", size=FONT_SIZE - 2)
    return base + FABRIC_H


def _share(cluster: Cluster, devices: Sequence[int], part: str) -> float:
    """The cap (bytes/s) of the shared resource whose name contains ``part`` on a copy between
    two cards of ``devices`` (host memory, a switch uplink); 0 if there is none."""
    if len(devices) < 2:
        return 0.0
    route = cluster.topology.route(devices[0], devices[1])
    return next((cap for name, cap in route.shares if part in name), 0.0)


def _host(ax: Axes, groups: Mapping[str, Sequence[int]], y: float, socket: Any) -> float:
    """Two CPUs: a copy between their cards also crosses the socket link (``socket``, a
    ``LinkInfo``), shared by every copy between the sockets in that direction."""
    beta = socket.beta_Bps
    base = y + FABRIC_GAP
    centres = [(min(d) + max(d) + 1) / 2 for d in groups.values()]
    for c in centres:
        ax.plot([c, c], [y, base], color="#333333", linewidth=_link_width(beta), gid="link")
    _box(ax, centres[0] - 1, base, centres[-1] - centres[0] + 2, FABRIC_H, "fabric:host")
    _text(ax, (centres[0] + centres[-1]) / 2, base + FABRIC_H / 2,
          f"between the CPUs a copy crosses the {link_name(socket.spec_name)}, "
          f"{_gbps(beta)} shared", "fabric-name")
    return base + FABRIC_H


def _nodes(ax: Axes, cluster: Cluster, y_physical_top: float, y: float) -> float:
    """Node boxes around each node's GPUs and switch, joined by the network link."""
    network = [info for info in cluster.topology.links() if info.b == "network"]
    base = y + FABRIC_GAP + 0.15
    groups = cluster.topology.groups()
    centres = []
    for name, devices in groups.items():
        first, last = min(devices), max(devices)
        bottom = y_physical_top - PHYS_H - 0.12
        ax.add_patch(Rectangle((first + 0.02, bottom), last - first + 0.96, y - bottom + 0.12,
                               facecolor="none", edgecolor="#777777", linewidth=1.2,
                               linestyle=":", gid=f"node:{name}"))
        _text(ax, first + 0.06, y + 0.06, name.replace("node", "node "), "node-name",
              ha="left", va="bottom", fontweight="bold")
        centres.append((first + last + 1) / 2)
    beta, spec = network[0].beta_Bps, link_name(network[0].spec_name)
    nics = sum(1 for info in network if info.a == network[0].a)
    for c in centres:
        ax.plot([c, c], [y, base], color="#333333", linewidth=_link_width(beta), gid="link")
    _box(ax, centres[0] - 1.5, base, centres[-1] - centres[0] + 3, FABRIC_H, "fabric:network",
         face=FABRIC_FACE)
    _text(ax, (centres[0] + centres[-1]) / 2, base + FABRIC_H * 0.68, "network switch",
          "fabric-name", fontweight="bold")
    _text(ax, (centres[0] + centres[-1]) / 2, base + FABRIC_H * 0.3,
          (f"{spec}: {_gbps(beta)} per NIC, {nics} NICs per node, one per GPU rail"
           if nics > 1 else f"{spec}: {_gbps(beta)} per node, one NIC shared by its GPUs"),
          "link-label",
          size=FONT_SIZE - 2)
    return base + FABRIC_H


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
    _text(ax, i + 0.5, y - 0.04, text, "memory-label", va="top", size=FONT_SIZE - 2,
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
    _fabric(ax, cluster, y_phys + PHYS_H)
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
        _text(ax, left + 0.04, base - 0.12, "\n".join("! " + w for w in wrapped), "warnings",
              ha="left", va="top", size=FONT_SIZE - 2, color=WARNING_COLOR,
              bbox={"facecolor": "#FFF0F0", "edgecolor": WARNING_COLOR, "pad": 4})
    shown = "unset" if visible_value is None else repr(visible_value)
    mapping = (", ".join(f"cuda:{i} = GPU {p}" for i, p in enumerate(visible))
               or "no device is visible")
    ax.set_title(f"CUDA_VISIBLE_DEVICES={shown} on {n_physical} GPUs: "
                 f"torch.cuda.device_count() == {len(visible)}\n{mapping}", loc="left",
                 fontsize=FONT_SIZE + 1)
    return ax.figure


# ---- a DP x PP mesh ---------------------------------------------------------------------------

def mesh_coords(mesh: Any) -> dict[int, tuple[int, int]]:
    """``{rank: (dp index, pp index)}`` of a mesh with ``dp`` and ``pp`` sizes. Uses the mesh's
    own ``coords(rank)`` when it has one; otherwise ranks run along the pipeline first
    (rank = dp index * pp + pp index), so one replica's stages are neighbours."""
    dp, pp = int(mesh.dp), int(mesh.pp)
    if dp < 1 or pp < 1:
        raise ValueError(f"a mesh needs dp >= 1 and pp >= 1, got dp={dp}, pp={pp}")
    if callable(getattr(mesh, "coords", None)):
        return {r: tuple(mesh.coords(r)) for r in range(dp * pp)}
    return {d * pp + p: (d, p) for d in range(dp) for p in range(pp)}


def plot_mesh(mesh: Any) -> Figure:
    """The ranks of a DP x PP mesh as a grid: a column per pipeline stage (pp index), a row per
    replica (dp index), each box "rank r / dp d, pp p". A pp group (one replica's pipeline,
    which passes activations along) is outlined along its row; a dp group (one stage's
    replicas, which all-reduce that stage's gradients) along its column."""
    coords = mesh_coords(mesh)
    dp, pp = int(mesh.dp), int(mesh.pp)
    ax = new_figure(1.6 * pp + 2.6, 0.95 * dp + 1.6).add_subplot()
    pp_colour, dp_colour = OKABE_ITO["vermillion"], OKABE_ITO["bluish_green"]
    for rank, (d, p) in coords.items():
        y = dp - 1 - d
        _box(ax, p + 0.12, y + 0.16, 0.76, 0.68, f"rank:{rank}", face=LOGICAL_FACE,
             edge=ARROW_COLOR)
        _text(ax, p + 0.5, y + 0.6, f"rank {rank}", "rank-name", fontweight="bold")
        _text(ax, p + 0.5, y + 0.36, f"dp {d}, pp {p}", "rank-coords", size=FONT_SIZE - 2)
    for d in range(dp):
        ax.add_patch(Rectangle((0.05, dp - 1 - d + 0.1), pp - 0.1, 0.8, facecolor="none",
                               edgecolor=pp_colour, linewidth=1.6, gid=f"pp-group:{d}"))
        for p in range(pp - 1):
            ax.add_patch(FancyArrowPatch((p + 0.88, dp - 0.5 - d), (p + 1.12, dp - 0.5 - d),
                                         arrowstyle="-|>", mutation_scale=10, color=pp_colour))
    for p in range(pp):
        ax.add_patch(Rectangle((p + 0.08, 0.05), 0.84, dp - 0.1, facecolor="none",
                               edgecolor=dp_colour, linewidth=1.6, linestyle="--",
                               gid=f"dp-group:{p}"))
    ax.set_xlim(-0.05, pp + 0.05)
    ax.set_ylim(-0.05, dp + 0.05)
    ax.set_xticks([p + 0.5 for p in range(pp)], [f"stage {p}" for p in range(pp)])
    ax.set_yticks([dp - 0.5 - d for d in range(dp)], [f"replica {d}" for d in range(dp)])
    ax.tick_params(length=0, labelsize=FONT_SIZE - 1, top=True, labeltop=True, bottom=False,
                   labelbottom=False)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.legend(handles=[
        Patch(facecolor="none", edgecolor=pp_colour, linewidth=1.6,
              label="pp group: one replica's pipeline (sends activations, gradients)"),
        Patch(facecolor="none", edgecolor=dp_colour, linewidth=1.6, linestyle="--",
              label="dp group: one stage's replicas (all-reduce its gradients)")],
        loc="upper left", bbox_to_anchor=(0.0, 0.0), frameon=False, fontsize=FONT_SIZE - 1)
    ax.set_title(f"{dp} x {pp} mesh: {dp} data-parallel replicas of a {pp}-stage pipeline, "
                 f"{dp * pp} ranks", loc="left", fontsize=FONT_SIZE + 1, pad=16)
    return ax.figure
