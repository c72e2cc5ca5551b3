"""The device map of several nodes: hosts, NIC rails, GPUs, and every rank's three numbers.

``plot_node_map`` draws each node as a box holding its NVSwitch, its GPUs and its NICs (one
per GPU: GPU i of every node is on *rail* i), and the network between the nodes as a
rail-optimised fabric: NIC i of every node on rail i's switch, the rail switches joined by a
spine. A hop along one rail (NIC i to NIC i) crosses one switch; a hop between rails (NIC 7 of
one node to NIC 0 of the other) goes up through the spine, or, with NCCL's PXN, first over
NVLink to the sender's GPU on the receiver's rail. The simulator (``topology.multi_node``)
treats the fabric as non-blocking: any hop holds the sender's NIC and the receiver's NIC and
costs the same, rail or not.

Each GPU says which process runs on it under ``torchrun``: ``cuda:j`` (its index under that
node's ``CUDA_VISIBLE_DEVICES``), the local rank j and the global rank ``node x
nproc_per_node + local rank``. GPUs that ``CUDA_VISIBLE_DEVICES`` hides are grey. When local
rank j sits on different GPUs (so different NICs) on the two nodes, its NICs are outlined in
red and a line says that local rank j's ranks are not one rail.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from mpgpu_edu.cluster import Cluster, parse_visible
from mpgpu_edu.viz.devicebox import link_name, short_gpu_name
from mpgpu_edu.viz.palette import FONT_SIZE, OKABE_ITO, WARNING_COLOR, new_figure

GPU_FACE, GPU_EDGE = "#EAF4FB", "#555555"
HIDDEN_FACE, HIDDEN_TEXT = "#E4E4E4", "#8C8C8C"
NIC_FACE, SWITCH_FACE, NODE_EDGE = "#FDE8D8", "#FFF3D6", "#777777"
RAIL_COLOR = OKABE_ITO["vermillion"]
GPU_H, NIC_H, SWITCH_H, GAP = 1.15, 0.42, 0.36, 0.32
NODE_H = SWITCH_H + GPU_H + NIC_H + 4 * GAP + 0.35
NETWORK_H = 1.5
SPINE_W = 1.25  # the spine's box, right of the GPUs


def node_shape(cluster: Cluster) -> tuple[int, int]:
    """(nodes, GPUs per node) of a cluster: ``(1, n)`` unless it has several nodes."""
    nodes = [g for name, g in cluster.topology.groups().items() if name.startswith("node")]
    if cluster.topology.kind != "multi_node" or len(nodes) < 2:
        return 1, cluster.n_physical
    return len(nodes), len(nodes[0])


def global_rank(node: int, local_rank: int, nproc_per_node: int) -> int:
    """``node x nproc_per_node + local_rank``: torchrun's numbering of the whole job."""
    return node * nproc_per_node + local_rank


def _box(ax: Axes, x: float, y: float, w: float, h: float, face: str, gid: str,
         edge: str = GPU_EDGE, style: str = "-", width: float = 1.0) -> None:
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=0.06",
                                facecolor=face, edgecolor=edge, linewidth=width,
                                linestyle=style, gid=gid, zorder=2))


def _text(ax: Axes, x: float, y: float, text: str, gid: str, **kw: object) -> None:
    kw.setdefault("ha", "center")
    kw.setdefault("va", "center")
    kw.setdefault("fontsize", FONT_SIZE - 1)
    ax.text(x, y, text, gid=gid, **kw)


