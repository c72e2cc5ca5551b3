"""The interconnect row of a device map, above the physical GPUs: a CPU's PCIe root complex
(copies staged in host memory, which the cards share; two CPUs joined by a socket link), a PCIe
switch whose one uplink its cards share, an NVSwitch, or nodes joined by a network switch.
Each box says its effective bandwidth; a thicker line is a faster link."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.patches import Rectangle

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.viz.devicebox import (
    DEVICE_FACE, FABRIC_FACE, FABRIC_GAP, FABRIC_H, HIDDEN_TEXT, PHYS_H, draw_box, draw_text,
    gbps, link_name, link_width,
)
from mpgpu_edu.viz.palette import FONT_SIZE

def _port_lines(ax: Axes, devices: Sequence[int], y_from: float, y_to: float, beta: float,
                visible: Sequence[int], gid: str) -> None:
    for p in devices:
        ax.plot([p + 0.5, p + 0.5], [y_from, y_to], color="#333333" if p in visible else
                HIDDEN_TEXT, linewidth=link_width(beta), solid_capstyle="butt", gid=gid,
                zorder=0.5)


def draw_fabric(ax: Axes, cluster: Cluster, y: float) -> float:
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
        several = len(groups) > 1
        if topo.kind == "pcie_host_bridge":
            title = "CPU root complex"
            note = (f"{spec}: {gbps(beta)} per card; copies via host memory, "
                    f"{gbps(_share(cluster, devices, 'memory'))} shared" if several
                    else f"{spec}: {gbps(beta)} per card, each its own uplink")
        elif topo.kind == "pcie_switch":
            title = "PCIe switch"
            note = (f"{spec}: one {gbps(_share(cluster, devices, '.up'))} uplink to the CPU, "
                    f"shared by {len(devices)} cards" if several
                    else f"{spec}: {gbps(beta)} per card, to the switch")
        elif topo.kind == "uniform":
            title, note = "network", f"{spec}: {gbps(beta)} per device, own port"
        else:
            title, note = "NVSwitch", f"{spec}: {gbps(beta)} per GPU"
        if several and topo.kind in ("pcie_host_bridge", "pcie_switch"):
            title += f" {g}"
        draw_box(ax, first + 0.08, base, last - first + 0.84, FABRIC_H, f"fabric:{name}",
                 face=FABRIC_FACE if "shared" in note else DEVICE_FACE)
        draw_text(ax, (first + last + 1) / 2, base + FABRIC_H * 0.68, title, "fabric-name",
                  fontweight="bold")
        draw_text(ax, (first + last + 1) / 2, base + FABRIC_H * 0.3, note, "link-label",
                  size=FONT_SIZE - 2)
    top = base + FABRIC_H
    if topo.kind == "multi_node":
        top = _nodes(ax, cluster, y, top)
    elif topo.kind == "pcie_host_bridge" and len(groups) > 1:
        top = _host(ax, groups, top, links[-1])
    elif topo.kind == "pcie_host_bridge" and len(devices) > 1:  # one CPU
        memory = _share(cluster, devices, "memory")
        top = _above(ax, first, last, top, "host memory",
                     f"every copy between two cards is staged here: {gbps(memory)} "
                     f"shared by all", memory, "fabric:memory")
    elif topo.kind == "pcie_switch" and len(groups) == 1 and len(devices) > 1:
        uplink = _share(cluster, devices, ".up")
        top = _above(ax, first, last, top, "CPU root complex",
                     f"one x16 uplink from the switch: {gbps(uplink)} shared by "
                     f"{len(devices)} cards", uplink, "fabric:cpu")
    return top


def _above(ax: Axes, first: int, last: int, y: float, title: str, note: str, beta: float,
           gid: str) -> float:
    """One box above the fabric (whose top is ``y``) joined to it by ONE line: the shared
    resource every copy between cards goes through; returns the new top."""
    base, centre = y + FABRIC_GAP, (first + last + 1) / 2
    ax.plot([centre, centre], [y, base], color="#333333", linewidth=link_width(beta),
            solid_capstyle="butt", gid="link", zorder=0.5)
    draw_box(ax, first + 0.08, base, last - first + 0.84, FABRIC_H, gid, face=FABRIC_FACE)
    draw_text(ax, centre, base + FABRIC_H * 0.68, title, "fabric-name", fontweight="bold")
    draw_text(ax, centre, base + FABRIC_H * 0.3, note, "link-label", size=FONT_SIZE - 2)
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
        ax.plot([c, c], [y, base], color="#333333", linewidth=link_width(beta), gid="link")
    draw_box(ax, centres[0] - 1, base, centres[-1] - centres[0] + 2, FABRIC_H, "fabric:host")
    draw_text(ax, (centres[0] + centres[-1]) / 2, base + FABRIC_H / 2,
              f"between the CPUs a copy crosses the {link_name(socket.spec_name)}, "
              f"{gbps(beta)} shared", "fabric-name")
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
        draw_text(ax, first + 0.06, y + 0.06, name.replace("node", "node "), "node-name",
                  ha="left", va="bottom", fontweight="bold")
        centres.append((first + last + 1) / 2)
    beta, spec = network[0].beta_Bps, link_name(network[0].spec_name)
    nics = sum(1 for info in network if info.a == network[0].a)
    for c in centres:
        ax.plot([c, c], [y, base], color="#333333", linewidth=link_width(beta), gid="link")
    draw_box(ax, centres[0] - 1.5, base, centres[-1] - centres[0] + 3, FABRIC_H, "fabric:network",
             face=FABRIC_FACE)
    draw_text(ax, (centres[0] + centres[-1]) / 2, base + FABRIC_H * 0.68, "network switch",
              "fabric-name", fontweight="bold")
    draw_text(ax, (centres[0] + centres[-1]) / 2, base + FABRIC_H * 0.3,
              (f"{spec}: {gbps(beta)} per NIC, {nics} NICs per node, one per GPU rail"
               if nics > 1 else f"{spec}: {gbps(beta)} per node, one NIC shared by its GPUs"),
              "link-label",
              size=FONT_SIZE - 2)
    return base + FABRIC_H
