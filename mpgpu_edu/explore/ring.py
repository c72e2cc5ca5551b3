"""The ring stepper: ring all-reduce one step at a time, with a slider (and a play button).

    fig, info = ring_view(world_size=4, step=2)
    info["phase"], info["sends"]      # "reduce-scatter", (2, 3, 0, 1)

Given ``all_reduce`` (a ring all-reduce function, e.g. what ``mp.yours("1.3", ...)`` chose),
the stepper draws the steps that function really takes (``ring_steps_of``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
from matplotlib.figure import Figure

from mpgpu_edu.explore.live import Explorer, slider
from mpgpu_edu.viz.ring import plot_ring_step, ring_state, ring_steps, ring_steps_of


def ring_view(world_size: int = 4, step: int = 0, nbytes: int | None = None,
              all_reduce: Callable[..., Any] | None = None,
              label: str | None = None) -> tuple[Figure, dict]:
    """The ring of ``world_size`` ranks before step ``step`` (0 .. 2(N-1); the last shows the
    result), as ``all_reduce`` takes it (default: the package's order). Returns
    ``(figure, info)``; ``info`` holds ``total_steps``, ``phase`` ("reduce-scatter",
    "all-gather" or "done"), ``sends`` (the chunk each rank sends), ``complete`` (how
    many full sums each rank holds) and ``label`` (whose ring it is, or None)."""
    steps = ring_steps(world_size) if all_reduce is None else ring_steps_of(all_reduce,
                                                                            world_size)
    fig = plot_ring_step(world_size, step, nbytes=nbytes, steps=steps, label=label)
    current = steps[step] if step < len(steps) else None
    state = ring_state(world_size, step, steps)
    info = {"world_size": world_size, "step": step, "total_steps": len(steps),
            "phase": current.phase if current else "done",
            "sends": current.sends if current else (),
            "complete": [sum(len(chunk) == world_size for chunk in rank) for rank in state],
            "label": label}
    return fig, info


def describe(info: dict) -> str:
    """The caption under the figure: whose ring, which step, how far the sums are."""
    whose = f"{info['label']}: " if info.get("label") else ""
    if info["phase"] == "done":
        return (f"{whose}<b>done</b> after {info['total_steps']} steps: every rank holds "
                "every sum")
    return (f"{whose}<b>step {info['step'] + 1} of {info['total_steps']}</b> "
            f"({info['phase']}) &nbsp; full sums held per rank: {info['complete']}")


def ring_stepper(world_size: int = 4, nbytes: int | None = None,
                 all_reduce: Callable[..., Any] | None = None) -> Explorer:
    """A slider over the 2(N-1) steps of ring all-reduce on ``world_size`` ranks (and one for
    the number of ranks); the play button walks through the steps. ``all_reduce``: the ring
    to draw (a ``Chosen`` from ``mp.yours`` puts its label in the title)."""
    total = 2 * (world_size - 1)
    controls = {"world_size": slider("ranks", world_size, 1, 8),
                "step": slider("step", 0, 0, total)}
    play = widgets.Play(value=0, min=0, max=total, interval=1200, description="play")
    widgets.jslink((play, "value"), (controls["step"], "value"))
    widgets.jslink((play, "max"), (controls["step"], "max"))

    def fit_steps(change: dict) -> None:  # before the redraw: the step must exist
        controls["step"].max = 2 * (change["new"] - 1)

    controls["world_size"].observe(fit_steps, names="value")
    fixed = {"nbytes": nbytes, "all_reduce": all_reduce,
             "label": getattr(all_reduce, "label", None)}
    return Explorer(ring_view, controls, describe, fixed=fixed, extra=[play])
