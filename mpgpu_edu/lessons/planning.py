"""Lesson 10, planning a large run: what fits, where each parallelism goes, and the pipeline's
bubble.

- ``master_copy_demo``: mixed precision's fp32 master copy, one weight under small updates;
- ``placement_rows``: where each kind of parallelism goes on a 2-node mesh, by simulated step
  time (``mpgpu_edu.estimate.step``); the notebook's four are stored in
  ``_placements_stored``; their figure is ``mpgpu_edu.viz.placements``'s (``plot_placements``);
- ``interleaved_view`` and ``interleaved_explorer``: 1F1B against interleaved 1F1B, as
  timelines of the simulated schedules; the interleaved one from the learner's
  ``interleaved_orders`` (exercise 10.2) once its check passes (``mp.yours``), else from
  ``reference_orders``, the package's.

Run as ``python -m mpgpu_edu.lessons.planning --placements`` it prints
``_placements_stored.ROWS`` freshly simulated.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from collections.abc import Callable
from typing import Any

import torch
from matplotlib.figure import Figure

from mpgpu_edu.cluster.trace import Trace
from mpgpu_edu.estimate.placements import (PLACEMENTS, SPREAD, TP_16, Placement, placement_key,
                                           simulate_placement)
from mpgpu_edu.explore.live import Explorer, dropdown, percent, slider
from mpgpu_edu.pipeline import (Schedule, Step, from_order, interleaved_1f1b, one_f_one_b,
                                steps_of, validate)
from mpgpu_edu.pipeline.timing import schedule_timeline, timed_bubble_overhead, timeline_trace
from mpgpu_edu.viz.palette import SERIES_COLORS, new_figure, style
from mpgpu_edu.viz.placements import plot_placements
from mpgpu_edu.viz.timeline import plot_timelines_side_by_side

Orders = Callable[[int, int, int], list[list[Step]]]  # lesson 10's interleaved_orders(P, M, V)

__all__ = ["PLACEMENTS", "SPREAD", "TP_16", "Placement", "describe_interleaved",
           "interleaved_explorer", "interleaved_schedule", "interleaved_view", "master_copy_demo", "placement_key",
           "placement_rows", "plot_master_copy", "plot_placements", "reference_orders",
           "schedule_traces",
           "simulate_placement", "stored_rows_source"]


# ---- mixed precision: why a master copy -------------------------------------------------------

def master_copy_demo(steps: int = 200, update: float = 1e-3) -> dict[str, list[float]]:
    """A weight of 1.0 receives ``steps`` updates of ``+update``: kept in bf16 only, in an
    fp32 master copy (rounded to bf16 for use, as mixed precision does), and in fp32."""
    bf16 = torch.tensor(1.0, dtype=torch.bfloat16)
    master = torch.tensor(1.0)
    out: dict[str, list[float]] = {"bf16 only": [], "fp32 master, bf16 copy": [], "fp32": []}
    for _ in range(steps):
        bf16 = bf16 + torch.tensor(update, dtype=torch.bfloat16)
        master = master + update
        out["bf16 only"].append(bf16.item())
        out["fp32 master, bf16 copy"].append(master.to(torch.bfloat16).item())
        out["fp32"].append(master.item())
    return out


def plot_master_copy(curves: dict[str, list[float]]) -> Figure:
    fig = new_figure(8, 3.4)
    ax = style(fig.add_subplot())
    for i, (name, values) in enumerate(curves.items()):
        ax.plot(range(1, len(values) + 1), values, color=SERIES_COLORS[i], label=name,
                linestyle="-" if i < 2 else ":")
    ax.set_xlabel("optimizer steps of +0.001")
    ax.set_ylabel("weight")
    ax.legend()
    ax.set_title("a bf16 weight cannot grow by 0.001: bf16 keeps 8 significant bits",
                 loc="left")
    return fig


# ---- interleaved 1F1B -----------------------------------------------------------------------

def reference_orders(n_stages: int, n_microbatches: int, n_chunks: int) -> list[list[Step]]:
    """The package's interleaved 1F1B orders (``pipeline.interleaved_1f1b``), one list of
    Steps per device: what ``mp.yours("10.2", ...)`` runs until the learner's passes."""
    schedule = interleaved_1f1b(n_stages, n_microbatches, n_chunks)
    return [steps_of(schedule, d) for d in range(n_stages)]


def interleaved_schedule(n_stages: int, n_microbatches: int, n_chunks: int,
                         orders: Orders | None = None) -> Schedule:
    """Interleaved 1F1B as a schedule value, from ``orders`` (lesson 10's contract:
    ``orders(P, M, V)`` gives each device's Steps; the learner's ``interleaved_orders`` once its
    check passes) or the package's."""
    if orders is None:
        return interleaved_1f1b(n_stages, n_microbatches, n_chunks)
    schedule = from_order("interleaved", orders(n_stages, n_microbatches, n_chunks),
                          n_microbatches, n_chunks)
    validate(schedule)
    return schedule


