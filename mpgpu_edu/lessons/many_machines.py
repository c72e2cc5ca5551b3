"""Lesson 07 (many machines): the programs the notebook calls.

- ``two_node_torchrun``: two ``torchrun`` launchers on this machine, one per "node", as on
  two real hosts (``mpgpu_edu.runtime.torchrun``); every rank runs this module and reports
  its node, local rank, global rank and the result of one all-reduce on gloo.
- ``allreduce_runs``: one all-reduce across 2 x 8 GPUs, a flat ring against the hierarchical
  all-reduce, on the simulator, each against its closed form (additions free, and with
  ``cost``'s additions: a kernel launch and memory traffic); ``hierarchy_explorer``: both at
  any size. Their figure is ``mpgpu_edu.viz.hierarchical``'s.

Run as ``python -m mpgpu_edu.lessons.many_machines`` it is the worker that each rank of the
torchrun demo runs (it reads torchrun's environment variables). So that a rank starts fast, this module
imports the package's layers and the figures (matplotlib) only when they are used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from mpgpu_edu.runtime import torchrun
from mpgpu_edu.runtime.torchrun import TorchrunResult, check_reports, torchrun_table

WORKER = "mpgpu_edu.lessons.many_machines"  # what every rank of the torchrun demo runs
# What the notebook takes from other modules, imported on first use: the figure.
_ELSEWHERE = dict.fromkeys(["plot_allreduce_timelines"], "mpgpu_edu.viz.hierarchical")


def __getattr__(name: str) -> Any:
    if name not in _ELSEWHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_ELSEWHERE[name]), name)


def reference_all_reduce(comm: Any, tensor: Any, per_node: int, op: str = "sum") -> None:
    """The package's hierarchical all-reduce: what the notebook's figures draw until the
    learner's 7.2 passes (``mp.yours``)."""
    from mpgpu_edu.collectives.hierarchical import all_reduce_hierarchical

    all_reduce_hierarchical(comm, tensor, per_node, op)


# ---- a real two-"node" torchrun on localhost --------------------------------------------------

def torchrun_command(node_rank: int, nnodes: int, nproc_per_node: int, port: int) -> list[str]:
    """The launcher of one node: ``torchrun --nnodes N --node-rank K --nproc-per-node P
    --master-addr 127.0.0.1 --master-port PORT -m mpgpu_edu.lessons.many_machines``."""
    return torchrun.torchrun_command(node_rank, nnodes, nproc_per_node, port, WORKER)


def two_node_torchrun(nproc_per_node: int = 2, nnodes: int = 2, timeout: float = 90.0,
                      visible: tuple[str, ...] | None = None) -> TorchrunResult:
    """``nnodes`` torchrun launchers of this module on this machine, each as if on its own
    host (``runtime.torchrun.launch_nodes``): every rank's report, sorted by global rank."""
    return torchrun.launch_nodes(WORKER, nproc_per_node, nnodes, timeout, visible)


# ---- one all-reduce across 2 x 8 GPUs: flat ring against hierarchical ---------------------

def _flat_meta(comm: Any, numel: int) -> None:
    from mpgpu_edu.collectives import all_reduce

    all_reduce(comm, _meta(numel), algo="ring")


def _hierarchical_meta(comm: Any, numel: int, per_node: int, hierarchical: Callable) -> None:
    hierarchical(comm, _meta(numel), per_node)


def _meta(numel: int) -> Any:
    import torch

    return torch.empty(numel, dtype=torch.float32, device="meta")


def link_forms(preset: str) -> tuple[int, int, tuple[float, float, float, float]]:
    """(nodes, GPUs per node, (alpha, beta) inside a node and between two GPUs of one rail)
    of a multi-node preset: what the closed forms take."""
    from mpgpu_edu.cluster import Cluster
    from mpgpu_edu.viz.nodes import node_shape

    cluster = Cluster.preset(preset)
    nodes, per_node = node_shape(cluster)
    inside, across = cluster.route(0, 1), cluster.route(0, per_node)
    return nodes, per_node, (inside.alpha_s, inside.beta_Bps, across.alpha_s, across.beta_Bps)