def _node(ax: Axes, cluster: Cluster, k: int, per_node: int, y: float, visible: list[int],
          nproc: int, flip: bool, off_rail: set[int]) -> float:
    """Node k's box with its bottom at y; returns the y of its NICs' edge facing the network."""
    gpu = short_gpu_name(cluster.gpu)
    intra = [i for i in cluster.topology.links() if i.b == f"node{k}.nvswitch"][0]
    _box(ax, -0.1, y, per_node + 0.2, NODE_H, "none", f"node:{k}", NODE_EDGE, ":")
    rows = [("switch", SWITCH_H), ("gpu", GPU_H), ("nic", NIC_H)]
    rows = rows[::-1] if flip else rows  # the NICs face the network between the nodes
    top = y + NODE_H - (0.0 if flip else 0.35)  # the title sits away from the network
    where: dict[str, float] = {}
    for name, h in rows:
        top -= GAP
        where[name] = top - h
        top -= h
    value = ",".join(map(str, visible))
    title_y = y + 0.17 if flip else y + NODE_H - 0.17
    _text(ax, -0.02, title_y, f"node {k}: host {k}, torchrun --node-rank {k} "
          f"--nproc-per-node {nproc}, CUDA_VISIBLE_DEVICES={value}", f"node-title:{k}",
          ha="left", fontweight="bold", fontsize=FONT_SIZE)
    ys = where["switch"]
    _box(ax, 0.05, ys, per_node - 0.1, SWITCH_H, SWITCH_FACE, f"switch:{k}")
    _text(ax, per_node / 2, ys + SWITCH_H / 2, f"NVSwitch: {link_name(intra.spec_name)}, "
          f"{intra.beta_Bps / 1e9:g} GB/s per GPU", "switch-label")
    yg, yn = where["gpu"], where["nic"]
    for g in range(per_node):
        local = visible.index(g) if g in visible else None
        shown = local is not None and local < nproc
        x = g + 0.07
        sw_edge = ys + (SWITCH_H if yg > ys else 0)
        g_edge = yg + (0 if yg > ys else GPU_H)
        ax.plot([g + 0.5] * 2, [sw_edge, g_edge], color="#333333", linewidth=1.6)
        n_edge = yn + (NIC_H if yg > yn else 0)
        ax.plot([g + 0.5] * 2, [yg + (0 if yg > yn else GPU_H), n_edge], color="#333333",
                linewidth=0.9)
        _box(ax, x, yg, 0.86, GPU_H, GPU_FACE if shown else HIDDEN_FACE, f"gpu:{k}:{g}")
        color = "black" if shown else HIDDEN_TEXT
        _text(ax, g + 0.5, yg + GPU_H - 0.2, f"{gpu} {g}", "gpu-name", fontweight="bold",
              color=color)
        if shown:
            lines = [f"cuda:{local}", f"local rank {local}",
                     f"rank {global_rank(k, local, nproc)}"]
            for i, line in enumerate(lines):
                _text(ax, g + 0.5, yg + GPU_H - 0.47 - 0.24 * i, line, "rank-label",
                      fontsize=FONT_SIZE - 2, fontweight="bold" if i == 2 else "normal")
        else:
            _text(ax, g + 0.5, yg + GPU_H / 2 - 0.15, "not visible", "hidden-label",
                  fontsize=FONT_SIZE - 2, color=HIDDEN_TEXT)
        flagged = shown and local in off_rail
        _box(ax, x + 0.08, yn, 0.7, NIC_H, NIC_FACE, f"nic:{k}:{g}",
             WARNING_COLOR if flagged else RAIL_COLOR, width=2.6 if flagged else 1.0)
        _text(ax, g + 0.5, yn + NIC_H / 2, f"NIC {g}" + (f"\nlocal rank {local}" if flagged
                                                          else ""), "nic-label",
              fontsize=FONT_SIZE - 3 if flagged else FONT_SIZE - 2,
              color=WARNING_COLOR if flagged else "black")
    return (yn + NIC_H) if flip else yn


