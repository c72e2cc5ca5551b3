"""Lesson 01's demos: what a message costs, what each collective does, and what all-reduce
costs on real topologies.

- ``message_seconds`` / ``plot_message_time``: alpha + n / beta for the link profiles.
- ``send_one``: the smallest SPMD program, one message from rank 0 to rank 1.
- ``run_collective`` / ``describe_collective``: one collective on small integer tensors, every
  rank's tensor before and after.
- ``run_all_reduce``, ``allreduce_times``: the package's reference all-reduces timed on the
  simulator with meta tensors (a shape, no data: a 1 GiB message costs no memory).
- ``plot_bytes_per_rank``: who sends how much, per algorithm.
- ``step_seconds``: compute plus gradient all-reduce per step on N devices (pitfall 1).

Everything runs on the simulator; large messages are meta tensors (a shape, no data).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from matplotlib.figure import Figure

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives import (all_gather, all_reduce, broadcast, gather, reduce,
                                   reduce_scatter, scatter)
from mpgpu_edu.comm import Communicator, LaunchResult, launch
from mpgpu_edu.data import Workload
from mpgpu_edu.hardware import LINKS
from mpgpu_edu.viz.devicemap import link_name
from mpgpu_edu.viz.palette import (FONT_SIZE, KIND_COLORS, bytes_axis, format_bytes, new_figure,
                                   style)
from mpgpu_edu.viz.scaling import plot_allreduce_vs_size

COLLECTIVES = ("broadcast", "reduce", "gather", "scatter", "all_gather", "reduce_scatter",
               "all_reduce")
FP32_BYTES = 4


# ---- one message -----------------------------------------------------------------------------

def message_seconds(link: str, nbytes: int) -> float:
    """One message of ``nbytes`` on the link profile ``link`` (a key of ``hardware.LINKS``)."""
    return LINKS[link].seconds(nbytes)


def plot_message_time(links: Sequence[str], sizes: Sequence[int]) -> Figure:
    """Time of one message against its size, log-log, one line per link profile: flat where
    the latency alpha dominates, slope 1 where the bandwidth beta does."""
    results = {f"{link_name(name)} ({LINKS[name].beta_Bps / 1e9:g} GB/s)":
               {n: message_seconds(name, n) for n in sizes} for name in links}
    fig = plot_allreduce_vs_size(results, title="one message: alpha + n / beta")
    ax = fig.axes[0]
    ax.set_xlabel("message size (log scale)")
    ax.set_ylabel("time of one message (log scale)")
    return fig


# ---- SPMD: the smallest program ----------------------------------------------------------------

def send_one(comm: Communicator, nbytes: int) -> None:
    """Rank 0 sends ``nbytes`` bytes to rank 1; every other rank has nothing to do.
    The message is a meta tensor: the simulator times it without allocating it."""
    message = torch.empty(nbytes, dtype=torch.uint8, device="meta")
    if comm.rank == 0:
        comm.send(message, 1)
    elif comm.rank == 1:
        comm.recv(message, 0)


# ---- the collectives on small tensors -------------------------------------------------------

def rank_tensor(rank: int, world_size: int) -> torch.Tensor:
    """Rank r's demo tensor: ``[10r + 1, 10r + 2, ..., 10r + N]`` (N = world size), so every
    number says which rank it came from."""
    return torch.arange(1, world_size + 1, dtype=torch.int32) + 10 * rank


def collective_program(comm: Communicator, name: str) -> tuple[list[int], Any]:
    """Run collective ``name`` (one of ``COLLECTIVES``) on this rank's ``rank_tensor``;
    returns (tensor before, what the rank holds after). Root is rank 0."""
    n, rank = comm.world_size, comm.rank
    tensor = rank_tensor(rank, n)
    before = tensor.tolist()
    if name == "broadcast":
        broadcast(comm, tensor, root=0)
        return before, tensor.tolist()
    if name == "reduce":
        reduce(comm, tensor, root=0)
        return before, tensor.tolist()
    if name == "all_reduce":
        all_reduce(comm, tensor)
        return before, tensor.tolist()
    if name == "gather":
        parts = gather(comm, tensor, root=0)
        return before, None if parts is None else [p.tolist() for p in parts]
    if name == "scatter":
        out = torch.zeros(1, dtype=tensor.dtype)
        chunks = list(tensor.split(1)) if rank == 0 else None
        scatter(comm, chunks, out, root=0)
        return before, out.tolist()
    if name == "all_gather":
        return before, [p.tolist() for p in all_gather(comm, tensor)]
    if name == "reduce_scatter":
        return before, reduce_scatter(comm, tensor).tolist()
    raise ValueError(f"unknown collective {name!r}: choose one of {', '.join(COLLECTIVES)}")


def run_collective(name: str, world_size: int = 4) -> LaunchResult:
    """``collective_program`` on ``world_size`` simulated ranks (a uniform cluster)."""
    return launch(collective_program, world_size, name)


def describe_collective(result: LaunchResult) -> str:
    """Every rank's tensor before and after, one line per rank, and the bytes it sent."""
    lines = []
    for rank, ((before, after), stats) in enumerate(zip(result.results, result.stats)):
        lines.append(f"rank {rank} (sent {stats.bytes_sent:>2} bytes): {before} -> {after}")
    return "\n".join(lines)