def allreduce_runs(preset: str = "2x8xH100-ib", nbytes: int = 2**28,
                   hierarchical: Callable | None = None) -> dict[str, dict]:
    """One all-reduce of ``nbytes`` (fp32, meta) on every GPU of ``preset``, as a flat ring
    and as ``hierarchical(comm, tensor, per_node)`` (the package's by default): for each,
    the trace, the simulated time and its closed form."""
    from mpgpu_edu.cluster import Cluster
    from mpgpu_edu.collectives import cost
    from mpgpu_edu.collectives.hierarchical import all_reduce_hierarchical
    from mpgpu_edu.comm import launch

    nodes, per_node, forms = link_forms(preset)
    cluster, numel = Cluster.preset(preset), nbytes // 4
    adds = (cluster.launch_overhead_s, cluster.memory_Bps)  # each addition: a kernel of its own
    flat = launch(_flat_meta, cluster, numel).trace
    hier = launch(_hierarchical_meta, cluster, numel, per_node,
                  hierarchical or all_reduce_hierarchical).trace
    return {
        "flat ring": {"trace": flat, "seconds": flat.makespan,
                      "closed_form": cost.flat_ring_two_level_time(nodes, per_node, nbytes,
                                                                   *forms),
                      "additions": cost.flat_ring_additions_time(nodes, per_node, nbytes,
                                                                 *adds)},
        "hierarchical": {"trace": hier, "seconds": hier.makespan,
                         "closed_form": cost.hierarchical_allreduce_time(nodes, per_node,
                                                                         nbytes, *forms),
                         "additions": cost.hierarchical_additions_time(nodes, per_node,
                                                                       nbytes, *adds)},
    }


def hierarchy_view(log2_bytes: int = 28, preset: str = "2x8xH100-ib",
                   hierarchical: Callable | None = None, label: str | None = None
                   ) -> tuple[Any, dict]:
    """The explorer's view: ``plot_allreduce_timelines`` of one all-reduce of 2**log2_bytes
    bytes on ``preset``, and the numbers it shows."""
    if not 10 <= log2_bytes <= 32:
        raise ValueError(f"log2_bytes must be from 10 (1 KiB) to 32 (4 GiB), got {log2_bytes}")
    runs = allreduce_runs(preset, 2**log2_bytes, hierarchical)
    _, per_node, _ = link_forms(preset)
    from mpgpu_edu.viz.hierarchical import plot_allreduce_timelines

    fig = plot_allreduce_timelines(runs, per_node, label or "")
    flat, hier = runs["flat ring"], runs["hierarchical"]
    return fig, {"bytes": 2**log2_bytes, "preset": preset, "flat_s": flat["seconds"],
                 "hier_s": hier["seconds"], "speedup": flat["seconds"] / hier["seconds"],
                 "speedup_form": flat["closed_form"] / hier["closed_form"]}


def _describe(info: dict) -> str:
    from mpgpu_edu.viz.palette import format_bytes, format_seconds

    return (f"<b>{format_bytes(info['bytes'])}</b> on {info['preset']}: flat ring "
            f"{format_seconds(info['flat_s'])}, hierarchical {format_seconds(info['hier_s'])}: "
            f"<b>{info['speedup']:.2f}x</b> faster (closed forms, additions free: "
            f"{info['speedup_form']:.2f}x)")


def hierarchy_explorer(hierarchical: Callable | None = None, log2_bytes: int = 24,
                       preset: str = "2x8xH100-ib") -> Any:
    """A size slider (2**k bytes) and a preset menu over ``hierarchy_view``: the flat ring
    and ``hierarchical`` (a ``Chosen`` from ``mp.yours`` names itself in the titles)."""
    from mpgpu_edu.explore.live import Explorer, dropdown, slider

    controls = {"log2_bytes": slider("size: 2^k bytes, k =", log2_bytes, 10, 32),
                "preset": dropdown("cluster", ["2x8xH100-ib", "2x8xA100-ib"], preset)}
    fixed = {"hierarchical": hierarchical, "label": getattr(hierarchical, "label", None)}
    return Explorer(hierarchy_view, controls, _describe, fixed=fixed)


if __name__ == "__main__":
    torchrun.report_rank()
