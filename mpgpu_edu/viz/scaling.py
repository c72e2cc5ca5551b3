"""Scaling curves: does adding devices pay?

Speedup on N devices is ``t1 / tN`` (one device's step time over N devices' step time); the
ideal is N. Efficiency is ``speedup / N``; the ideal is 100%. A light model on a slow link can
get *slower* with more devices, because the time to average gradients outgrows the compute
each device saves; those points are circled in red.
"""

from __future__ import annotations

from collections.abc import Mapping

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator, PercentFormatter

from mpgpu_edu.viz.palette import (
    ALGORITHM_COLORS, FONT_SIZE, SERIES_COLORS, SERIES_MARKERS, WARNING_COLOR, format_bytes,
    format_seconds, new_figure, series_color, style,
)

SLOWER = "slower than 1 device"


def speedups(step_times: Mapping[int, float]) -> dict[int, float]:
    """``{N: t1 / tN}`` from ``{N: step time in seconds}``; needs the 1-device time."""
    if 1 not in step_times:
        raise ValueError("speedup needs the 1-device step time as its baseline: add key 1")
    return {n: step_times[1] / t for n, t in sorted(step_times.items())}


def _mark_slower(ax: Axes, points: list[tuple[int, float]]) -> None:
    """Circle every point slower than one device; write the warning once, at the worst one."""
    if not points:
        return
    ax.scatter([n for n, _ in points], [v for _, v in points], s=160, facecolors="none",
               edgecolors=WARNING_COLOR, linewidths=1.8, zorder=4, gid="slower")
    n, v = min(points, key=lambda p: p[1])
    ax.annotate(SLOWER, xy=(n, v), xytext=(-14, 16), textcoords="offset points", ha="right",
                va="bottom", color=WARNING_COLOR, fontsize=FONT_SIZE - 1, fontweight="bold",
                arrowprops={"arrowstyle": "->", "color": WARNING_COLOR}, gid="slower-label")


# Curve colours: never a red (red circles mean "slower than 1 device").
CURVE_COLORS = tuple(c for c in SERIES_COLORS if c not in (SERIES_COLORS[1], SERIES_COLORS[4]))
# Dashed and dotted are taken by the "ideal" and "1 device" lines.
LINE_STYLES: tuple = ("-", "-.", (0, (6, 1, 1, 1, 1, 1)), (0, (8, 2)))


def series_styles(labels: list[str]) -> dict[str, dict]:
    """Colour, line style and marker of each curve, one meaning each. Labels of the form
    "<what>, <where>" ("light model, 8xH100-nvswitch") get one colour per *what* and one line
    style and marker per *where*; other labels get a colour each."""
    parts = [label.split(", ", 1) for label in labels]
    if len(labels) > 1 and all(len(p) == 2 for p in parts):
        whats = list(dict.fromkeys(p[0] for p in parts))
        wheres = list(dict.fromkeys(p[1] for p in parts))
        if len(whats) < len(labels) or len(wheres) < len(labels):
            return {label: {"color": CURVE_COLORS[whats.index(w) % len(CURVE_COLORS)],
                            "linestyle": LINE_STYLES[wheres.index(h) % len(LINE_STYLES)],
                            "marker": SERIES_MARKERS[wheres.index(h) % len(SERIES_MARKERS)]}
                    for label, (w, h) in zip(labels, parts)}
    return {label: {"color": CURVE_COLORS[i % len(CURVE_COLORS)], "linestyle": "-",
                    "marker": SERIES_MARKERS[i % len(SERIES_MARKERS)]}
            for i, label in enumerate(labels)}


