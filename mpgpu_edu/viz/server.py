"""Lesson 02's figures: a parameter server's messages and its roles' timelines (workers and
servers), and loss curves against updates or simulated time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from mpgpu_edu.cluster.trace import Trace
from mpgpu_edu.viz.palette import FONT_SIZE, format_seconds, new_figure, series_color, style
from mpgpu_edu.viz.timeline import plot_timeline, time_axis

# Solid and thick, then dashed and thin on top: two curves that coincide both stay visible.
LINE_STYLES = (("-", 2.6), ("--", 1.6))


def comm_window(trace: Trace) -> Trace:
    """The trace's messages only, shifted so that the first starts at 0: a timeline of the
    communication alone, wide enough for short messages to carry their labels."""
    comm = [e for e in trace.events if e.stream == "comm"]
    t0 = min((e.start for e in comm), default=0.0)
    moved = [dataclasses.replace(e, start=e.start - t0, end=e.end - t0) for e in comm]
    return Trace(trace.n_devices, moved, source=trace.source, meta=dict(trace.meta))


def plot_comm_windows(panels: Mapping[str, tuple[Trace, Sequence[str]]],
                      share_x: bool = False) -> Figure:
    """One panel per ``{title: (trace, device names)}``: the messages of each run
    (``comm_window``), so every bar is wide enough to carry its label ("to 4", "from 2").
    Each panel has its own time axis, or with ``share_x`` one axis for all, as long as the
    longest window (a dashed line marks where a shorter one ends). A title's first line gets
    the window's length."""
    heights = [0.45 * trace.n_devices + 1.1 for trace, _ in panels.values()]
    fig = new_figure(10, sum(heights))
    axes = fig.subplots(len(panels), 1, squeeze=False, height_ratios=heights)[:, 0]
    windows = [comm_window(trace) for trace, _ in panels.values()]
    longest = max(w.makespan for w in windows)
    for ax, window, (title, (_, names)) in zip(axes, windows, panels.items()):
        head, _, rest = title.partition("\n")
        plot_timeline(window, ax=ax, streams=("comm",), device_names=list(names),
                      title=f"{head}: messages for {format_seconds(window.makespan)} "
                            "(from the first one)" + (f"\n{rest}" if rest else ""))
        if share_x:
            time_axis(ax, longest)  # one unit and one scale for every panel
            if window.makespan < longest:
                ax.axvline(window.makespan, color="black", linestyle="--", linewidth=1)
    return fig


def widen_messages(trace: Trace, seconds: float) -> Trace:
    """The trace with every message drawn at least ``seconds`` long (for a picture only):
    a 20 µs message beside milliseconds of compute becomes a bar that can be seen, and a
    send and a receive that follow each other then overlap, so the timeline puts the send
    in the upper half of the row and the receive in the lower. Compute events, and the
    makespan, stay as they are."""
    end = trace.makespan
    moved = []
    for e in trace.events:
        if e.stream == "comm" and e.duration < seconds:
            start = max(0.0, min(e.start, end - seconds))
            e = dataclasses.replace(e, start=start, end=min(start + seconds, end))
        moved.append(e)
    return Trace(trace.n_devices, moved, source=trace.source, meta=dict(trace.meta))


def plot_role_timelines(panels: Mapping[str, tuple[Trace, Sequence[str]]], *,
                        streams: Sequence[str] = ("compute", "comm"),
                        message_px: float = 8.0) -> Figure:
    """Timelines stacked on one time axis, one per ``{title: (trace, device names)}``, rows
    named by role ("worker 0", "server"). Messages are drawn at least ``message_px`` pixels
    wide (``widen_messages``), sends above receives; a title gets its run's makespan."""
    heights = [0.55 * trace.n_devices * len(streams) + 1.0 for trace, _ in panels.values()]
    fig = new_figure(10, sum(heights) + 0.5)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False, height_ratios=heights)
    longest = max(trace.makespan for trace, _ in panels.values())
    seconds = message_px * longest / (10 * fig.dpi * 0.8)
    for ax, (title, (trace, names)) in zip(axes[:, 0], panels.items()):
        plot_timeline(widen_messages(trace, seconds), ax=ax, streams=streams,
                      device_names=list(names),
                      title=f"{title}: makespan {format_seconds(trace.makespan)}")
        time_axis(ax, longest)
        if trace.makespan < longest:
            ax.axvline(trace.makespan, color="black", linestyle="--", linewidth=1)
    for ax in axes[:-1, 0]:
        ax.set_xlabel("")
    return fig


def plot_loss_curves(curves: Mapping[str, Sequence[float]], *,
                     times: Mapping[str, Sequence[float]] | None = None,
                     title: str | None = None, log: bool = True,
                     colors: Mapping[str, str] | None = None,
                     dashed: Sequence[str] = (), marked: Sequence[str] = ()) -> Figure:
    """Loss against update, one line per run (``{label: losses}``). ``colors`` gives a
    label its colour (default: the series colours in order), so that two runs of one
    setting can share it; the labels in ``dashed`` are drawn dashed and thinner on top, and
    those in ``marked`` also get a white circle at every point, so that a curve lying
    exactly on a solid one stays visible. With ``times`` (``{label: the time of each
    update}``, same labels) a second panel shows the loss against simulated time."""
    panels = 2 if times else 1
    fig = new_figure(5.2 * panels + 2.2, 3.8)
    axes = fig.subplots(1, panels, sharey=True, squeeze=False)[0]
    for i, (label, losses) in enumerate(curves.items()):
        dashes, width = LINE_STYLES[1 if label in dashed else 0]
        look = {"color": (colors or {}).get(label, series_color(i)), "linestyle": dashes,
                "linewidth": width, "label": label}
        if label in marked:
            look.update(marker="o", markersize=5, markerfacecolor="white",
                        markeredgewidth=1.3)
        axes[0].plot(range(1, len(losses) + 1), losses, **look)
        if times:
            axes[1].plot(times[label], losses, **look)
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_xlabel("update (optimizer steps applied)")
    axes[0].set_ylabel("training loss" + (" (log scale)" if log else ""))
    if times:
        axes[1].set_xlabel("simulated time")
        axes[1].xaxis.set_major_formatter(FuncFormatter(lambda t, _pos: format_seconds(t)))
        axes[1].set_title("against time", loc="left", fontsize=FONT_SIZE)
        axes[0].set_title("against updates", loc="left", fontsize=FONT_SIZE)
    for ax in axes:
        if log:
            ax.set_yscale("log")
        style(ax)
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
                    fontsize=FONT_SIZE - 1)
    fig.suptitle(title or "training loss", x=0.01, ha="left", fontsize=FONT_SIZE + 1)
    return fig
