"""``mpgpu-edu simulate WHAT``: what a collective (or, later, a schedule) costs on a preset.

    mpgpu-edu simulate allreduce --algo ring --world-size 8 --bytes 1GiB --cluster 8xA100-nvlink
    mpgpu-edu simulate allreduce --algo naive --world-size 4 --bytes 64MiB \\
        --cluster 4xRTX4090-pcie --json

``allreduce`` runs the chosen all-reduce of ``mpgpu_edu.collectives`` on the simulator, on
the first N devices of the preset (``CUDA_VISIBLE_DEVICES=0,...,N-1``), with a *meta* fp32
tensor of the given size: meta tensors carry a shape and no data, so even a 1 GiB message
costs no memory and no time to simulate. It prints the simulated time, nccl-tests' algbw
and busbw, the bytes each rank sent and received, and the closed form on a uniform link of
the same alpha and beta for comparison; a simulated time above it is contention.
``--json`` gives ``time_s`` in seconds and ``algbw``/``busbw`` in bytes/s (``algbw_GBps``,
``busbw_GBps``: the same in 10^9 bytes/s; null when the time is zero, on one rank).

Each ``WHAT`` is a pair of functions, ``add_WHAT_parser`` and ``run_WHAT``, listed in
``PARSERS`` and ``HANDLERS``: ``allreduce`` below, ``pipeline`` in ``simulate_pipeline.py``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch

from mpgpu_edu.cli import UsageError, add_command_group, number, parse_size
from mpgpu_edu.cli.simulate_pipeline import (  # noqa: F401 - simulate_pipeline is public here
    add_pipeline_parser, pipeline_text, run_pipeline, simulate_pipeline)
from mpgpu_edu.cli.simulate_step import add_step_parser, run_step
from mpgpu_edu.cluster import Cluster, format_bytes
from mpgpu_edu.collectives import ALGORITHMS, all_reduce
from mpgpu_edu.collectives import cost
from mpgpu_edu.collectives.hierarchical import all_reduce_hierarchical
from mpgpu_edu.comm import Communicator, launch

DEFAULT_CLUSTER = "8xA100-nvlink"
DEFAULT_BYTES = "64MiB"
FP32_BYTES = 4
MAX_BYTES = 2**40  # 1 TiB per rank: more than any GPU holds (the counters overflow near 2^63)
MAX_RANKS = 1024   # the presets are far smaller; _world_size states the preset's own limit


def add_parser(sub: argparse._SubParsersAction) -> None:
    what = add_command_group(sub, "simulate", run,
                             help="cost of a collective (or a schedule) on a preset",
                             description="Simulate a collective (or a schedule) on a preset "
                                         "cluster and report its cost.")
    for add in PARSERS.values():
        add(what)


def run(args: argparse.Namespace) -> int:
    return HANDLERS[args.what](args)


# ---- simulate allreduce ---------------------------------------------------------------------

def add_allreduce_parser(what: argparse._SubParsersAction) -> None:
    p = what.add_parser("allreduce", help="time of one all-reduce: naive, tree, ring or "
                        "hierarchical", description="Run one all-reduce of a meta fp32 tensor "
                        "on the simulator.")
    p.add_argument("--algo", default="ring", metavar="{" + ",".join(ALGOS) + "}",
                   help="all-reduce algorithm (default ring); hierarchical needs a preset of "
                        "two or more nodes, and takes its nodes and GPUs per node from it")
    p.add_argument("--world-size", type=number(int, 1, MAX_RANKS), default=None, metavar="N",
                   help="number of ranks: the first N devices of the preset (default: all)")
    p.add_argument("--bytes", default=DEFAULT_BYTES, metavar="SIZE",
                   help=f"tensor size per rank, e.g. 4096, 64KiB, 1GiB (default "
                        f"{DEFAULT_BYTES}, at most 1TiB); rounded up to whole fp32 elements")
    p.add_argument("--cluster", default=DEFAULT_CLUSTER, metavar="PRESET",
                   help=f"cluster preset (default {DEFAULT_CLUSTER}); one of: "
                        + ", ".join(Cluster.presets()))
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_allreduce(args: argparse.Namespace) -> int:
    report = simulate_allreduce(args.algo, args.world_size, args.bytes, args.cluster)
    print(json.dumps(report, indent=2) if args.json else allreduce_text(report))
    return 0


def _allreduce_meta(comm: Communicator, algo: str, numel: int) -> None:
    all_reduce(comm, torch.empty(numel, dtype=torch.float32, device="meta"), algo=algo)


def _hierarchical_meta(comm: Communicator, numel: int, per_node: int) -> None:
    all_reduce_hierarchical(comm, torch.empty(numel, dtype=torch.float32, device="meta"),
                            per_node)


def simulate_allreduce(algo: str, world_size: int | None, size: str, preset: str) -> dict:
    """Simulate one all-reduce and return the report (the ``--json`` object)."""
    if algo not in ALGOS:
        raise UsageError(f"unknown algorithm {algo!r}: choose one of {', '.join(ALGOS)}")
    n = _world_size(preset, world_size)
    if algo == "hierarchical":
        return simulate_hierarchical(n, size, preset)
    requested = parse_size(size, MAX_BYTES, "--bytes", " per rank (more than any GPU holds)")
    numel = -(-requested // FP32_BYTES)  # round up to whole fp32 elements
    nbytes = numel * FP32_BYTES
    cluster = Cluster.preset(preset, visible=",".join(str(i) for i in range(n)))
    result = launch(_allreduce_meta, cluster, algo, numel)
    seconds = result.trace.makespan
    route = cluster.route(0, 1) if n > 1 else None
    alpha, beta = (route.alpha_s, route.beta_Bps) if route else (0.0, 1.0)
    closed = cost.allreduce_time(algo, n, nbytes, alpha, beta)
    algbw = cost.algbw(nbytes, seconds) if seconds > 0 else None
    busbw = cost.busbw(nbytes, seconds, n) if seconds > 0 else None
    return {
        "algo": algo, "world_size": n, "bytes": nbytes, "bytes_requested": requested,
        "dtype": "fp32", "cluster": preset, "gpu": cluster.gpu.display_name,
        "time_s": seconds,
        "algbw": algbw, "busbw": busbw,
        "algbw_GBps": None if algbw is None else algbw / 1e9,
        "busbw_GBps": None if busbw is None else busbw / 1e9,
        "bytes_sent_per_rank": result.bytes_sent_per_rank,
        "bytes_received_per_rank": result.bytes_received_per_rank,
        "link_alpha_s": alpha if route else None, "link_beta_Bps": beta if route else None,
        "closed_form_s": closed, "closed_form": cost.ALLREDUCE_FORMULA[algo],
        "slowdown_vs_closed_form": seconds / closed if closed > 0 else None,
    }


ALGOS = (*ALGORITHMS, "hierarchical")


def node_shape(preset: str) -> tuple[int, int]:
    """(nodes, GPUs per node) of a preset: one node unless its topology has several."""
    cluster = Cluster.preset(preset)
    nodes = [g for name, g in cluster.topology.groups().items() if name.startswith("node")]
    if cluster.topology.kind != "multi_node" or len(nodes) < 2:
        return 1, cluster.n_physical
    return len(nodes), len(nodes[0])


def simulate_hierarchical(n: int, size: str, preset: str) -> dict:
    """The report of one hierarchical all-reduce on ``n`` ranks of a multi-node preset: the
    same fields as ``simulate_allreduce`` plus the nodes, the inter-node link and the bytes
    each rank sends inside its node and across the network."""
    nodes, per_node = node_shape(preset)
    multi = [p for p in Cluster.presets() if node_shape(p)[0] > 1]
    if nodes < 2:
        raise UsageError(f"--algo hierarchical needs a cluster of two or more nodes, and "
                         f"{preset} is one node: choose one of {', '.join(multi)}")
    if n % per_node or n // per_node < 2:
        raise UsageError(f"--algo hierarchical needs whole nodes: --world-size must be a "
                         f"multiple of {per_node} (GPUs per node of {preset}) from "
                         f"{2 * per_node}, got {n}")
    nodes = n // per_node
    requested = parse_size(size, MAX_BYTES, "--bytes", " per rank (more than any GPU holds)")
    numel = -(-requested // FP32_BYTES)
    nbytes = numel * FP32_BYTES
    cluster = Cluster.preset(preset, visible=",".join(str(i) for i in range(n)))
    result = launch(_hierarchical_meta, cluster, numel, per_node)
    seconds = result.trace.makespan
    intra, inter = cluster.route(0, 1), cluster.route(0, per_node)
    closed = cost.hierarchical_allreduce_time(nodes, per_node, nbytes, intra.alpha_s,
                                              intra.beta_Bps, inter.alpha_s, inter.beta_Bps)
    inside = [sum(b for peer, b in s.sent_to.items() if peer // per_node == r // per_node)
              for r, s in enumerate(result.stats)]
    return {
        "algo": "hierarchical", "world_size": n, "nodes": nodes, "gpus_per_node": per_node,
        "bytes": nbytes, "bytes_requested": requested, "dtype": "fp32", "cluster": preset,
        "gpu": cluster.gpu.display_name, "time_s": seconds,
        "algbw": cost.algbw(nbytes, seconds), "busbw": cost.busbw(nbytes, seconds, n),
        "algbw_GBps": cost.algbw(nbytes, seconds) / 1e9,
        "busbw_GBps": cost.busbw(nbytes, seconds, n) / 1e9,
        "bytes_sent_per_rank": result.bytes_sent_per_rank,
        "bytes_received_per_rank": result.bytes_received_per_rank,
        "bytes_sent_inside_node_per_rank": inside,
        "bytes_sent_across_nodes_per_rank": [t - i for t, i in
                                             zip(result.bytes_sent_per_rank, inside)],
        "link_alpha_s": intra.alpha_s, "link_beta_Bps": intra.beta_Bps,
        "inter_node_alpha_s": inter.alpha_s, "inter_node_beta_Bps": inter.beta_Bps,
        "closed_form_s": closed,
        "closed_form": "2(G-1)(a_intra + S/(G b_intra)) + 2(M-1)(a_inter + S/(G M b_inter))",
        "slowdown_vs_closed_form": seconds / closed,
    }


def _world_size(preset: str, world_size: int | None) -> int:
    """The number of ranks: ``world_size``, or every device of ``preset`` when None."""
    if preset not in Cluster.presets():
        raise UsageError(f"unknown cluster preset {preset!r}: choose one of "
                         + ", ".join(Cluster.presets()))
    n_max = Cluster.preset(preset).n_physical
    n = n_max if world_size is None else world_size
    if not 1 <= n <= n_max:
        raise UsageError(f"--world-size must be between 1 and {n_max} (the devices of "
                         f"{preset}), got {n}")
    return n


def allreduce_text(r: dict) -> str:
    """The human-readable report of ``simulate_allreduce``."""
    n, size = r["world_size"], format_bytes(r["bytes"])
    lines = [f"{r['algo']} all-reduce of {size} ({r['bytes']} bytes, fp32) on {n} x "
             f"{r['gpu']} ({r['cluster']}, devices 0..{n - 1})"]
    if r["bytes"] != r["bytes_requested"]:
        lines.append(f"  note: {r['bytes_requested']} bytes rounded up to {r['bytes']}, "
                     "whole fp32 elements (4 bytes each)")
    lines.append(f"  time      {_ms(r['time_s'])}")
    if r["algbw"] is None:
        lines.append("  algbw     n/a (nothing crosses a link: zero time)")
    else:
        lines.append(f"  algbw     {r['algbw_GBps']:.2f} GB/s   bytes / time")
        lines.append(f"  busbw     {r['busbw_GBps']:.2f} GB/s   algbw x 2(N-1)/N "
                     "(nccl-tests' bus bandwidth)")
    if "nodes" in r:
        lines.append(f"  nodes     {r['nodes']} x {r['gpus_per_node']} GPUs; inside a node "
                     f"alpha {r['link_alpha_s'] * 1e6:g} us, beta {r['link_beta_Bps'] / 1e9:g} "
                     f"GB/s; across nodes alpha {r['inter_node_alpha_s'] * 1e6:g} us, beta "
                     f"{r['inter_node_beta_Bps'] / 1e9:g} GB/s")
        lines.append("  inside    " + _per_rank(r["bytes_sent_inside_node_per_rank"]))
        lines.append("  across    " + _per_rank(r["bytes_sent_across_nodes_per_rank"]))
    lines.append("  sent      " + _per_rank(r["bytes_sent_per_rank"]))
    lines.append("  received  " + _per_rank(r["bytes_received_per_rank"]))
    if "nodes" in r:
        lines.append(f"closed form with both link classes: {r['closed_form']} = "
                     f"{_ms(r['closed_form_s'])}")
        lines.append(f"  simulated / closed form = {r['slowdown_vs_closed_form']:.3f}: the "
                     "preset also charges every addition (the form's adds are free)")
        return "\n".join(lines)
    if r["link_alpha_s"] is not None:
        lines.append(f"closed form on a uniform link of alpha {r['link_alpha_s'] * 1e6:g} us, "
                     f"beta {r['link_beta_Bps'] / 1e9:g} GB/s: {r['closed_form']} = "
                     f"{_ms(r['closed_form_s'])}")
    slowdown = r["slowdown_vs_closed_form"]
    if slowdown is not None:
        why = ("transfers queued for a shared resource (contention)" if slowdown > 1 + 1e-9
               else "no contention")
        lines.append(f"  simulated / closed form = {slowdown:.3f}: {why}")
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4f} ms"


def _per_rank(values: list[int]) -> str:
    if len(set(values)) == 1:
        return f"{format_bytes(values[0])} by every rank ({values[0]} bytes)"
    return ", ".join(f"rank {i}: {format_bytes(v)}" for i, v in enumerate(values))


# ---- the table of WHATs: add a pair here for each new ``simulate WHAT`` --------------------

PARSERS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "allreduce": add_allreduce_parser,
    "pipeline": add_pipeline_parser,
    "step": add_step_parser,
}
HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "allreduce": run_allreduce,
    "pipeline": run_pipeline,
    "step": run_step,
}
