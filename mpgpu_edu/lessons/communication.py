"""Lesson 01's demos: what a message costs, what each collective does, and what all-reduce
costs on real topologies. Its figures are ``mpgpu_edu.viz.collectives``'s.

- ``message_seconds``: alpha + n / beta for a link profile; ``describe_links``: each
  profile's peak and effective bandwidth; ``describe_route``: a route's latency, bandwidth
  and the caps it shares.
- ``send_one``: the smallest SPMD program, one message from rank 0 to rank 1.
- ``run_collective`` / ``describe_collective``: one collective on small integer tensors, every
  rank's tensor before and after.
- ``run_all_reduce``, ``allreduce_times``: an all-reduce, given as a function
  ``fn(comm, tensor)`` (the learner's, from ``mp.yours``) or as the name of one of the
  package's, timed on the simulator with meta tensors (a 1 GiB message costs no memory).
- ``binary_tree_all_reduce``, ``binary_tree_seconds``: the reference of exercise 1.6's tree
  (parent (r - 1) // 2) and its closed form.
- ``step_seconds``: compute plus gradient all-reduce per step on N devices (pitfall 1).
- ``PUBLISHED_BUSBW``, ``compare_with_published``: a simulated all-reduce's bus bandwidth
  (``bus_bandwidth``, as nccl-tests reports it) against the published figure.
- ``speedup_choice``, ``growth_choice``: which answer of a prediction a ratio bears out.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Union

import torch

from mpgpu_edu.cluster import Cluster, first_devices
from mpgpu_edu.cluster.topology import Route
from mpgpu_edu.collectives import (ALGORITHMS, all_gather, all_reduce, broadcast, gather,
                                   reduce, reduce_scatter, scatter)
from mpgpu_edu.collectives.cost import bus_bandwidth
from mpgpu_edu.comm import Communicator, LaunchResult, launch
from mpgpu_edu.replica.data import Workload
from mpgpu_edu.cluster.hardware import LINKS
from mpgpu_edu.viz.collectives import (plot_bytes_per_rank, plot_comm_timelines, plot_message_time,
                                       plot_step_speedups, ring_figure)
from mpgpu_edu.viz.palette import format_bytes

COLLECTIVES = ("broadcast", "reduce", "gather", "scatter", "all_gather", "reduce_scatter",
               "all_reduce")
FP32_BYTES = 4
AllReduce = Union[str, Callable[..., Any]]  # a function fn(comm, tensor), or a package name


# ---- one message -----------------------------------------------------------------------------

def message_seconds(link: str, nbytes: int) -> float:
    """One message of ``nbytes`` on the link profile ``link`` (a key of ``hardware.LINKS``)."""
    return LINKS[link].seconds(nbytes)


def describe_links(names: Sequence[str]) -> str:
    """One line per link profile: latency, peak (spec sheet) and effective (what NCCL reaches,
    the one the simulator uses) bandwidth, the fraction of peak, and the size at which one
    message spends as long in latency as in bandwidth (alpha x beta)."""
    lines = []
    for name in names:
        link = LINKS[name]
        peak = (f"peak {link.peak_Bps / 1e9:5.1f} GB/s, effective {link.beta_Bps / 1e9:5.1f} "
                f"GB/s ({link.beta_Bps / link.peak_Bps:4.0%} of peak)" if link.peak_Bps else
                f"effective {link.beta_Bps / 1e9:5.1f} GB/s (no peak figure)")
        lines.append(f"{name:17} alpha {link.alpha_s * 1e6:3.0f} µs | {peak} | alpha x beta "
                     f"{format_bytes(link.alpha_s * link.beta_Bps):>8}")
    return "\n".join(lines)


def alone_Bps(route: Route) -> float:
    """The bandwidth a transfer on ``route`` gets when nothing else is in flight: its own
    ``beta_Bps``, or the smallest shared cap it crosses if that is lower (a socket link)."""
    return min([route.beta_Bps] + [cap for _, cap in route.shares])


def describe_route(cluster: Cluster | str, src: int, dst: int) -> str:
    """A route in one line: latency, bandwidth alone (``alone_Bps``), the ports it holds and
    the caps it shares with concurrent transfers."""
    cluster = Cluster.preset(cluster) if isinstance(cluster, str) else cluster
    route = cluster.route(src, dst)
    held = ", ".join(route.resources) or "no ports of its own"
    shared = ", ".join(f"{name} {cap / 1e9:g}" for name, cap in route.shares) or "none"
    return (f"{cluster.name:21} cuda:{src} -> cuda:{dst}: alpha {route.alpha_s * 1e6:2.0f} µs, "
            f"alone {alone_Bps(route) / 1e9:3.0f} GB/s | holds {held} | shares (GB/s) {shared}")


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

def algorithm(algo: AllReduce) -> Callable[..., Any]:
    """``algo`` itself, or the package's all-reduce so named (naive, tree or ring)."""
    if isinstance(algo, str):
        if algo not in ALGORITHMS:
            raise ValueError(f"unknown all-reduce {algo!r}: choose one of "
                             + ", ".join(ALGORITHMS))
        return ALGORITHMS[algo]
    return algo


