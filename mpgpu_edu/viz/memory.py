"""Where the memory goes: per device and category, against the device's capacity, over time.

Memory does not add up across devices: eight 24 GB cards are not one 192 GB card, because
data parallelism keeps a full replica (parameters, gradients, optimizer state) on every one.
The bars show each device's own total against its own capacity line; a bar above the line is
an out-of-memory error ("OOM") waiting to happen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from numbers import Integral

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from mpgpu_edu.cluster.trace import CATEGORIES, Trace
from mpgpu_edu.viz.palette import (
    COLORS, FONT_SIZE, OKABE_ITO, WARNING_COLOR, bytes_axis, format_bytes, new_figure,
    series_color, style, time_axis,
)

PerDevice = Sequence[Mapping[str, int]] | Mapping[str, Mapping[str, int]]


def _category_color(category: str) -> str:
    return COLORS.get(category, OKABE_ITO["grey"])


def capacity_text(nbytes: int) -> str:
    """``24 * 10**9`` -> ``"24 GB = 22.4 GiB"`` (a spec sheet's GB is 10**9 bytes);
    ``80 * 2**30`` -> ``"80 GiB"``."""
    if nbytes % 10**9 == 0 and nbytes % 2**30 != 0:
        return f"{nbytes // 10**9} GB = {format_bytes(nbytes)}"
    return format_bytes(nbytes)


def _by_label(per_device: PerDevice) -> dict[str, Mapping[str, int]]:
    if isinstance(per_device, Mapping):
        return {str(k): v for k, v in per_device.items()}
    return {f"dev {i}": v for i, v in enumerate(per_device)}


def _ordered_categories(bars: Mapping[str, Mapping[str, int]]) -> list[str]:
    present = {c for cats in bars.values() for c, n in cats.items() if n}
    return [c for c in CATEGORIES if c in present] + sorted(present - set(CATEGORIES))


def _draw_capacity(ax: Axes, capacities: list[int | None], label: str | None) -> list[Line2D]:
    """A dashed line at each bar's capacity: one line across the plot when all are equal,
    otherwise a short line over each bar (its value goes under the bar's name). Returns the
    legend entry; the legend, unlike text on the line, never hides behind a tall bar."""
    known = [c for c in capacities if c is not None]
    if not known:
        return []
    dashed = {"color": "black", "linestyle": "--", "linewidth": 1.2}
    if len(set(capacities)) == 1:
        name = f"{label}: " if label else "capacity: "
        ax.axhline(known[0], gid="capacity", **dashed)
        return [Line2D([], [], label=name + capacity_text(known[0]), **dashed)]
    for x, cap in enumerate(capacities):
        if cap is not None:
            ax.hlines(cap, x - 0.42, x + 0.42, gid="capacity", **dashed)
    return [Line2D([], [], label="capacity (under each name)", **dashed)]


def _tick_labels(labels: list[str], capacities: list[int | None]) -> list[str]:
    if len(set(capacities)) == 1:
        return labels
    # One short line each ("RTX 4090", "capacity", "24 GB", "= 22.4 GiB"): bars sit close.
    stacked = [None if cap is None else capacity_text(cap).replace(" = ", "\n= ")
               for cap in capacities]
    return [name if cap is None else f"{name}\ncapacity\n{cap}"
            for name, cap in zip(labels, stacked)]


def _capacities(capacity_bytes: int | Sequence[int] | None, n: int) -> list[int | None]:
    if capacity_bytes is None or isinstance(capacity_bytes, Integral):
        return [capacity_bytes] * n
    capacities = list(capacity_bytes)
    if len(capacities) != n:
        raise ValueError(f"{len(capacities)} capacities for {n} devices")
    return capacities


def _draw_stacked_bars(ax: Axes, bars: Mapping[str, Mapping[str, int]],
                       categories: list[str]) -> None:
    bottom = [0] * len(bars)
    for category in categories:
        heights = [cats.get(category, 0) for cats in bars.values()]
        drawn = ax.bar(range(len(bars)), heights, bottom=bottom, width=0.6, label=category,
                       color=_category_color(category), edgecolor="white", linewidth=0.6)
        for rect in drawn.patches:
            rect.set_gid(f"memory:{category}")
        bottom = [b + h for b, h in zip(bottom, heights)]


def _annotate_totals(ax: Axes, totals: list[int], capacities: list[int | None]) -> None:
    """Each bar's total on top, in red with "OOM" above it when it exceeds the capacity."""
    for x, (total, cap) in enumerate(zip(totals, capacities)):
        oom = cap is not None and total > cap
        ax.annotate(format_bytes(total), xy=(x, total), xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom", fontsize=FONT_SIZE - 1, gid="total",
                    color=WARNING_COLOR if oom else "black")
        if oom:
            ax.annotate("OOM", xy=(x, total), xytext=(0, 16), textcoords="offset points",
                        ha="center", va="bottom", fontsize=FONT_SIZE + 1, fontweight="bold",
                        color=WARNING_COLOR, gid="oom")


def plot_memory_bars(per_device: PerDevice, capacity_bytes: int | Sequence[int] | None, *,
                     title: str | None = None, capacity_label: str | None = None,
                     ax: Axes | None = None) -> Figure:
    """One stacked bar per device, a segment per memory category, with the device's total
    written on top and its capacity as a dashed line ("RTX 4090: 24 GB = 22.4 GiB" with
    ``capacity_label="RTX 4090"``). A bar whose total exceeds its capacity gets a red "OOM".

    ``per_device`` is a list of ``{category: bytes}`` (labelled "dev 0", "dev 1", ...) or a
    dict ``{device label: {category: bytes}}``; ``capacity_bytes`` is one number for every
    device, one per device, or None."""
    bars = _by_label(per_device)
    labels = list(bars)
    capacities = _capacities(capacity_bytes, len(labels))
    if ax is None:
        ax = new_figure(max(6.0, 1.3 * len(labels) + 3.0), 4.5).add_subplot()
    totals = [sum(bars[d].values()) for d in labels]
    categories = _ordered_categories(bars)
    _draw_stacked_bars(ax, bars, categories)
    _annotate_totals(ax, totals, capacities)
    capacity_handles = _draw_capacity(ax, capacities, capacity_label)
    top = max([*totals, *(c for c in capacities if c is not None), 1])
    bytes_axis(ax, top)
    ax.set_ylim(0, top * 1.25)  # room for the totals and "OOM" above the tallest bar
    ax.set_xticks(range(len(labels)), _tick_labels(labels, capacities))
    ax.set_xlim(-0.6, len(labels) - 0.4)
    style(ax, grid="y")
    _legend_right(ax, capacity_handles + _category_handles(categories))
    ax.set_title(title or "memory per device, by category", loc="left")
    return ax.figure


def _steps(trace: Trace, device: int) -> tuple[list[float], dict[str, list[int]]]:
    """The device's memory timeline, starting from nothing at time 0 and held to the end."""
    times, series = trace.memory_timeline(device)
    times = [0.0, *times]
    series = {c: [0, *v] for c, v in series.items()}
    end = max(trace.makespan, times[-1])
    if end > times[-1]:
        times.append(end)
        series = {c: [*v, v[-1]] for c, v in series.items()}
    return times, series


def _draw_stacked(ax: Axes, trace: Trace, device: int) -> tuple[list[str], int]:
    """Stacked step areas by category on one device; returns the categories drawn and the
    peak total."""
    times, series = _steps(trace, device)
    drawn, lower = [], [0] * len(times)
    for category in CATEGORIES:
        values = series[category]
        if not any(values):
            continue
        upper = [a + b for a, b in zip(lower, values)]
        ax.fill_between(times, lower, upper, step="post", color=_category_color(category),
                        linewidth=0, label=category, gid=f"memory:{category}")
        lower, drawn = upper, [*drawn, category]
    peak_i = max(range(len(times)), key=lambda i: (lower[i], -i))
    peak = lower[peak_i]
    if peak > 0:
        ax.plot([times[peak_i]], [peak], "o", color="black", markersize=4)
        ax.annotate(f"peak {format_bytes(peak)}", xy=(times[peak_i], peak), xytext=(4, 4),
                    textcoords="offset points", fontsize=FONT_SIZE - 1, gid="peak")
    return drawn, peak


def _finish(ax: Axes, trace: Trace, top: float, capacity_bytes: int | None) -> list[Line2D]:
    """Axes in units, room above the peak, and the capacity line; returns its legend entry."""
    handles = []
    if capacity_bytes is not None:
        dashed = {"color": "black", "linestyle": "--", "linewidth": 1.2}
        ax.axhline(capacity_bytes, gid="capacity", **dashed)
        handles.append(Line2D([], [], label=f"capacity: {capacity_text(capacity_bytes)}",
                              **dashed))
        top = max(top, capacity_bytes)
    time_axis(ax, trace.makespan or max((m.time for m in trace.memory), default=0.0))
    bytes_axis(ax, top)
    ax.set_ylim(0, max(top, 1) * 1.2)
    style(ax)
    return handles


def _legend_right(ax: Axes, handles: list) -> None:
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
              fontsize=FONT_SIZE - 1)


def _category_handles(categories: list[str]) -> list[Patch]:
    """Top of the stack first, as the areas are stacked."""
    return [Patch(color=_category_color(c), label=c) for c in reversed(categories)]


def plot_memory_over_time(trace: Trace, devices: Sequence[int] | None = None, *,
                          ax: Axes | None = None, stacked: bool | None = None,
                          capacity_bytes: int | None = None) -> Figure:
    """Bytes held over the run, from ``trace.memory_timeline(device)``. ``stacked`` (the default
    for one device) stacks the categories of a single device; otherwise one line per device
    shows its total, with its peak in the legend."""
    devices = list(range(trace.n_devices)) if devices is None else list(devices)
    stacked = len(devices) == 1 if stacked is None else stacked
    if stacked and len(devices) != 1:
        raise ValueError("a stacked plot shows one device: pass devices=[d]")
    if ax is None:
        ax = new_figure(9, 4).add_subplot()
    if stacked:
        drawn, top = _draw_stacked(ax, trace, devices[0])
        handles = _category_handles(drawn)
        ax.set_title(f"memory on dev {devices[0]} over time, by category", loc="left")
    else:
        top, handles = 0, []
        for i, device in enumerate(devices):
            times, series = _steps(trace, device)
            totals = [sum(v[k] for v in series.values()) for k in range(len(times))]
            peak = max(totals)
            handles += ax.step(times, totals, where="post", color=series_color(i), linewidth=1.8,
                               label=f"dev {device} (peak {format_bytes(peak)})")
            top = max(top, peak)
        ax.set_title("memory held per device over time", loc="left")
    _legend_right(ax, _finish(ax, trace, top, capacity_bytes) + handles)
    return ax.figure


def plot_memory_compare(traces: Mapping[str, Trace], device: int = 0, *,
                        capacity_bytes: int | None = None, share_x: bool = True) -> Figure:
    """One device's memory over time under several runs, side by side on one y scale: GPipe
    holds every microbatch's activations at once, 1F1B frees them as it goes."""
    if not traces:
        raise ValueError("plot_memory_compare needs at least one trace")
    fig = new_figure(4.5 * len(traces) + 1.5, 4)
    axes = fig.subplots(1, len(traces), sharey=True, sharex=share_x, squeeze=False)[0]
    tops, drawn = [], []
    for ax, (name, trace) in zip(axes, traces.items()):
        categories, peak = _draw_stacked(ax, trace, device)
        drawn += [c for c in categories if c not in drawn]
        tops.append(peak)
        ax.set_title(f"{name}: dev {device}, peak {format_bytes(peak)}", loc="left")
    longest = max(traces.values(), key=lambda t: t.makespan)
    for ax, trace in zip(axes, traces.values()):
        capacity = _finish(ax, longest if share_x else trace, max(tops), capacity_bytes)
    for ax in axes[1:]:
        ax.set_ylabel("")
    _legend_right(axes[-1], capacity + _category_handles([c for c in CATEGORIES if c in drawn]))
    return fig
