"""Ring all-reduce, one step at a time.

Each of the N ranks splits its tensor (S bytes) into N chunks. In every step each rank sends
one chunk (S/N bytes) to its neighbour ``(r + 1) % N`` and receives one from ``(r - 1) % N``,
so every link is busy and no rank sends more than any other.

- reduce-scatter, N - 1 steps: the received chunk is *added* to the rank's own; afterwards
  rank r holds the full sum of chunk ``(r + 1) % N``.
- all-gather, N - 1 steps: the received full sum *replaces* the rank's partial one;
  afterwards every rank holds every full sum.

Each rank sends 2(N - 1) chunks: 2(N - 1)/N x S bytes, almost 2S however large N grows
(Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms", 2009).

``ring_steps`` and ``ring_state`` are plain data; ``plot_ring_step`` draws one step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch, Rectangle
from matplotlib.path import Path as CurvePath

from mpgpu_edu.viz.palette import (
    FONT_SIZE, KIND_COLORS, OKABE_ITO, format_bytes, new_figure, text_color_on,
)

PARTIAL_COLOR = OKABE_ITO["sky_blue"]
COMPLETE_COLOR = OKABE_ITO["bluish_green"]
CELL = 0.24  # side of one chunk's cell, in data units (the ring's radius is at least 1)


@dataclass(frozen=True)
class RingStep:
    """One step of ring all-reduce: rank r sends chunk ``sends[r]`` to ``(r + 1) % N`` and
    receives chunk ``recvs[r]`` from ``(r - 1) % N``, which it adds (reduce-scatter) or copies
    (all-gather)."""

    step: int
    phase: str
    sends: tuple[int, ...]
    recvs: tuple[int, ...]

    @property
    def op(self) -> str:
        return "add" if self.phase == "reduce-scatter" else "copy"


def ring_steps(world_size: int) -> list[RingStep]:
    """The 2(N - 1) steps of ring all-reduce on N = ``world_size`` ranks."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, not {world_size}")
    n, steps = world_size, []
    for k in range(n - 1):
        steps.append(RingStep(k, "reduce-scatter", tuple((r - k) % n for r in range(n)),
                              tuple((r - k - 1) % n for r in range(n))))
    for k in range(n - 1):
        steps.append(RingStep(n - 1 + k, "all-gather", tuple((r + 1 - k) % n for r in range(n)),
                              tuple((r - k) % n for r in range(n))))
    return steps


def ring_state(world_size: int, step: int) -> list[list[set[int]]]:
    """After ``step`` steps (0 .. 2(N - 1)): ``state[r][c]`` is the set of ranks whose
    contributions rank r's copy of chunk c holds. At step 0 it is ``{r}`` everywhere."""
    steps = ring_steps(world_size)
    if not 0 <= step <= len(steps):
        raise ValueError(f"step must be in 0..{len(steps)} for {world_size} ranks, not {step}")
    n = world_size
    state = [[{r} for _ in range(n)] for r in range(n)]
    for s in steps[:step]:
        before = [[set(chunk) for chunk in rank] for rank in state]  # all ranks send at once
        for r in range(n):
            chunk, left = s.recvs[r], (r - 1) % n
            assert s.sends[left] == chunk
            received = before[left][chunk]
            state[r][chunk] = before[r][chunk] | received if s.op == "add" else set(received)
    return state


def _angle(rank: int, n: int) -> float:
    """Rank 0 at the top, the ring running clockwise."""
    return math.pi / 2 - 2 * math.pi * rank / n


def _radius(n: int) -> float:
    """Big enough that neighbouring ranks' boxes keep apart; a lone rank sits in the middle."""
    return max(1.0, (n * CELL + 1.0) / (2 * math.sin(math.pi / n))) if n > 1 else 0.0


def _draw_rank(ax: Axes, x: float, y: float, rank: int, chunks: list[set[int]],
               sent: int | None, received: int | None) -> None:
    n = len(chunks)
    width = n * CELL
    ax.add_patch(FancyBboxPatch((x - width / 2 - 0.06, y - CELL / 2 - 0.16), width + 0.12,
                                CELL + 0.42, boxstyle="round,pad=0.02", facecolor="#F7F7F7",
                                edgecolor="#888888", linewidth=1))
    ax.text(x, y + CELL / 2 + 0.05, f"rank {rank}", ha="center", va="bottom",
            fontsize=FONT_SIZE - 1, fontweight="bold")
    for c, holders in enumerate(chunks):
        left, bottom = x - width / 2 + c * CELL, y - CELL / 2
        complete = len(holders) == n
        colour = COMPLETE_COLOR if complete else PARTIAL_COLOR
        ax.add_patch(Rectangle((left, bottom), CELL, CELL * len(holders) / n, facecolor=colour,
                               edgecolor="none", gid="complete" if complete else "partial"))
        outline = {"edgecolor": "#555555", "linewidth": 0.8, "linestyle": "-"}
        if c == sent:
            outline = {"edgecolor": KIND_COLORS["send"], "linewidth": 2.4, "linestyle": "-"}
        elif c == received:
            outline = {"edgecolor": KIND_COLORS["recv"], "linewidth": 2.0, "linestyle": "--"}
        ax.add_patch(Rectangle((left, bottom), CELL, CELL, facecolor="none", zorder=3,
                               gid=f"cell:{rank}:{c}", **outline))
        if n <= 5:
            ax.text(left + CELL / 2, y, f"{len(holders)}/{n}", ha="center", va="center",
                    fontsize=7.5, color=text_color_on(colour) if complete else "black", zorder=4)
        ax.text(left + CELL / 2, bottom - 0.03, str(c), ha="center", va="top", fontsize=7,
                color="#555555")