def all_reduce_meta(comm: Communicator, algo: AllReduce, numel: int) -> None:
    """One all-reduce of ``numel`` fp32 meta elements with ``algo`` (a function
    ``fn(comm, tensor)`` or a package name): the program every demo below runs."""
    algorithm(algo)(comm, torch.empty(numel, dtype=torch.float32, device="meta"))


def run_all_reduce(algo: AllReduce, cluster: Cluster | str | int, nbytes: int,
                   world_size: int | None = None) -> LaunchResult:
    """The all-reduce ``algo`` of an ``nbytes`` fp32 tensor, simulated on the first
    ``world_size`` devices of ``cluster``."""
    algorithm(algo)  # an unknown name fails here, not inside every rank
    where = cluster if isinstance(cluster, int) else first_devices(cluster, world_size)
    return launch(all_reduce_meta, where, algo, -(-nbytes // FP32_BYTES))


def allreduce_times(cluster: Cluster | str, algos: Mapping[str, AllReduce] | Iterable[str],
                    sizes: Iterable[int], world_size: int | None = None
                    ) -> dict[str, dict[int, float]]:
    """``{label: {nbytes: seconds}}``, simulated, for ``{label: algo}`` (or names of the
    package's all-reduces): the input of ``plot_allreduce_vs_size``."""
    sizes = list(sizes)
    algos = dict(algos) if isinstance(algos, Mapping) else {name: name for name in algos}
    return {label: {n: run_all_reduce(algo, cluster, n, world_size).trace.makespan
                    for n in sizes} for label, algo in algos.items()}


def tree_children(rank: int, world_size: int) -> list[int]:
    """Rank ``rank``'s children in the binary tree of exercise 1.6: ``2r + 1`` and ``2r + 2``,
    those below ``world_size``."""
    return [c for c in (2 * rank + 1, 2 * rank + 2) if c < world_size]


def binary_tree_all_reduce(comm: Communicator, tensor: torch.Tensor) -> None:
    """All-reduce (sum) in place along the binary tree of exercise 1.6 (rank r's parent is
    ``(r - 1) // 2``), from ``irecv``/``isend``: the reference the demos and the check of 1.6
    compare a learner's tree with.

    Both subtrees at once: a rank posts the receives from both children before it waits on
    either, and sends the total to both children before it waits on either.
    Cost: ``binary_tree_seconds``."""
    rank, n = comm.rank, comm.world_size
    children = tree_children(rank, n)
    partials = [torch.empty_like(tensor) for _ in children]
    works = [comm.irecv(partial, child) for partial, child in zip(partials, children)]
    for work, partial in zip(works, partials):  # up: the sum of my subtree
        work.wait()
        tensor.add_(partial)
    if rank > 0:
        comm.send(tensor, (rank - 1) // 2)
        comm.recv(tensor, (rank - 1) // 2)  # down: the total
    for work in [comm.isend(tensor, child) for child in children]:
        work.wait()


def binary_tree_seconds(world_size: int, nbytes: float, alpha_s: float,
                        beta_Bps: float) -> float:
    """Closed form of ``binary_tree_all_reduce`` on a cluster where every device has one port
    in and one out (``Cluster.uniform``, the NVSwitch presets): ``2 floor(log2 N)`` rounds,
    up then down, and in each round a parent's port carries both children's tensors:
    ``2 floor(log2 N) (alpha + 2 S / beta)``. Exact for a full tree (N = 2^k - 1); when the
    last level is part-filled the simulator is faster (a rank with one child waits for one
    tensor only)."""
    depth = world_size.bit_length() - 1  # floor(log2 N): the depth of rank N - 1
    return 2 * depth * (alpha_s + 2 * nbytes / beta_Bps)


# ---- pitfall 1: communication against compute ------------------------------------------------

def step_seconds(workload: Workload, cluster: Cluster | str, sizes: Iterable[int],
                 algo: AllReduce = "ring", dtype: str = "fp32") -> dict[int, float]:
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


# ---- simulated against published -------------------------------------------------------------

# nccl-tests all_reduce_perf bus bandwidth at large messages, as cited in the ``source`` of the
# link each preset's GPUs talk over (mpgpu_edu/cluster/hardware.py).
PUBLISHED_BUSBW: dict[str, tuple[float, str]] = {
    "8xA100-nvlink": (200e9, "~200 GB/s busbw, 8x A100-SXM4-80GB all_reduce_perf "
                             "(NVIDIA/nccl-tests#149, cited in LINKS['nvlink3'].source)"),
    "8xH100-nvswitch": (370e9, "370 GB/s busbw, 8x H100 with NCCL_ALGO=RING "
                               "(NVIDIA/nccl-tests#212, cited in "
                               "LINKS['nvlink4-nvswitch'].source)"),
}


def compare_with_published(preset: str, nbytes: int, algo: AllReduce = "ring"
                           ) -> tuple[float, float, float, str]:
    """(simulated bus bandwidth, published, relative error, citation) of the all-reduce
    ``algo`` of ``nbytes`` on ``preset``, against ``PUBLISHED_BUSBW[preset]``. ``algo="nccl"``:
    the ring as NCCL runs it (``collectives.nccl_ring``: 24 rings at once, the adds inside the
    copies)."""
    published, citation = PUBLISHED_BUSBW[preset]
    cluster = Cluster.preset(preset)
    if algo == "nccl":
        from mpgpu_edu.collectives.nccl_ring import all_reduce_nccl

        seconds = launch(lambda comm: all_reduce_nccl(
            comm, torch.empty(nbytes // 4, device="meta")), cluster).trace.makespan
    else:
        seconds = run_all_reduce(algo, cluster, nbytes).trace.makespan
    simulated = bus_bandwidth(nbytes, cluster.world_size, seconds)
    return simulated, published, simulated / published - 1, citation


# ---- predictions: which answer a measurement bears out ------------------------------------

def speedup_choice(naive_s: float, ring_s: float) -> int:
    """Prediction 01.ring-vs-naive: (a) about the same, (b) ring ~2x, (c) ring ~N x = 8x,
    (d) naive faster."""
    ratio = naive_s / ring_s
    if ratio < 1 / 1.3:
        return 3
    return 0 if ratio < 1.3 else 1 if ratio < 4 else 2


def growth_choice(before_s: float, after_s: float) -> int:
    """Prediction 01.ring-doubling: the time grows (a) x0.5, (b) ~x1.2, (c) x2, (d) x4."""
    ratio = after_s / before_s
    return 0 if ratio < 0.75 else 1 if ratio < 1.5 else 2 if ratio < 3 else 3
