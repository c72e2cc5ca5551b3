"""Lesson 04's figures: the cost of each pipeline stage, activations and gradients flowing
between stages, and the timelines and memory of schedules side by side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from mpgpu_edu.comm import LaunchResult
from mpgpu_edu.pipeline import Placement
from mpgpu_edu.cluster.trace import Trace
from mpgpu_edu.viz.devicemap import format_count
from mpgpu_edu.viz.memory import plot_memory_compare
from mpgpu_edu.viz.palette import FONT_SIZE, OKABE_ITO, new_figure, series_color, style
from mpgpu_edu.viz.timeline import plot_timeline, plot_timelines_side_by_side


ACTIVATION_COLOR = OKABE_ITO["black"]
GRADIENT_COLOR = OKABE_ITO["vermillion"]


def plot_stage_costs(placements: Mapping[str, Placement], by: str = "params",
                     title: str | None = None) -> Figure:
    """One panel per placement: a bar per stage, its parameters (``by="params"``) or forward
    FLOPs (``"flops"``); the dashed line is the ideal, the total divided evenly. ``title``
    (say, whose split it is) goes above the panels."""
    fig = new_figure(3.8 * len(placements) + 0.8, 3.6)
    axes = fig.subplots(1, len(placements), sharey=True, squeeze=False)[0]
    top = 0.0
    for ax, (label, placement) in zip(axes, placements.items()):
        costs = [s.n_params if by == "params" else s.flops for s in placement.stages]
        top = max(top, *costs)
        bars = ax.bar(range(len(costs)), costs, color=series_color(0), width=0.6)
        for bar, cost, stage in zip(bars, costs, placement.stages):
            ax.annotate(f"{format_count(int(cost))}\n{_layers(stage.layers)}",
                        (bar.get_x() + bar.get_width() / 2, cost), xytext=(0, 2),
                        textcoords="offset points", ha="center", va="bottom",
                        fontsize=FONT_SIZE - 2)
        ideal = sum(costs) / len(costs)
        ax.axhline(ideal, color="black", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(costs)), [f"stage {s}" for s in range(len(costs))])
        ax.set_title(f"{label}:\nlargest stage {max(costs) / ideal:.2f} x the even share "
                     "(dashed)", loc="left", fontsize=FONT_SIZE)
        style(ax, grid="y")
    axes[0].set_ylim(0, top * 1.3)
    axes[0].yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: format_count(int(y))))
    axes[0].set_ylabel("parameters" if by == "params" else "forward FLOPs")
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=FONT_SIZE)
    return fig


def _layers(names: Sequence[str]) -> str:
    return f"layer {names[0]}" if len(names) == 1 else f"layers {names[0]}-{names[-1]}"


def stage_messages(trace: Trace) -> list:
    """The trace's sends in time order (ties: by device)."""
    return sorted((e for e in trace.events if e.kind == "send"), key=lambda e: (e.start, e.device))


def message_kind(event) -> str:  # noqa: ANN001 - a trace Event
    """What a pipeline message carries: activations go to the next stage, gradients back."""
    return "activations" if event.peer > event.device else "gradient"


def plot_flow(trace: Trace, title: str | None = None) -> Figure:
    """The compute timeline with an arrow for every message: black from a forward to the next
    stage (activations), red from a backward to the previous stage (gradients)."""
    fig = plot_timeline(trace, streams=("compute",), title=title)
    ax = fig.axes[0]
    for e in stage_messages(trace):
        color = ACTIVATION_COLOR if e.peer > e.device else GRADIENT_COLOR
        ax.annotate("", xy=(e.end, e.peer), xytext=(e.start, e.device),
                    arrowprops={"arrowstyle": "-|>", "color": color, "linewidth": 1.4,
                                "shrinkA": 0, "shrinkB": 6}, gid=f"message:{message_kind(e)}")
    handles = [Line2D([], [], color=ACTIVATION_COLOR, label="activations -> next stage"),
               Line2D([], [], color=GRADIENT_COLOR, label="gradient -> previous stage")]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, frameon=False,
               fontsize=FONT_SIZE - 1)
    return fig


def plot_link_timelines(traces: Mapping[str, Trace]) -> Figure:
    """``timed_trace`` runs stacked on one time axis, each panel with its own time labels."""
    fig = plot_timelines_side_by_side(traces, streams=("compute",))
    xlabel = fig.axes[-1].get_xlabel()
    for ax in fig.axes:
        ax.tick_params(labelbottom=True)
        ax.set_xlabel(xlabel)
    return fig


def plot_memory_runs(runs: Mapping[str, LaunchResult], label: str, device: int = 0) -> Figure:
    """``device``'s memory over the step under each run, side by side; ``label`` (whose
    executor ran them) as the figure's title."""
    fig = plot_memory_compare({name: run.trace for name, run in runs.items()}, device=device)
    fig.suptitle(f"run by: {label}", x=0.01, ha="left", fontsize=FONT_SIZE)
    return fig


def plot_timeline_runs(runs: Mapping[str, LaunchResult], label: str) -> Figure:
    """The runs' compute timelines stacked on one time axis, ``label`` as the title."""
    fig = plot_timelines_side_by_side({name: run.trace for name, run in runs.items()},
                                      streams=("compute",))
    fig.suptitle(f"run by: {label}", x=0.01, ha="left", fontsize=FONT_SIZE)
    return fig


def plot_bubble(n_stages: int, rows: Sequence[dict]) -> Figure:
    """Both bubble measures against the number of microbatches M, for P = ``n_stages``:
    lines are the closed forms, dots the measured GPipe schedules (``rows``: lesson 04's
    ``bubble_rows``)."""
    ax = new_figure(7.5, 4).add_subplot()
    ms = [r["M"] for r in rows]
    p = n_stages
    for i, (key, formula, label) in enumerate((
            ("idle_share", "idle_formula", "idle / total time = (P-1)/(M+P-1)"),
            ("overhead", "overhead_formula", "idle / ideal compute = (P-1)/M"))):
        ax.plot(ms, [100 * r[formula] for r in rows], color=series_color(i), label=label)
        ax.plot(ms, [100 * r[key] for r in rows], "o", color=series_color(i))
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.set_xlabel("microbatches M (log scale)")
    ax.set_ylabel("bubble (%)")
    ax.set_ylim(0, 100 * (p - 1) / ms[0] * 1.08)
    ax.set_title(f"GPipe bubble with P = {p} stages: lines are the formulas, dots measured",
                 loc="left")
    ax.legend(frameon=False)
    style(ax)
    return ax.figure
