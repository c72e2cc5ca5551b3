"""Lesson 06's debugging figures: who waits for whom in a deadlock (``plot_wait_for``), and
a ring-shaped array as a halo exchange smooths it (``plot_smoothing``).
"""

from __future__ import annotations

import math

import torch
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch

from mpgpu_edu.comm.errors import DeadlockError, LaunchTimeoutError
from mpgpu_edu.viz.palette import (FONT_SIZE, OKABE_ITO, WARNING_COLOR, new_figure, series_color,
                                   style)


def plot_wait_for(error: DeadlockError | LaunchTimeoutError) -> Figure:
    """The ranks of a ``DeadlockError`` (or a launch's timeout) around an ellipse, an arrow
    from each blocked rank to the rank it waits for, labelled with what it waits in (the
    error's ``pending``). A cycle of arrows is a deadlock: nobody can move first."""
    words = {"send": "send to", "recv": "recv from"}
    waits = [(p.rank, words[p.op], p.peer) for p in error.pending if p.op in words]
    finished = set(error.finished)
    ranks = sorted({r for a, _, b in waits for r in (a, b)} | finished)
    ax = new_figure(6.5, 3.8).add_subplot()
    where = {}
    for i, rank in enumerate(ranks):  # rank 0 on the left, then clockwise
        angle = math.pi - 2 * math.pi * i / max(len(ranks), 1)
        where[rank] = (1.7 * math.cos(angle), 1.0 * math.sin(angle))
    for rank, (x, y) in where.items():
        name = f"rank {rank}" + ("\n(finished)" if rank in finished else "")
        ax.text(x, y, name, ha="center", va="center", fontsize=FONT_SIZE + 1,
                bbox={"boxstyle": "round", "facecolor": "#EAF4FB",
                      "edgecolor": OKABE_ITO["blue"]})
    for a, op, b in waits:
        (x0, y0), (x1, y1) = where[a], where[b]
        bend = _outward_bend(x0, y0, x1, y1)
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=16,
                                     color=WARNING_COLOR, linewidth=1.6, shrinkA=26, shrinkB=26,
                                     connectionstyle=f"arc3,rad={bend}"))
        dx, dy = x1 - x0, y1 - y0  # the arc bulges towards (dy, -dx); its label goes further
        length = math.hypot(dx, dy) or 1.0
        sideways = 0.3 * abs(dy) / length  # a label beside a steep arrow needs more room
        out = math.copysign(abs(bend) * 0.5 + (0.28 + sideways) / length, bend)
        ax.text((x0 + x1) / 2 + out * dy, (y0 + y1) / 2 - out * dx,
                f"rank {a} is blocked in\n{op} rank {b}", ha="center", va="center",
                fontsize=FONT_SIZE - 1, color=WARNING_COLOR)
    ax.set_xlim(-2.6, 2.6)
    ax.set_ylim(-1.5, 1.5)
    ax.axis("off")
    stuck = any(b in finished for _, _, b in waits)
    ax.set_title("who waits for whom: " + ("a rank waits for one that has finished" if stuck
                                           else "a cycle, so nobody can move first"), loc="left")
    return ax.figure


def _outward_bend(x0: float, y0: float, x1: float, y1: float, size: float = 0.3) -> float:
    """The arc's bend (matplotlib's ``arc3`` rad) that bulges away from the ellipse's centre,
    so that arrows and their labels stay outside the ring of ranks; -size on a tie."""
    dx, dy = x1 - x0, y1 - y0
    mid_x, mid_y = (x0 + x1) / 2, (y0 + y1) / 2
    outward = math.hypot(mid_x + dy, mid_y - dx) > math.hypot(mid_x - dy, mid_y + dx) + 1e-9
    return size if outward else -size


def plot_smoothing(arrays: dict[int, torch.Tensor], block: int, title: str = "") -> Figure:
    """The ring array after each number of steps (one line each), with dotted lines where
    one rank's block ends and the next one's begins."""
    ax = new_figure(9, 3.2).add_subplot()
    for i, (steps, values) in enumerate(arrays.items()):
        ax.plot(range(len(values)), values.tolist(), color=series_color(i), marker=".",
                label=f"after {steps} step{'s' if steps != 1 else ''}")
    size = len(next(iter(arrays.values())))
    for edge in range(block, size, block):
        ax.axvline(edge - 0.5, color="black", linestyle=":", linewidth=0.8)
    ax.set_xlabel(f"element of the ring (dotted: where one rank's block of {block} ends)")
    ax.set_ylabel("value")
    ax.legend(fontsize=FONT_SIZE - 1, frameon=False)
    ax.set_title(title, loc="left")
    style(ax)
    return ax.figure
