"""Ring all-reduce, one step at a time.

Each of the N ranks splits its tensor (S bytes) into N chunks. In every step each rank sends
one chunk (S/N bytes) to its neighbour ``(r + 1) % N`` and receives one from ``(r - 1) % N``,
so every link is busy and no rank sends more than any other.

- reduce-scatter, N - 1 steps: the received chunk is *added* to the rank's own; afterwards
  rank r holds the full sum of one chunk: ``(r + 1) % N`` in the package's order, r in
  exercise 1.4's (``ring_steps(N, shift=0)``).
- all-gather, N - 1 steps: the received full sum *replaces* the rank's partial one;
  afterwards every rank holds every full sum.

Each rank sends 2(N - 1) chunks: 2(N - 1)/N x S bytes, almost 2S however large N grows
(Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms", 2009).

``ring_steps`` and ``ring_state`` are plain data; ``ring_steps_of`` records the steps of any
ring all-reduce function (a learner's); ``plot_ring_step`` draws one step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

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


def ring_steps(world_size: int, shift: int = 1) -> list[RingStep]:
    """The 2(N - 1) steps of ring all-reduce on N = ``world_size`` ranks. With ``shift`` 1
    (the package's ``all_reduce_ring``) the reduce-scatter leaves rank r the full sum of chunk
    ``(r + 1) % N``; with ``shift`` 0 (exercise 1.4's order, and ``reduce_scatter``'s
    result) chunk r."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, not {world_size}")
    n, steps = world_size, []
    for k in range(n - 1):
        steps.append(RingStep(k, "reduce-scatter",
                              tuple((r - k - 1 + shift) % n for r in range(n)),
                              tuple((r - k - 2 + shift) % n for r in range(n))))
    for k in range(n - 1):
        steps.append(RingStep(n - 1 + k, "all-gather",
                              tuple((r - k + shift) % n for r in range(n)),
                              tuple((r - k - 1 + shift) % n for r in range(n))))
    return steps


class _Recorder:
    """A rank's communicator that notes which chunk every message it sends carries."""

    def __init__(self, comm: Any, log: list[int]) -> None:
        self._comm, self._log = comm, log

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)

    def _note(self, tensor: torch.Tensor) -> None:
        values = tensor.detach().reshape(-1).double()
        ok = values.numel() == 2 and values[0].item() != 0
        self._log.append(round(values[1].item() / values[0].item()) - 2 if ok else -1)

    def send(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        self._note(tensor)
        return self._comm.send(tensor, *args, **kwargs)

    def isend(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        self._note(tensor)
        return self._comm.isend(tensor, *args, **kwargs)


def ring_steps_of(all_reduce: Callable[..., Any], world_size: int) -> list[RingStep]:
    """The steps a ring all-reduce function (``fn(comm, tensor)``) really takes, recorded
    from one run on the simulator: chunk c of rank r's tensor starts as ``[2^r, (c + 2) 2^r]``,
    so every message says which chunk it carries. Raises ``ValueError`` when the run is not
    a ring of 2(N - 1) one-chunk steps."""
    from mpgpu_edu.comm import launch

    n = world_size
    logs: list[list[int]] = [[] for _ in range(n)]

    def program(comm: Any) -> None:
        weights = torch.tensor([[1.0, c + 2.0] for c in range(n)], dtype=torch.float64)
        all_reduce(_Recorder(comm, logs[comm.rank]), (weights * 2.0 ** comm.rank).reshape(-1))

    launch(program, n)
    if any(len(log) != 2 * (n - 1) or min(log, default=0) < 0 for log in logs):
        raise ValueError("not a ring of 2(N - 1) one-chunk steps")
    steps = []
    for k in range(2 * (n - 1)):
        sends = tuple(logs[r][k] for r in range(n))
        steps.append(RingStep(k, "reduce-scatter" if k < n - 1 else "all-gather", sends,
                              tuple(sends[(r - 1) % n] for r in range(n))))
    return steps


def ring_state(world_size: int, step: int,
               steps: list[RingStep] | None = None) -> list[list[set[int]]]:
    """After ``step`` steps (0 .. 2(N - 1)) of ``steps`` (default ``ring_steps``):
    ``state[r][c]`` is the set of ranks whose contributions rank r's copy of chunk c holds.
    At step 0 it is ``{r}`` everywhere."""
    steps = ring_steps(world_size) if steps is None else steps
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


def _title(world_size: int, step: int, steps: list[RingStep], nbytes: int | None) -> str:
    total = len(steps)
    chunk = f"S/N = {format_bytes(nbytes / world_size)}" if nbytes else "S/N bytes"
    if total == 0:
        return "1 rank: nothing to send, the tensor already is the sum"
    if step == total:
        sent = f"{2 * (world_size - 1)}/{world_size} x S"
        return (f"done after {total} steps: every rank holds the full sum of every chunk\n"
                f"each rank sent {total} chunks = {sent} bytes")
    phase = steps[step].phase
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
                   nbytes: int | None = None, steps: list[RingStep] | None = None,
                   label: str | None = None) -> Figure:
    """The ring before step ``step`` (0-based; titled "step step+1 of 2(N-1)"): every rank's
    chunks filled by how many ranks' contributions they hold (green once complete), and an
    arrow from each rank to the next carrying this step's chunk. ``step = 2(N-1)`` shows the
    finished all-reduce. ``nbytes`` (the tensor's size S) puts the chunk's size in the title;
    ``steps`` (default ``ring_steps``) are the steps drawn, e.g. ``ring_steps_of`` a learner's
    ring; ``label`` (whose ring it is) heads the title."""
    steps = ring_steps(world_size) if steps is None else steps
    total = len(steps)
    state = ring_state(world_size, step, steps)
    current = steps[step] if step < total else None
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
    title = _title(world_size, step, steps, nbytes)
    ax.set_title(f"{label}\n{title}" if label else title, fontsize=FONT_SIZE, loc="left")
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
