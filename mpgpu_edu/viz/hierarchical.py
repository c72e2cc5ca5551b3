"""Lesson 07's all-reduce across nodes: the sends of a flat ring and of the hierarchical
all-reduce on one time axis (``plot_allreduce_timelines``), of the runs
``mpgpu_edu.lessons.many_machines`` makes.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from mpgpu_edu.viz.palette import (FONT_SIZE, OKABE_ITO, format_seconds, new_figure,
                                   style, time_axis)


def plot_allreduce_timelines(runs: dict[str, dict], per_node: int = 8,
                             label: str = "") -> Figure:
    """The sends of each run, one row per rank on one time axis: blue inside a node (NVLink),
    vermillion across the network (a NIC), a white edge between consecutive messages. ``runs``
    as ``allreduce_runs`` returns them; ``label`` (a ``Chosen``'s: whose all-reduce it is)
    titles the hierarchical run."""
    inside, across = OKABE_ITO["blue"], OKABE_ITO["vermillion"]
    longest = max(r["seconds"] for r in runs.values())
    n = max(r["trace"].n_devices for r in runs.values())
    fig = new_figure(11, 0.26 * n * len(runs) + 1.6)
    axes = fig.subplots(len(runs), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (name, run) in zip(axes, runs.items()):
        for e in run["trace"].events:
            if e.kind != "send" or e.peer is None:
                continue
            crosses = e.device // per_node != e.peer // per_node
            # a white edge separates back-to-back messages, so every step can be counted
            ax.barh(e.device, max(e.end - e.start, longest / 1500), left=e.start, height=0.7,
                    color=across if crosses else inside, edgecolor="white", linewidth=0.7)
        for k in range(1, n // per_node):  # between the nodes, as long as the run
            ax.hlines(k * per_node - 0.5, 0, run["seconds"], color="black", linewidth=1.0)
        ax.axvline(run["seconds"], color="black", linestyle="--", linewidth=1)
        ax.set_yticks(range(n), [f"rank {d} (node {d // per_node} GPU {d % per_node})"
                                 for d in range(n)], fontsize=FONT_SIZE - 3)
        ax.set_ylim(n - 0.5, -0.5)
        time_axis(ax, longest)
        ax.set_xlim(0, longest * 1.02)
        steps = _label_phases(ax, run["trace"], per_node, n, longest)
        style(ax, grid="x")
        shown = label if label and name != "flat ring" else name
        ax.set_title(f"{shown}: {format_seconds(run['seconds'])} simulated, closed form "
                     f"{format_seconds(run['closed_form'])} (additions free){steps}", loc="left",
                     fontsize=FONT_SIZE)
    for ax in axes[:-1]:
        ax.set_xlabel("")
    axes[0].legend(handles=[Patch(color=inside, label="send inside a node (NVLink)"),
                            Patch(color=across, label="send across nodes (a NIC)")],
                   loc="lower right", bbox_to_anchor=(1.0, 1.12), ncol=2, frameon=False,
                   fontsize=FONT_SIZE - 1)
    return fig


def _label_phases(ax: Any, trace: Any, per_node: int, n: int, longest: float) -> str:
    """What happens left to right. The hierarchical all-reduce (network only in the middle):
    its three phases, in a box right of the run. A flat ring (network from start to end):
    returned as one line for the title, its steps and the ranks whose sends cross."""
    across = [e for e in trace.events if e.kind == "send" and e.peer is not None
              and e.device // per_node != e.peer // per_node]
    if not across:
        return ""
    start, end = min(e.start for e in across), max(e.end for e in across)
    if start <= 0 or end >= trace.makespan:
        crossing = sorted({e.device for e in across})
        steps = max(sum(1 for e in across if e.device == d) for d in crossing)
        return (f"\n{steps} steps, one message per rank each; only ranks "
                f"{' and '.join(map(str, crossing))} send across the network (vermillion), "
                "and every step waits for them")
    ax.text(trace.makespan + longest * 0.03, (n - 1) / 2,
            "left to right:\n1. reduce-scatter inside each node (blue)\n"
            "2. all-reduce of one chunk per rail, across the network (vermillion)\n"
            "3. all-gather inside each node (blue)", ha="left", va="center", fontsize=9,
            bbox={"facecolor": "white", "edgecolor": "#999999", "pad": 4})
    return ""
