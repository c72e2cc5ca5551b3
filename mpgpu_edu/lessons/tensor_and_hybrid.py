"""Lesson 05's demos: one layer split over devices, a DP x PP mesh's traffic, ZeRO's traffic.

- ``plot_channel_split``: the seed's convolution, 64 output channels as 4 devices x 16.
- ``split_conv``: SPMD, the package's ``ColumnParallelConv2d`` on every rank's filters.
- ``plot_linear_split``: who holds what in a column-parallel and a row-parallel linear layer.
- ``mlp_pass``: SPMD, forward and backward of a tensor-parallel MLP (Megatron's column then
  row, or the naive split) on meta tensors: shapes, FLOPs and bytes, no data.
- ``megatron_pass``: SPMD, the same block run by a function with exercise 5.4's signature
  (the learner's ``megatron_mlp`` once it passes, else ``reference_megatron_mlp``), on meta
  tensors; ``all_reduces`` counts the all-reduces its bytes make; ``link_lines`` lists bytes
  per link.
- ``traffic_by_group``: bytes a DP x PP run sent inside pipelines and inside data groups.
- ``sharded_update_traffic``: SPMD, the communication of a ZeRO step (reduce-scatter, then
  all-gather) or of plain data parallelism (all-reduce), on meta tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle
from torch import nn

from mpgpu_edu.collectives import all_gather, all_reduce, reduce_scatter
from mpgpu_edu.comm import Communicator, LaunchResult
from mpgpu_edu.hybrid import Mesh
from mpgpu_edu.tensor import ColumnParallelConv2d, ParallelMLP, naive_parallel_mlp, shard_sizes
from mpgpu_edu.viz import format_bytes
from mpgpu_edu.viz.palette import FONT_SIZE, new_figure, series_color

GREY = "#D9D9D9"


# ---- the seed's convolution ----------------------------------------------------------------

def split_conv(comm: Communicator, conv: nn.Conv2d, images: torch.Tensor) -> dict[str, Any]:
    """This rank's filters of ``conv`` (``ColumnParallelConv2d.from_conv``) applied to the whole
    ``images``; the layer all-gathers every rank's channels. Returns the rank's filter shape,
    the output channels it computed and the full output."""
    layer = ColumnParallelConv2d.from_conv(comm, conv)
    with comm.compute("forward", "conv"):
        output = layer(images)
    start = sum(layer.sizes[:comm.rank])
    return {"filters": tuple(layer.weight.shape),
            "channels": (start, start + layer.sizes[comm.rank] - 1), "output": output.detach()}


def _box(ax: Axes, x: float, y: float, w: float, h: float, color: str, text: str = "",
         size: float = FONT_SIZE - 1, edge: str = "black") -> None:
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor=edge, linewidth=0.8))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)


def _arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], text: str = "",
           color: str = "black") -> None:
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, color=color,
                                 linewidth=1.2))
    if text:
        ax.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.12, text, ha="center",
                va="bottom", fontsize=FONT_SIZE - 2)


def plot_channel_split(in_channels: int = 64, out_channels: int = 64, world_size: int = 4
                       ) -> Figure:
    """The input (every device has all of it), each device's share of the filters and of the
    output channels it computes, and the all-gather that puts the channels side by side."""
    sizes = shard_sizes(out_channels, world_size)
    ax = new_figure(10, 1.0 * world_size + 1.6).add_subplot()
    top = world_size * 1.0
    _box(ax, 0, 0.2, 1.4, top - 0.4, GREY, f"input\n{in_channels} channels\n(every device\n"
         "has all of it)")
    start = 0
    for rank, size in enumerate(sizes):
        y = top - 1.0 * (rank + 1) + 0.15
        color = series_color(rank)
        _box(ax, 2.4, y, 2.6, 0.7, "white", edge=color)
        ax.text(3.7, y + 0.35, f"cuda:{rank}: {size} filters\n({size} x {in_channels} x k x k)",
                ha="center", va="center", fontsize=FONT_SIZE - 1)
        _arrow(ax, (1.45, top / 2), (2.35, y + 0.35), color="#777777")
        _box(ax, 5.8, y + 0.05, 1.6, 0.6, color,
             f"channels {start}-{start + size - 1}", size=FONT_SIZE - 1)
        _arrow(ax, (5.05, y + 0.35), (5.75, y + 0.35))
        _arrow(ax, (7.45, y + 0.35), (8.35, y + 0.35), "all-gather" if rank == 0 else "")
        start += size
    height = (top - 0.4) / out_channels
    for channel in range(out_channels):
        owner = next(r for r in range(world_size) if channel < sum(sizes[:r + 1]))
        ax.add_patch(Rectangle((8.4, top - 0.2 - (channel + 1) * height), 1.2, height,
                               facecolor=series_color(owner), edgecolor="white", linewidth=0.3))
    ax.text(9.0, top - 0.05, f"output: {out_channels} channels", ha="center", va="bottom",
            fontsize=FONT_SIZE - 1)
    ax.set_xlim(-0.05, 9.75)
    ax.set_ylim(-0.05, top + 0.35)
    ax.axis("off")
    ax.set_title(f"one convolution, {out_channels} output channels = {world_size} devices x "
                 f"{sizes[0]} channels", loc="left", fontsize=FONT_SIZE + 1)
    return ax.figure


# ---- column- and row-parallel linear layers ------------------------------------------------

def _matrix(ax: Axes, x: float, y: float, w: float, h: float, parts: int, along: str,
            label: str, owners: Sequence[int] | None = None) -> None:
    """A w x h matrix at (x, y), cut into ``parts`` bands along its rows ("rows": horizontal
    bands) or columns ("cols"), band r coloured as rank r; ``owners=None`` draws it grey,
    whole (held by every rank)."""
    if owners is None:
        _box(ax, x, y, w, h, GREY)
    for r in (owners or []):
        if along == "rows":
            _box(ax, x, y + h - (r + 1) * h / parts, w, h / parts, series_color(r))
        else:
            _box(ax, x + r * w / parts, y, w / parts, h, series_color(r))
    ax.text(x + w / 2, y - 0.12, label, ha="center", va="top", fontsize=FONT_SIZE - 1)


def plot_linear_split(world_size: int = 4) -> Figure:
    """``Y = X W^T`` split two ways, drawn as Megatron-LM draws it (``Y = X A``, ``A = W^T``,
    in x out); colour = the rank that holds a piece, grey = every rank holds all of it.
    Column-parallel: rank r holds columns r of W^T (rows r of ``nn.Linear``'s weight, its
    output features) and computes columns r of Y from the whole X. Row-parallel: rank r holds
    rows r of W^T (its input features) and columns r of X, and computes a partial Y that
    must be summed."""
    fig = new_figure(11, 3.0)
    left, right = fig.subplots(1, 2)
    ranks = list(range(world_size))
    batch, d_in, d_out = 1.3, 1.6, 1.2
    for ax, column in ((left, True), (right, False)):
        y0 = 0.75
        _matrix(ax, 0, y0, d_in, batch, world_size, "cols",
                "X (B x in)\nwhole on every rank" if column else "X (B x in): rank r\n"
                "holds columns r", None if column else ranks)
        ax.text(d_in + 0.22, y0 + batch / 2, "x", ha="center", va="center",
                fontsize=FONT_SIZE + 2)
        _matrix(ax, d_in + 0.45, y0 + batch - d_in, d_out, d_in, world_size,
                "cols" if column else "rows",
                "W.T (in x out): rank r\nholds columns r" if column else
                "W.T (in x out): rank r\nholds rows r", ranks)
        x_eq = d_in + d_out + 0.7
        ax.text(x_eq, y0 + batch / 2, "=", ha="center", va="center", fontsize=FONT_SIZE + 2)
        if column:
            _matrix(ax, x_eq + 0.25, y0, d_out, batch, world_size, "cols",
                    "Y (B x out): rank r\ncomputes columns r", ranks)
        else:
            for r in reversed(ranks):  # the partial outputs, stacked like cards
                _box(ax, x_eq + 0.25 + 0.07 * r, y0 + 0.07 * r, d_out, batch, series_color(r))
            ax.text(x_eq + 0.25 + d_out / 2, y0 - 0.12, f"{world_size} partial Y (B x out),"
                    "\nsummed by an all-reduce", ha="center", va="top", fontsize=FONT_SIZE - 1)
        ax.set_xlim(-0.1, x_eq + d_out + 0.6)
        ax.set_ylim(y0 + batch - d_in - 0.6, y0 + batch + 0.3)
        ax.set_aspect("equal")
        ax.axis("off")
    left.set_title("column-parallel: split the output features\nf before it: identity "
                   "forward, all-reduce of dX backward", loc="left", fontsize=FONT_SIZE)
    right.set_title("row-parallel: split the input features\ng after it: all-reduce of Y "
                    "forward, identity backward", loc="left", fontsize=FONT_SIZE)
    return fig


def mlp_pass(comm: Communicator, tokens: int, d_model: int, naive: bool = False) -> None:
    """Forward and backward of ``Linear(d, 4d), GELU, Linear(4d, d)`` in bf16 on ``tokens``
    rows, split over the ranks: Megatron's column-then-row ``ParallelMLP``, or with ``naive``
    the split that gathers the hidden layer and splits it again. Meta tensors: timed from
    their FLOPs and bytes, never computed."""
    with torch.device("meta"):
        mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model, dtype=torch.bfloat16), nn.GELU(),
                            nn.Linear(4 * d_model, d_model, dtype=torch.bfloat16))
        split = naive_parallel_mlp(comm, mlp) if naive else ParallelMLP.from_mlp(comm, mlp)
        model = split.to(torch.bfloat16)  # the split layers make their shards in fp32
        x = torch.empty(tokens, d_model, dtype=torch.bfloat16, requires_grad=True)
    with comm.compute("forward", "MLP"):
        y = model(x)
    with comm.compute("backward", "MLP"):
        y.backward(torch.empty_like(y))


MegatronMLP = Callable[..., torch.Tensor]  # exercise 5.4: (comm, x, w1, b1, w2, b2) -> out


def reference_megatron_mlp(comm: Communicator, x: torch.Tensor, w1_shard: torch.Tensor,
                           b1_shard: torch.Tensor | None, w2_shard: torch.Tensor,
                           b2: torch.Tensor | None) -> torch.Tensor:
    """The package's Megatron MLP block (``mpgpu_edu.tensor.megatron``): what the notebook's
    demos run until the learner's 5.4 passes (``mp.yours``)."""
    from mpgpu_edu.tensor.megatron import megatron_mlp

    return megatron_mlp(comm, x, w1_shard, b1_shard, w2_shard, b2)