def schedule_traces(n_stages: int, n_microbatches: int, n_chunks: int, forward_s: float = 1e-3,
                    backward_s: float = 2e-3, orders: Orders | None = None,
                    label: str = "interleaved") -> dict[str, Trace]:
    """1F1B and interleaved 1F1B (``orders``'s, else the package's) as timelines, free sends,
    equal stages: a chunk step takes 1/V of a stage's forward or backward."""
    plain = one_f_one_b(n_stages, n_microbatches)
    inter = interleaved_schedule(n_stages, n_microbatches, n_chunks, orders)
    v = n_chunks
    out = {}
    for name, schedule, f, b in (("1F1B", plain, forward_s, backward_s),
                                 (f"{label}, V={v}", inter, forward_s / v,
                                  backward_s / v)):
        overhead = timed_bubble_overhead(schedule, f, b)
        title = f"{name}: idle {round(overhead, 9):.2%} of compute"
        out[title] = _shade_odd_chunks(timeline_trace(schedule_timeline(schedule, f, b),
                                                      n_stages), schedule)
    return out


def _shade_odd_chunks(trace: Trace, schedule: Any) -> Trace:
    """Steps of odd model chunks as the kinds "forward, odd chunk" and "backward, odd chunk"
    (a lighter shade), so that a microbatch's passes through the chunks can be told apart."""
    if schedule.n_chunks == 1:
        return trace
    odd = {(s.stage, s.token) for row in schedule.grid for s in row if s and s.chunk % 2}
    events = [replace(e, kind=f"{e.kind}, odd chunk") if (e.device, e.label) in odd else e
              for e in trace.events]
    return Trace(trace.n_devices, events, trace.memory, trace.source, dict(trace.meta))


def interleaved_view(stages: int = 4, rounds: int = 2, chunks: int = 2,
                     orders: Orders | None = None) -> tuple[Figure, dict]:
    """The explorer's view: 1F1B against interleaved 1F1B (``orders``'s, else the package's)
    for P stages, M = rounds x P microbatches and V chunks; ``info`` has both overheads (idle
    time over compute time), the closed form, and both idle shares of the makespan
    (``idle_1f1b``, ``idle_interleaved``)."""
    m = rounds * stages
    label = getattr(orders, "label", "interleaved")  # mp.yours's Chosen names itself
    traces = schedule_traces(stages, m, chunks, orders=orders, label=label)
    plain = timed_bubble_overhead(one_f_one_b(stages, m), 1.0, 2.0)
    inter = timed_bubble_overhead(interleaved_schedule(stages, m, chunks, orders),
                                  1 / chunks, 2 / chunks)
    info = {"stages": stages, "microbatches": m, "chunks": chunks, "overhead_1f1b": plain,
            "overhead_interleaved": inter, "formula": (stages - 1) / (chunks * m),
            # the same idle time against the makespan (busy + idle), as each row's end says
            "idle_1f1b": plain / (1 + plain), "idle_interleaved": inter / (1 + inter)}
    return plot_timelines_side_by_side(traces, streams=("compute",)), info


def describe_interleaved(info: dict) -> str:
    return (f"<b>P</b> {info['stages']}, <b>M</b> {info['microbatches']}, <b>V</b> "
            f"{info['chunks']}: bubble 1F1B {percent(info['overhead_1f1b'])}, interleaved "
            f"{percent(info['overhead_interleaved'])} of compute (formula (P-1)/(V M) = "
            f"{percent(info['formula'])})")


def interleaved_explorer(orders: Orders | None = None) -> Explorer:
    """Sliders for stages, microbatch rounds and chunks; both timelines redraw, the
    interleaved one from ``orders`` (the learner's, once 10.2 passes) or the package's."""
    controls = {"stages": slider("stages P", 4, 2, 6),
                "rounds": slider("microbatches M / P", 2, 1, 4),
                "chunks": dropdown("chunks V", [1, 2, 3, 4], 2)}

    def view(stages: int, rounds: int, chunks: int) -> tuple[Figure, dict]:
        return interleaved_view(stages, rounds, chunks, orders=orders)
    return Explorer(view, controls, describe_interleaved)


# ---- where each kind of parallelism goes on a 2-node mesh ---------------------------------------

def placement_rows(model: str = "llama-7b", preset: str = "2x8xH100-ib", seq: int = 2048,
                   placements: tuple[Placement, ...] | None = None,
                   stored: bool = True) -> list[dict]:
    """``simulate_placement``'s numbers for every placement (by default ``PLACEMENTS``), with
    its name and reason. With ``stored`` a placement whose numbers ``_placements_stored.ROWS``
    holds (the notebook's four, simulated once; a test holds them to a fresh simulation) is
    not simulated again."""
    from mpgpu_edu.lessons._placements_stored import ROWS

    rows = []
    for p in PLACEMENTS if placements is None else placements:
        key = placement_key(model, preset, seq, p)
        numbers = ROWS[key] if stored and key in ROWS else simulate_placement(model, preset,
                                                                              seq, p)
        rows.append({"name": p.name, "why": p.why, **numbers})
    return rows


def stored_rows_source(model: str = "llama-7b", preset: str = "2x8xH100-ib",
                       seq: int = 2048) -> str:
    """The text of ``_placements_stored.ROWS`` for ``PLACEMENTS``, freshly simulated."""

    lines = ["ROWS = {"]
    for p in PLACEMENTS:
        numbers = simulate_placement(model, preset, seq, p)
        lines.append(f"    {placement_key(model, preset, seq, p)!r}: {{")
        lines += [f"        {k!r}: {v!r}," for k, v in numbers.items()]
        lines.append("    },")
    return "\n".join(lines + ["}"])


if __name__ == "__main__":
    if sys.argv[1:] == ["--placements"]:  # regenerate _placements_stored.py's ROWS
        print(stored_rows_source())
    else:
        sys.exit("usage: python -m mpgpu_edu.lessons.planning --placements")
