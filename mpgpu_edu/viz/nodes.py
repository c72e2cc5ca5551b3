"""The device map of several nodes: hosts, NIC rails, GPUs, and every rank's three numbers.

``plot_node_map`` draws each node as a box holding its NVSwitch, its GPUs and its NICs (one
per GPU: GPU i of every node is on *rail* i), with the network between the nodes drawn rail
by rail. Each GPU says which process runs on it under ``torchrun``: ``cuda:j`` (its index
under that node's ``CUDA_VISIBLE_DEVICES``), the local rank j and the global rank
``node x nproc_per_node + local rank``. GPUs that ``CUDA_VISIBLE_DEVICES`` hides are grey.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from mpgpu_edu.cluster import Cluster, parse_visible
from mpgpu_edu.viz.devicemap import link_name, short_gpu_name
from mpgpu_edu.viz.palette import FONT_SIZE, OKABE_ITO, new_figure

GPU_FACE, GPU_EDGE = "#EAF4FB", "#555555"
HIDDEN_FACE, HIDDEN_TEXT = "#E4E4E4", "#8C8C8C"
NIC_FACE, SWITCH_FACE, NODE_EDGE = "#FDE8D8", "#FFF3D6", "#777777"
RAIL_COLOR = OKABE_ITO["vermillion"]
GPU_H, NIC_H, SWITCH_H, GAP = 1.15, 0.42, 0.36, 0.32
NODE_H = SWITCH_H + GPU_H + NIC_H + 4 * GAP + 0.35
NETWORK_H = 1.1


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
         edge: str = GPU_EDGE, style: str = "-") -> None:
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=0.06",
                                facecolor=face, edgecolor=edge, linewidth=1.0,
                                linestyle=style, gid=gid))


def _text(ax: Axes, x: float, y: float, text: str, gid: str, **kw: object) -> None:
    kw.setdefault("ha", "center")
    kw.setdefault("va", "center")
    kw.setdefault("fontsize", FONT_SIZE - 1)
    ax.text(x, y, text, gid=gid, **kw)


def _node(ax: Axes, cluster: Cluster, k: int, per_node: int, y: float, visible: list[int],
          nproc: int, flip: bool) -> float:
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
        _box(ax, x + 0.08, yn, 0.7, NIC_H, NIC_FACE, f"nic:{k}:{g}", RAIL_COLOR)
        _text(ax, g + 0.5, yn + NIC_H / 2, f"NIC {g}", "nic-label", fontsize=FONT_SIZE - 2)
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
    height = 2 * NODE_H + NETWORK_H + 0.8
    ax = new_figure(1.45 * per_node + 0.4, 0.72 * height).add_subplot()
    ax.set_xlim(-0.15, per_node + 0.15)
    ax.set_ylim(0.0, height)
    ax.axis("off")
    y_top = height - NODE_H - 0.1
    upper = _node(ax, cluster, 0, per_node, y_top, seen[0], nproc, flip=False)
    lower = _node(ax, cluster, 1, per_node, y_top - NODE_H - NETWORK_H, seen[1], nproc,
                  flip=True)
    for g in range(per_node):
        ax.plot([g + 0.5] * 2, [upper, lower], color=RAIL_COLOR, linewidth=2.2, gid=f"rail:{g}")
    _text(ax, per_node / 2, (upper + lower) / 2,
          f"network, {link_name(nic.spec_name)}: {nic.beta_Bps / 1e9:g} GB/s per NIC; rail i "
          "joins NIC i of every node", "network-label",
          bbox={"facecolor": "white", "edgecolor": RAIL_COLOR, "pad": 3})
    _text(ax, per_node / 2, 0.3, f"global rank = node x nproc_per_node + local rank   "
          f"(nproc_per_node = {nproc}; world size {nodes * nproc})", "formula",
          fontsize=FONT_SIZE + 1, fontweight="bold")
    ax.set_title(title or f"{cluster.name}: {nodes} nodes x {per_node} {cluster.gpu.display_name}"
                 f", one NIC per GPU", loc="left", fontsize=FONT_SIZE + 1)
    return ax.figure