def megatron_pass(comm: Communicator, mlp: MegatronMLP, tokens: int, d_model: int
                  ) -> dict[str, int]:
    """Forward and backward of ``Linear(d, 4d), GELU, Linear(4d, d)`` in bf16 on ``tokens``
    rows, run by ``mlp`` (exercise 5.4's ``megatron_mlp`` or the package's) on this rank's
    shards of the hidden features. Meta tensors: timed from their FLOPs and bytes, never
    computed. Returns the bytes this rank sent in the forward and in the backward."""
    hidden = shard_sizes(4 * d_model, comm.world_size)[comm.rank]
    with torch.device("meta"):
        def leaf(*shape: int) -> torch.Tensor:
            return torch.empty(*shape, dtype=torch.bfloat16, requires_grad=True)
        x, w1, b1 = leaf(tokens, d_model), leaf(hidden, d_model), leaf(hidden)
        w2, b2 = leaf(d_model, hidden), leaf(d_model)
    with comm.compute("forward", "MLP"):
        out = mlp(comm, x, w1, b1, w2, b2)
    forward = comm.stats.bytes_sent
    with comm.compute("backward", "MLP"):
        out.backward(torch.empty_like(out))
    return {"forward_bytes": forward, "backward_bytes": comm.stats.bytes_sent - forward}