def _draw_arrow(ax: Axes, rank: int, n: int, radius: float, chunk: int) -> None:
    """An arc along the ring from ``rank`` to ``rank + 1``, labelled with the chunk it carries."""
    gap = (n * CELL / 2 + 0.2) / radius  # angular half-width kept clear around each box
    a = _angle(rank, n) - gap
    b = _angle(rank + 1, n) + gap
    span = a - b
    handle = 4 / 3 * math.tan(span / 4) * radius  # cubic Bezier approximation of an arc

    def point(t: float) -> tuple[float, float]:
        return radius * math.cos(t), radius * math.sin(t)

    def tangent(t: float) -> tuple[float, float]:  # direction of clockwise travel
        return math.sin(t), -math.cos(t)

    (x0, y0), (x3, y3) = point(a), point(b)
    (ta, sa), (tb, sb) = tangent(a), tangent(b)
    path = CurvePath([(x0, y0), (x0 + handle * ta, y0 + handle * sa),
                      (x3 - handle * tb, y3 - handle * sb), (x3, y3)],
                     [CurvePath.MOVETO, CurvePath.CURVE4, CurvePath.CURVE4, CurvePath.CURVE4])
    ax.add_patch(FancyArrowPatch(path=path, arrowstyle="-|>", mutation_scale=16,
                                 color=KIND_COLORS["send"], linewidth=2, gid="ring-arrow"))
    mid = (a + b) / 2
    lx, ly = (radius + 0.32) * math.cos(mid), (radius + 0.32) * math.sin(mid)
    ax.text(lx, ly, f"chunk {chunk}", ha="center", va="center", fontsize=FONT_SIZE - 1,
            color=KIND_COLORS["send"], fontweight="bold", gid="arrow-label",
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})


def _title(world_size: int, step: int, total: int, nbytes: int | None) -> str:
    chunk = f"S/N = {format_bytes(nbytes / world_size)}" if nbytes else "S/N bytes"
    if total == 0:
        return "1 rank: nothing to send, the tensor already is the sum"
    if step == total:
        sent = f"{2 * (world_size - 1)}/{world_size} x S"
        return (f"done after {total} steps: every rank holds the full sum of every chunk\n"
                f"each rank sent {total} chunks = {sent} bytes")
    phase = ring_steps(world_size)[step].phase
    what = ("and adds it to its own: partial sums grow" if phase == "reduce-scatter"
            else "which replaces its stale copy: full sums spread")
    return (f"step {step + 1} of {total} — {phase}: each rank sends one chunk ({chunk})\n"
            f"to its right neighbour (rank r+1), {what}")


def _legend(ax: Axes, world_size: int, current: RingStep | None) -> None:
    everyone = f" (all {world_size} ranks)" if world_size > 1 else ""
    handles = [Patch(color=PARTIAL_COLOR, label="partial sum (fill = share of ranks added)"),
               Patch(color=COMPLETE_COLOR, label=f"full sum{everyone}")]
    if current:
        handles += [Patch(facecolor="none", edgecolor=KIND_COLORS["send"], linewidth=2,
                          label="chunk sent this step"),
                    Patch(facecolor="none", edgecolor=KIND_COLORS["recv"], linewidth=2,
                          linestyle="--", label=f"chunk received ({current.op})")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2,
              frameon=False, fontsize=FONT_SIZE - 1)


def plot_ring_step(world_size: int, step: int, ax: Axes | None = None, *,
                   nbytes: int | None = None) -> Figure:
    """The ring before step ``step`` (0-based; titled "step step+1 of 2(N-1)"): every rank's
    chunks filled by how many ranks' contributions they hold (green once complete), and an
    arrow from each rank to the next carrying this step's chunk. ``step = 2(N-1)`` shows the
    finished all-reduce. ``nbytes`` (the tensor's size S) puts the chunk's size in the title."""
    total = 2 * (world_size - 1)
    state = ring_state(world_size, step)
    current = ring_steps(world_size)[step] if step < total else None
    if ax is None:
        ax = new_figure(6.5, 7).add_subplot()
    radius = _radius(world_size)
    for r in range(world_size):
        x, y = radius * math.cos(_angle(r, world_size)), radius * math.sin(_angle(r, world_size))
        sent = current.sends[r] if current else None
        received = current.recvs[r] if current else None
        _draw_rank(ax, x, y, r, state[r], sent, received)
        if current:
            _draw_arrow(ax, r, world_size, radius, current.sends[r])
    half_width = max(radius + world_size * CELL / 2 + 0.2, 1.0)
    half_height = max(radius + CELL / 2 + 0.35, 1.0)
    ax.set_xlim(-half_width, half_width)
    ax.set_ylim(-half_height, half_height)
    ax.set_aspect("equal")
    ax.axis("off")
    _legend(ax, world_size, current)
    ax.set_title(_title(world_size, step, total, nbytes), fontsize=FONT_SIZE, loc="left")
    return ax.figure


def ring_frames(world_size: int, *, nbytes: int | None = None) -> list[Figure]:
    """One figure per step, 0 .. 2(N-1) (the last shows the result): an animation's frames."""
    return [plot_ring_step(world_size, s, nbytes=nbytes)
            for s in range(2 * (world_size - 1) + 1)]


def save_ring_frames(world_size: int, directory: str | Path, *,
                     nbytes: int | None = None) -> list[Path]:
    """Save the frames as ``ring_N{N}_step{s:02d}.png`` in ``directory``; returns the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(2 * (world_size - 1) + 1):
        path = directory / f"ring_N{world_size}_step{s:02d}.png"
        plot_ring_step(world_size, s, nbytes=nbytes).savefig(path)
        paths.append(path)
    return paths
