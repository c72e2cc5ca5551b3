"""Lesson 07's placements on a 2-node mesh: simulated step times as bars with the reason
beside each (``plot_placements``), of the rows ``mpgpu_edu.lessons.planning.placement_rows``
makes.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from mpgpu_edu.viz.palette import (FONT_SIZE, OKABE_ITO, WARNING_COLOR, format_bytes,
                                   format_seconds, new_figure, style)


def plot_placements(rows: list[dict], title: str = "") -> Figure:
    """One bar per placement: simulated step time, the reason written beside it, the
    fastest in green; a placement that does not fit in memory is hatched."""
    fig = new_figure(12, 0.95 * len(rows) + 1.4)
    ax = fig.add_subplot()
    best = min(range(len(rows)), key=lambda i: rows[i]["step_s"])
    longest = max(r["step_s"] for r in rows)
    for i, r in enumerate(rows):
        color = OKABE_ITO["bluish_green"] if i == best else OKABE_ITO["sky_blue"]
        ax.barh(i, r["step_s"], color=color, hatch=None if r["fits"] else "///",
                edgecolor=WARNING_COLOR if not r["fits"] else "none")
        ax.text(longest * 1.1, i - 0.17,
                f"{format_seconds(r['step_s'])}, MFU {r['mfu']:.0%}; "
                f"{format_bytes(r['across_bytes'])} across the network (busiest GPU)"
                + ("" if r["fits"] else ", does NOT fit in memory"),
                va="center", fontsize=FONT_SIZE - 1, fontweight="bold" if i == best else None)
        ax.text(longest * 1.1, i + 0.2, r["why"], va="center",
                fontsize=FONT_SIZE - 2, color="#333333")
    ax.set_yticks(range(len(rows)), [r["name"] for r in rows], fontsize=FONT_SIZE - 1)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, longest * 1.08)  # the reasons run on to the right, past the axis
    ax.set_xlabel("simulated step time (s), same 16 sequences per step")
    style(ax, grid="x")
    ax.set_title(title or "Where each parallelism goes on 2 nodes x 8 GPUs: tensor "
                 "parallelism inside a node, pipeline or data parallelism across",
                 loc="left", fontsize=FONT_SIZE + 1)
    return fig