def all_reduces(bytes_sent: Sequence[int], nbytes: int) -> float:
    """How many all-reduces of ``nbytes`` the ranks' ``bytes_sent`` add up to: whatever its
    algorithm, one all-reduce on N ranks sends 2 (N - 1) x ``nbytes`` in all."""
    n = len(bytes_sent)
    return sum(bytes_sent) / (2 * (n - 1) * nbytes) if n > 1 else 0.0


def link_lines(result: LaunchResult) -> str:
    """Bytes sent over each link (source -> destination), one line per source."""
    links = result.bytes_per_link()
    lines = []
    for src in sorted({s for s, _ in links}):
        cells = [f"-> dev {dst}: {format_bytes(links[src, dst]):>9}"
                 for dst in sorted(d for s, d in links if s == src)]
        lines.append(f"dev {src} " + "   ".join(cells))
    return "\n".join(lines)


# ---- hybrid: where the bytes go --------------------------------------------------------------

def traffic_by_group(result: LaunchResult, mesh: Mesh) -> dict[str, int]:
    """Bytes the run sent between ranks of one pipeline (same replica: activations and
    gradients between stages) and between ranks of one data group (same stage: the gradient
    all-reduce)."""
    totals = {"pipeline": 0, "data": 0}
    for (src, dst), nbytes in result.bytes_per_link().items():
        same_replica = mesh.coords(src)[0] == mesh.coords(dst)[0]
        totals["pipeline" if same_replica else "data"] += nbytes
    return totals


# ---- ZeRO -----------------------------------------------------------------------------------

def sharded_update_traffic(comm: Communicator, numel: int, sharded: bool) -> None:
    """The communication of one data-parallel step on ``numel`` fp32 gradients (meta tensors):
    an all-reduce of the gradients (plain DP), or, ``sharded``, ZeRO's reduce-scatter of the
    gradients followed by an all-gather of the updated parameter shards."""
    grads = torch.empty(numel, device="meta")
    if not sharded:
        all_reduce(comm, grads)
        return
    mine = reduce_scatter(comm, grads)
    all_gather(comm, torch.empty_like(mine))