# ---- all-reduce on the simulator ------------------------------------------------------------

def all_reduce_meta(comm: Communicator, algo: str, numel: int) -> None:
    """One all-reduce (``algo``: naive, tree or ring) of ``numel`` fp32 meta elements."""
    all_reduce(comm, torch.empty(numel, dtype=torch.float32, device="meta"), algo=algo)


def first_devices(cluster: Cluster | str, world_size: int | None) -> Cluster:
    """``cluster`` (or the preset so named) seeing its first ``world_size`` devices only
    (``CUDA_VISIBLE_DEVICES=0,1,...``); all of them when ``world_size`` is None."""
    cluster = Cluster.preset(cluster) if isinstance(cluster, str) else cluster
    if world_size is None:
        return cluster
    return cluster.with_visible(",".join(str(i) for i in range(world_size)))


def run_all_reduce(algo: str, cluster: Cluster | str, nbytes: int,
                   world_size: int | None = None) -> LaunchResult:
    """The package's ``algo`` all-reduce of an ``nbytes`` fp32 tensor, simulated on the first
    ``world_size`` devices of ``cluster``."""
    return launch(all_reduce_meta, first_devices(cluster, world_size), algo,
                  -(-nbytes // FP32_BYTES))


def allreduce_times(cluster: Cluster | str, algos: Iterable[str], sizes: Iterable[int],
                    world_size: int | None = None) -> dict[str, dict[int, float]]:
    """``{algo: {nbytes: seconds}}``, simulated: the input of ``plot_allreduce_vs_size``."""
    sizes = list(sizes)
    return {algo: {n: run_all_reduce(algo, cluster, n, world_size).trace.makespan
                   for n in sizes} for algo in algos}


def plot_bytes_per_rank(results: Mapping[str, LaunchResult]) -> Figure:
    """Bytes each rank sent and received, one group of bars per rank, one panel per run
    (``{"naive": result, "ring": result}``), all panels on the same scale."""
    fig = new_figure(3.2 * len(results) + 1.0, 3.6)
    axes = fig.subplots(1, len(results), sharey=True, squeeze=False)[0]
    top = max(max(r.bytes_sent_per_rank + r.bytes_received_per_rank) for r in results.values())
    for ax, (label, result) in zip(axes, results.items()):
        ranks = range(len(result.stats))
        for offset, what, values in ((-0.2, "send", result.bytes_sent_per_rank),
                                     (0.2, "recv", result.bytes_received_per_rank)):
            ax.bar([r + offset for r in ranks], values, width=0.4, color=KIND_COLORS[what],
                   label="sent" if what == "send" else "received")
        bytes_axis(ax, top, label="bytes")
        ax.set_xticks(list(ranks), [f"rank {r}" for r in ranks])
        ax.set_title(f"{label}: busiest rank sent {format_bytes(max(result.bytes_sent_per_rank))}",
                     loc="left", fontsize=FONT_SIZE)
        style(ax, grid="y")
    for ax in axes[1:]:
        ax.set_ylabel("")
    axes[0].legend(loc="upper right", frameon=False, fontsize=FONT_SIZE - 1)
    return fig


# ---- pitfall 1: communication against compute ------------------------------------------------

def step_seconds(workload: Workload, cluster: Cluster | str, sizes: Iterable[int],
                 algo: str = "ring", dtype: str = "fp32") -> dict[int, float]:
    """``{N: seconds}`` of one data-parallel training step on the first N devices: the
    workload's FLOPs split N ways (``cluster.compute_seconds``), then one all-reduce of its
    fp32 gradients (simulated), one after the other, with no overlap."""
    cluster = Cluster.preset(cluster) if isinstance(cluster, str) else cluster
    grad_bytes = FP32_BYTES * workload.n_params
    out = {}
    for n in sizes:
        compute = cluster.compute_seconds(workload.step_flops / n, dtype)
        comm = run_all_reduce(algo, cluster, grad_bytes, n).trace.makespan if n > 1 else 0.0
        out[n] = compute + comm
    return out