def plot_node_map(cluster: Cluster | str = "2x8xH100-ib", nproc_per_node: int | None = None,
                  visible: Sequence[str] | None = None, *, title: str | None = None) -> Figure:
    """Every node of a multi-node cluster (a preset name or a ``Cluster``): its NVSwitch, GPUs
    and NICs, the network joining NIC i of every node (rail i), and for each GPU the process
    torchrun puts on it: ``cuda:j``, local rank j, global rank ``node x nproc_per_node + j``.
    ``visible[k]`` is node k's ``CUDA_VISIBLE_DEVICES`` (default: all its GPUs);
    ``nproc_per_node`` (default: the number visible) is torchrun's ``--nproc-per-node``."""
    if isinstance(cluster, str):
        cluster = Cluster.preset(cluster)
    nodes, per_node = node_shape(cluster)
    if nodes != 2:
        raise ValueError(f"{cluster.name} has {nodes} node(s): plot_node_map draws clusters "
                         "of two nodes (2x8xH100-ib, 2x8xA100-ib); plot_device_map draws one")
    values = list(visible) if visible is not None else [None] * nodes
    if len(values) != nodes:
        raise ValueError(f"visible has {len(values)} values, one per node is {nodes}")
    seen = [parse_visible(v, per_node) for v in values]
    nproc = min(len(s) for s in seen) if nproc_per_node is None else nproc_per_node
    if not all(1 <= nproc <= len(s) for s in seen):
        raise ValueError(f"nproc_per_node={nproc} needs that many visible GPUs on every node; "
                         f"the nodes see {[len(s) for s in seen]}")
    nic = [i for i in cluster.topology.links() if i.b == "network"][0]
    off_rail = {j for j in range(nproc) if len({s[j] for s in seen}) > 1}
    height = 2 * NODE_H + NETWORK_H + 1.6
    ax = new_figure(1.45 * (per_node + SPINE_W) + 0.4, 0.72 * height).add_subplot()
    ax.set_xlim(-0.15, per_node + SPINE_W + 0.15)
    ax.set_ylim(0.0, height)
    ax.axis("off")
    y_top = height - NODE_H - 0.1
    upper = _node(ax, cluster, 0, per_node, y_top, seen[0], nproc, False, off_rail)
    lower = _node(ax, cluster, 1, per_node, y_top - NODE_H - NETWORK_H, seen[1], nproc, True,
                  off_rail)
    _fabric(ax, per_node, upper, lower)
    _text(ax, per_node / 2, 1.15,
          f"network, {link_name(nic.spec_name)}: {nic.beta_Bps / 1e9:g} GB/s per NIC. Rail i: "
          "NIC i of every node on switch i. A hop between rails (NIC 7 to NIC 0) goes through "
          "the spine;\nthe simulator's fabric is non-blocking: every hop holds the sender's "
          "NIC and the receiver's, and costs the same on a rail or across;\nreal spines add a hop and "
          "are often oversubscribed, which is why traffic is kept on its rail",
          "network-label", fontsize=FONT_SIZE - 2)
    if off_rail:
        where = "; ".join(f"local rank {j}: NIC {seen[0][j]} on node 0, NIC {seen[1][j]} on "
                          f"node 1" for j in sorted(off_rail))
        _text(ax, per_node / 2, 0.64, f"{where}:\nthese local-rank groups are not rails (a "
              "local-rank group is one rail only when every node puts local rank i on GPU i)",
              "rail-mismatch", color=WARNING_COLOR, fontsize=FONT_SIZE - 2, fontweight="bold")
    _text(ax, per_node / 2, 0.2, f"global rank = node x nproc_per_node + local rank   "
          f"(nproc_per_node = {nproc}; world size {nodes * nproc})", "formula",
          fontsize=FONT_SIZE + 1, fontweight="bold")
    ax.set_title(title or f"{cluster.name}: {nodes} nodes x {per_node} {cluster.gpu.display_name}"
                 f", one NIC per GPU", loc="left", fontsize=FONT_SIZE + 1)
    return ax.figure


def _fabric(ax: Axes, per_node: int, upper: float, lower: float) -> None:
    """Rail i: NIC i of both nodes on switch i; every switch has its own uplink to a spine on
    the right (drawn as a stub down from each switch to one bundle of uplinks, so that the
    switches do not look chained to each other)."""
    mid, h = (upper + lower) / 2, 0.36
    spine_x = per_node + 0.3
    bundle = mid - h / 2 - 0.14
    ax.plot([0.8, spine_x], [bundle, bundle], color="#777777", linewidth=1.2, zorder=0.5,
            gid="spine-links")  # under the rails: they cross it, they do not join it
    for g in range(per_node):
        ax.plot([g + 0.8] * 2, [mid - h / 2, bundle], color="#777777", linewidth=1.2,
                zorder=0.5)
    for g in range(per_node):
        ax.plot([g + 0.5] * 2, [upper, lower], color=RAIL_COLOR, linewidth=2.2, gid=f"rail:{g}",
                zorder=1)
        _box(ax, g + 0.12, mid - h / 2, 0.76, h, "white", f"rail-switch:{g}", RAIL_COLOR)
        _text(ax, g + 0.5, mid, f"rail {g} switch", "rail-switch-label",
              fontsize=FONT_SIZE - 3)
    _box(ax, spine_x, mid - 0.45, SPINE_W - 0.2, 0.9, SWITCH_FACE, "spine", GPU_EDGE)
    _text(ax, spine_x + (SPINE_W - 0.2) / 2, mid, "spine: an\nuplink from\nevery rail\nswitch",
          "spine-label", fontsize=FONT_SIZE - 2)
