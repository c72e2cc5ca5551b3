"""Lesson 01's figures: what one message costs on each link, who sends how many bytes, the
comm rows of several runs on one time axis, the ring before a step, and the speedup of a
training step as devices are added.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure

from mpgpu_edu.comm import LaunchResult
from mpgpu_edu.cluster.hardware import LINKS
from mpgpu_edu.cluster.trace import Trace
from mpgpu_edu.viz.devicebox import link_name
from mpgpu_edu.viz.palette import (FONT_SIZE, KIND_COLORS, OKABE_ITO, WARNING_COLOR, bytes_axis,
                                   format_bytes, format_seconds, new_figure, style, time_axis)
from mpgpu_edu.viz.ring import plot_ring_step, ring_steps
from mpgpu_edu.viz.scaling import plot_allreduce_vs_size, speedups
from mpgpu_edu.viz.timeline import plot_timeline


def plot_message_time(links: Sequence[str], sizes: Sequence[int]) -> Figure:
    """Time of one message against its size, log-log, one line per link profile: flat where
    the latency alpha dominates, slope 1 where the bandwidth beta does."""
    results = {f"{link_name(name)} ({LINKS[name].beta_Bps / 1e9:g} GB/s effective)":
               {n: LINKS[name].seconds(n) for n in sizes} for name in links}
    fig = plot_allreduce_vs_size(results, title="one message: alpha + n / beta")
    ax = fig.axes[0]
    ax.set_xlabel("message size (log scale)")
    ax.set_ylabel("time of one message (log scale)")
    return fig


def ring_figure(world_size: int, step: int, nbytes: int | None = None) -> Figure:
    """The ring before step ``step``, in exercise 1.4's order: the reduce-scatter leaves
    rank r the full sum of chunk r."""
    return plot_ring_step(world_size, step, nbytes=nbytes, steps=ring_steps(world_size, 0))


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


def plot_comm_timelines(traces: Mapping[str, Trace], title: str | None = None,
                        until: float | None = None) -> Figure:
    """The comm rows of several runs (``{label: trace}``) on one time axis, every message's
    bar labelled with its peer ("to 1", "from 0"); each panel's title gives its label and
    makespan. ``until`` (seconds) shows only the messages that start before it, so that
    short bars stay wide enough for their labels."""
    heights = [0.55 * t.n_devices + 1.1 for t in traces.values()]
    fig = new_figure(12, sum(heights) + (0.9 if title else 0.4))
    axes = fig.subplots(len(traces), 1, height_ratios=heights, squeeze=False)[:, 0]
    shown = {label: _before(trace, until) for label, trace in traces.items()}
    right = max(t.makespan for t in shown.values())
    for ax, (label, trace) in zip(axes, traces.items()):
        part = shown[label]
        sends = [e for e in trace.events if e.kind == "send"]
        shown_sends = [e for e in part.events if e.kind == "send"]
        first = "" if len(shown_sends) == len(sends) else (
            f" (shown: its first {len(shown_sends)} of {len(sends)} messages)")
        plot_timeline(part, ax=ax, streams=("comm",),
                      title=f"{label}: makespan {format_seconds(trace.makespan)}{first}")
        time_axis(ax, right)  # one unit and one scale for every panel
    for ax in axes[:-1]:
        ax.set_xlabel("")
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=FONT_SIZE + 2)
    return fig


def _before(trace: Trace, until: float | None) -> Trace:
    if until is None:
        return trace
    return Trace(trace.n_devices, [e for e in trace.events if e.start < until],
                 source=trace.source)


MACHINE_COLORS = (OKABE_ITO["blue"], OKABE_ITO["bluish_green"], OKABE_ITO["orange"])
WORKLOAD_STYLES = (("-", "o"), ("--", "s"), (":", "^"))


def plot_step_speedups(results: Mapping[tuple[str, str], Mapping[int, float]],
                       title: str) -> Figure:
    """Speedup of one training step against devices, for ``{(workload, machine): {N: s}}``:
    one colour per machine, one line style per workload; points slower than one device
    circled in red; the ideal dashed black."""
    fig = new_figure(8, 4.5)
    ax = fig.add_subplot()
    machines = list(dict.fromkeys(m for _, m in results))
    workloads = list(dict.fromkeys(w for w, _ in results))
    for (workload, machine), times in results.items():
        gains = speedups(times)
        line, marker = WORKLOAD_STYLES[workloads.index(workload) % len(WORKLOAD_STYLES)]
        ax.plot(list(gains), list(gains.values()), linestyle=line, marker=marker, linewidth=1.8,
                color=MACHINE_COLORS[machines.index(machine) % len(MACHINE_COLORS)],
                label=f"{workload}, {machine}")
        slower = [(n, g) for n, g in gains.items() if g < 1]
        ax.scatter([n for n, _ in slower], [g for _, g in slower], s=160, facecolors="none",
                   edgecolors=WARNING_COLOR, linewidths=1.8, zorder=4)
    sizes = sorted({n for times in results.values() for n in times})
    ax.plot(sizes, sizes, linestyle=(0, (4, 3)), color="black", linewidth=1, label="ideal")
    ax.scatter([], [], s=160, facecolors="none", edgecolors=WARNING_COLOR, linewidths=1.8,
               label="slower than 1 device")
    ax.axhline(1.0, color="#777777", linestyle=":", linewidth=1)
    ax.set_xticks(sizes)
    ax.set_xlabel("devices (world size)")
    ax.set_ylabel("speedup over 1 device (x)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
              fontsize=FONT_SIZE - 1)
    ax.set_title(title, loc="left", fontsize=FONT_SIZE + 1)
    style(ax, grid="both")
    return fig
