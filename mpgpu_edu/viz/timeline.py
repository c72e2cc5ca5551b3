"""Timelines: who computed, who communicated, and who waited, device by device.

One row per device and stream ("dev 0 compute", "dev 0 comm"), one bar per event coloured by
its kind. Gaps on a compute row are the time that device had nothing to do: they are hatched
grey, and the row ends with the device's idle share of the run ("idle 43%"). A pipeline's
bubble is the hatched triangle you see at the start and end of a GPipe step.

A comm stream can send and receive at the same time (links are full duplex); where it does,
its row splits into two half-height bands, sends above and receives below. Messages of one
band that run at the same time (a server sending to 7 workers at once) are not drawn on top of
each other: each takes its own thin sub-lane of the band (greedy interval assignment, at most
``MAX_LANES`` deep), and a bar's label is written only where it fits. Where no label of such
a group fits, one badge counts the group: "×7 to 0..6".
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from mpgpu_edu.cluster.trace import KINDS, Event, Trace, merged_intervals
from mpgpu_edu.viz.lanes import BAR_HEIGHT, Placed, count_badge, place_row
from mpgpu_edu.viz.palette import (
    COLORS, FONT_SIZE, IDLE_COLOR, IDLE_EDGE, IDLE_HATCH, OKABE_ITO, format_seconds, new_figure,
    style, text_color_on, time_axis,
)

LABEL_FONT_SIZE = 8
MIN_BAR_PX = 2.5   # the narrowest bar drawn: a tiny message stays visible
EDGE_MIN_PX = 5.0  # bars narrower than this lose their white edge (it would hide them)


def _kind_color(kind: str) -> str:
    return COLORS.get(kind, OKABE_ITO["grey"])


def idle_gaps(events: Sequence[Event], end: float) -> list[tuple[float, float]]:
    """The intervals of [0, end] that no event covers: (start, end) pairs."""
    gaps, cursor = [], 0.0
    for start, stop in merged_intervals((e.start, e.end) for e in events):
        if start > cursor:
            gaps.append((cursor, start))
        cursor = max(cursor, stop)
    if end > cursor:
        gaps.append((cursor, end))
    return gaps


def _sends_meet_others(events: Sequence[Event]) -> bool:
    """Whether some send overlaps in time some event of another kind (a receive)."""
    sends = [e for e in events if e.kind == "send"]
    others = [e for e in events if e.kind != "send"]
    return any(s.start < o.end and o.start < s.end for s in sends for o in others)


def _device_name(device: int, device_names: Mapping[int, str] | Sequence[str] | None) -> str:
    if device_names is None:
        return f"dev {device}"
    return str(device_names[device])


def _text_px(text: str, size: float, dpi: float) -> float:
    """About how wide ``text`` is drawn at ``size`` points, padding included."""
    return len(text) * size * 0.62 * dpi / 72 + 4


def _fits(text: str, size: float, width_px: float, height_px: float, dpi: float) -> bool:
    return width_px >= _text_px(text, size, dpi) and height_px >= size * dpi / 72 * 1.2


def _draw_bars(ax: Axes, placed: Sequence[Placed], seconds_per_px: float,
               row_px: float) -> None:
    """One bar per event. A message too short to see at this scale (a 4 KiB send beside a
    40 ms backward) is drawn ``MIN_BAR_PX`` wide and without the white edge that separates
    neighbouring bars, so it shows as a solid mark of its kind's colour, not a pale smear.
    Bars in sub-lanes have no edge either: the gap between lanes keeps them apart."""
    narrow = EDGE_MIN_PX * seconds_per_px
    for kind in dict.fromkeys(p.event.kind for p in placed):
        mine = [p for p in placed if p.event.kind == kind]
        for edged in (True, False):
            group = [p for p in mine
                     if (p.event.duration >= narrow and p.lanes == 1) == edged]
            if not group:
                continue
            bars = ax.barh([p.y for p in group],
                           [max(p.event.duration, MIN_BAR_PX * seconds_per_px) for p in group],
                           left=[p.event.start for p in group],
                           height=[p.height for p in group],
                           color=_kind_color(kind), edgecolor="white" if edged else "none",
                           linewidth=0.6 if edged else 0, label=kind)
            for rect in bars.patches:
                rect.set_gid(f"event:{kind}")
    _draw_labels(ax, placed, seconds_per_px, row_px)


_CHUNK_STEP = re.compile(r"^([FB]\d+)\.\d+$")


def _label_forms(label: str) -> tuple[str, ...]:
    """The label, and a shorter form to try where it does not fit: a step through a later
    chunk ("B3.1", its colour says which chunks) keeps its microbatch ("B3")."""
    short = _CHUNK_STEP.match(label)
    return (label, short.group(1)) if short else (label,)


def _draw_labels(ax: Axes, placed: Sequence[Placed], seconds_per_px: float,
                 row_px: float) -> None:
    """Each event's label ("F3", "to 2") inside its bar, only where it fits in the bar's
    width and its lane's height. A group of events running at once of which no label fits
    gets one count badge ("×7 to 0..6") across the group, if that fits."""
    dpi = ax.figure.dpi
    clusters: dict[int, list[Placed]] = {}
    for p in placed:
        clusters.setdefault(p.cluster, []).append(p)
    for group in clusters.values():
        wrote = False
        for p in group:
            e = p.event
            if not e.label:
                continue
            sizes = (LABEL_FONT_SIZE, LABEL_FONT_SIZE - 1) if p.height >= BAR_HEIGHT else (
                LABEL_FONT_SIZE - 1,)
            fit = next(((text, size) for text in _label_forms(e.label) for size in sizes
                        if _fits(text, size, e.duration / seconds_per_px, p.height * row_px,
                                 dpi)), None)
            if fit is not None:
                text, size = fit
                ax.text(e.start + e.duration / 2, p.y, text, ha="center", va="center",
                        fontsize=size, color=text_color_on(_kind_color(e.kind)),
                        clip_on=True, gid="bar-label")
                wrote = True
        if wrote or group[0].lanes == 1:
            continue
        events = [p.event for p in group]
        start, end = min(e.start for e in events), max(e.end for e in events)
        top, height = group[0].band
        size = LABEL_FONT_SIZE - 1
        for text in dict.fromkeys((count_badge(events), count_badge(events).split()[0])):
            if _fits(text, size, (end - start) / seconds_per_px, height * row_px, dpi):
                kind = max({e.kind for e in events}, key=[e.kind for e in events].count)
                ax.text((start + end) / 2, top + height / 2, text, ha="center", va="center",
                        fontsize=size, color=text_color_on(_kind_color(kind)), clip_on=True,
                        gid="lane-count",
                        bbox={"boxstyle": "round,pad=0.15", "facecolor": _kind_color(kind),
                              "edgecolor": "none"})
                break


def _draw_idle(ax: Axes, y: float, trace: Trace, device: int, show_idle: bool) -> bool:
    """Hatch the compute row's gaps (with ``show_idle``) and write the device's idle share at
    the row's right end; returns whether any gap was hatched."""
    gaps = idle_gaps(trace.on(device, "compute"), trace.makespan) if show_idle else []
    if gaps:
        bars = ax.barh([y] * len(gaps), [b - a for a, b in gaps], left=[a for a, _ in gaps],
                       height=BAR_HEIGHT, color=IDLE_COLOR, edgecolor=IDLE_EDGE, linewidth=0,
                       hatch=IDLE_HATCH, label="idle")
        for rect in bars.patches:
            rect.set_gid("idle")
    ax.annotate(f"idle {trace.idle_fraction(device):.0%}", xy=(1.0, y),
                xycoords=("axes fraction", "data"), xytext=(6, 0), textcoords="offset points",
                va="center", ha="left", fontsize=FONT_SIZE - 1, gid="idle-label")
    return bool(gaps)