def plot_scaling(results: Mapping[str, Mapping[int, float]], *, metric: str = "speedup",
                 title: str | None = None, ax: Axes | None = None) -> Figure:
    """Speedup (``metric="speedup"``) or efficiency (``"efficiency"``) against the number of
    devices, one curve per series, with the ideal as a dashed line.

    ``results`` maps a series label ("light model, PCIe") to ``{world_size: step_time_s}``;
    every series needs its 1-device time. Points slower than one device are circled in red
    and labelled "slower than 1 device"."""
    if metric not in ("speedup", "efficiency"):
        raise ValueError(f"metric must be 'speedup' or 'efficiency', not {metric!r}")
    if ax is None:
        ax = new_figure(8, 4.5).add_subplot()
    sizes = sorted({n for series in results.values() for n in series})
    looks = series_styles(list(results))
    for label, step_times in results.items():
        speedup = speedups(step_times)
        ns = list(speedup)
        ys = [speedup[n] if metric == "speedup" else speedup[n] / n for n in ns]
        ax.plot(ns, ys, linewidth=1.8, label=label, **looks[label])
        _mark_slower(ax, [(n, y) for n, y in zip(ns, ys) if speedup[n] < 1])
    _dress(ax, metric, sizes)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
              fontsize=FONT_SIZE - 1)
    ax.set_title(title or f"{metric} as devices are added", loc="left")
    return ax.figure


def _dress(ax: Axes, metric: str, sizes: list[int]) -> None:
    """The ideal line, the "1 device" line and the axes' labels and units."""
    ideal = sizes if metric == "speedup" else [1.0] * len(sizes)
    ax.plot(sizes, ideal, linestyle="--", color="black", linewidth=1, label="ideal", zorder=1)
    if metric == "speedup":
        # Below this line, more devices made the step slower than one device alone.
        ax.axhline(1.0, color="#777777", linestyle=":", linewidth=1, zorder=1)
        ax.set_ylabel("speedup over 1 device (×)")
        ax.set_ylim(bottom=0)
    else:
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_ylabel("efficiency (speedup / devices)")
        ax.set_ylim(0, 1.1)
    ax.set_xticks(sizes)
    ax.set_xlabel("devices (world size)")
    style(ax)


def _algorithm_color(label: str, i: int) -> str:
    """The palette's colour for "ring", "tree" or "naive" (also inside a longer label such as
    "ring all-reduce"); a series colour otherwise."""
    for name, colour in ALGORITHM_COLORS.items():
        if name in label.lower():
            return colour
    return series_color(i)


def _byte_ticks(lo: int, hi: int, most: int = 11) -> list[int]:
    """Powers of two from ``lo`` to ``hi``, thinned to at most ``most`` ticks; powers of 1024
    (1 KiB, 1 MiB, 1 GiB) are kept in preference."""
    first, last = max(lo, 1).bit_length() - 1, max(hi, 1).bit_length()
    for stride in (1, 2, 5, 10, 20, 30):
        exps = [e for e in range(first, last + 1) if e % stride == 0]
        if len(exps) <= most:
            return [2**e for e in exps]
    return [2**e for e in range(first, last + 1, 10)]


def plot_allreduce_vs_size(results: Mapping[str, Mapping[int, float]], *,
                           title: str | None = None, ax: Axes | None = None) -> Figure:
    """All-reduce time against message size, log-log, one line per algorithm.

    ``results`` maps an algorithm ("naive", "tree", "ring") to ``{nbytes: seconds}``. Small
    messages are latency-bound (flat: every step pays alpha); large ones bandwidth-bound
    (slope 1), where ring's 2(N-1)/N bytes per rank wins."""
    if ax is None:
        ax = new_figure(8, 4.5).add_subplot()
    all_sizes = [n for series in results.values() for n in series]
    for i, (label, times) in enumerate(results.items()):
        sizes = sorted(times)
        ax.plot(sizes, [times[n] for n in sizes], marker=SERIES_MARKERS[i % len(SERIES_MARKERS)],
                color=_algorithm_color(label, i), linewidth=1.8, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    if all_sizes:
        ax.xaxis.set_major_locator(FixedLocator(_byte_ticks(min(all_sizes), max(all_sizes))))
        ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: format_bytes(x)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: format_seconds(y)))
    ax.set_xlabel("size of the tensor each rank holds (log scale)")
    ax.set_ylabel("all-reduce time (log scale)")
    style(ax)
    ax.grid(True, which="major", color="#D0D0D0", linewidth=0.6)
    ax.legend(loc="upper left", frameon=False, fontsize=FONT_SIZE - 1)
    ax.set_title(title or "all-reduce time vs message size", loc="left")
    return ax.figure