def _legend(ax: Axes, kinds: set[str], with_idle: bool, comm_compute: bool = False) -> None:
    """One patch per kind drawn; ``comm_compute``: compute bars also sit on a comm row (a
    collective's own adds and copies, on the comm stream), which the label says."""
    ordered = [k for k in KINDS if k in kinds] + sorted(kinds - set(KINDS))
    names = {"compute": "compute (comm: adds, copies)"} if comm_compute else {}
    handles = [Patch(facecolor=_kind_color(k), label=names.get(k, k)) for k in ordered]
    if with_idle:
        handles.append(Patch(facecolor=IDLE_COLOR, edgecolor=IDLE_EDGE, hatch=IDLE_HATCH,
                             linewidth=0, label="idle"))
    if handles:
        ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=len(handles),
                  frameon=False, fontsize=FONT_SIZE - 1, handlelength=1.6, borderaxespad=0.2)


def _draw_timeline(ax: Axes, trace: Trace, *, title: str | None, devices: Sequence[int],
                   streams: Sequence[str], show_idle: bool,
                   device_names: Mapping[int, str] | Sequence[str] | None, span: float) -> None:
    rows = [(d, s) for d in devices for s in streams]
    time_axis(ax, span)
    # Axis width before layout, less the room the row labels will take: good enough to decide
    # whether a bar's label fits inside it.
    width_px = max(ax.get_window_extent().width - 90, 50)
    seconds_per_px = (span if span > 0 else 1.0) / width_px
    # Likewise the height of one row (the title and legend above take a little of it).
    row_px = 0.85 * ax.get_window_extent().height / max(len(rows), 1)
    kinds: set[str] = set()
    drew_idle = comm_compute = False
    for y, (device, stream) in enumerate(rows):
        events = trace.on(device, stream)
        # the legend names what can be seen: not a kind whose every bar is under a pixel wide
        kinds.update(e.kind for e in events if e.duration >= seconds_per_px)
        comm_compute = comm_compute or (stream == "comm"
                                        and any(e.kind == "compute" for e in events))
        split = stream == "comm" and _sends_meet_others(events)
        _draw_bars(ax, place_row(y, events, split), seconds_per_px, row_px)
        if stream == "compute" and trace.makespan > 0:
            drew_idle = _draw_idle(ax, y, trace, device, show_idle) or drew_idle
    for i in range(1, len(devices)):
        ax.axhline(i * len(streams) - 0.5, color="#B0B0B0", linewidth=0.8)
    ax.set_yticks(range(len(rows)),
                  [f"{_device_name(d, device_names)} {s}" for d, s in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first device on top
    style(ax, grid="x")
    ax.tick_params(axis="y", length=0)
    _legend(ax, kinds, drew_idle, comm_compute)
    if title is None:
        plural = "s" if len(devices) != 1 else ""
        title = (f"{trace.source} timeline: {len(devices)} device{plural}, "
                 f"makespan {format_seconds(trace.makespan)}")
    ax.set_title(title, loc="left", pad=22, fontsize=FONT_SIZE + 1)  # pad: the legend sits above


def _devices(trace: Trace, devices: Sequence[int] | None) -> list[int]:
    return list(range(trace.n_devices)) if devices is None else list(devices)


def plot_timeline(trace: Trace, *, ax: Axes | None = None, title: str | None = None,
                  devices: Sequence[int] | None = None,
                  streams: Sequence[str] = ("compute", "comm"), show_idle: bool = True,
                  device_names: Mapping[int, str] | Sequence[str] | None = None) -> Figure:
    """A Gantt chart of ``trace``: one row per device and stream, bars coloured by kind
    (``palette.KIND_COLORS``), idle gaps on compute rows hatched, and each compute row's
    idle share (``trace.idle_fraction(device)``) written at its right end.

    ``devices`` picks and orders the devices (default: all); ``device_names`` replaces
    "dev 3" by a name of your own (``{3: "cuda:1 (GPU 3)"}``). Returns the figure (``ax``'s
    figure when given)."""
    devices = _devices(trace, devices)
    if ax is None:
        ax = new_figure(10, 0.6 * len(devices) * len(streams) + 1.5).add_subplot()
    _draw_timeline(ax, trace, title=title, devices=devices, streams=streams,
                   show_idle=show_idle, device_names=device_names, span=trace.makespan)
    return ax.figure


def plot_timelines_side_by_side(traces: Mapping[str, Trace], *, share_x: bool = True,
                                devices: Sequence[int] | None = None,
                                streams: Sequence[str] = ("compute", "comm"),
                                show_idle: bool = True) -> Figure:
    """Several timelines stacked on one time axis, titled by their keys: simulated against
    measured, or GPipe against 1F1B. With ``share_x`` the shorter run ends early, and a dashed
    line marks where each run ends."""
    if not traces:
        raise ValueError("plot_timelines_side_by_side needs at least one trace")
    picked = {name: _devices(t, devices) for name, t in traces.items()}
    heights = [0.6 * len(d) * len(streams) + 1.0 for d in picked.values()]
    fig = new_figure(10, sum(heights) + 0.5)
    axes = fig.subplots(len(traces), 1, sharex=share_x, height_ratios=heights, squeeze=False)
    longest = max(t.makespan for t in traces.values())
    for ax, (name, trace) in zip(axes[:, 0], traces.items()):
        span = longest if share_x else trace.makespan
        _draw_timeline(ax, trace, title=f"{name}: makespan {format_seconds(trace.makespan)}",
                       devices=picked[name], streams=streams, show_idle=show_idle,
                       device_names=None, span=span)
        if share_x and trace.makespan < longest:
            ax.axvline(trace.makespan, color="black", linestyle="--", linewidth=1)
    if share_x:
        for ax in axes[:-1, 0]:
            ax.set_xlabel("")
    return fig
