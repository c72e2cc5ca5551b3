"""Pipeline steps and schedules as values: a ``Step`` (one microbatch's forward or backward on
one stage, of one model chunk), a ``Schedule`` (a grid of steps, one row per device), the
dependencies between steps and where each step's input comes from and its output goes, the
earliest start of every step of given per-device orders, and a schedule's grid as text
(``render``). The builders are in ``schedules``; what is measured on a schedule in ``measures``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal

Op = Literal["F", "B"]


class ScheduleError(ValueError):
    """A schedule breaks a rule. The message shows the grid with the bad steps marked."""


@dataclass(frozen=True)
class Step:
    """One unit of work: the forward ("F") or backward ("B") of one microbatch on one stage.

    ``stage`` is the device that runs it. ``chunk`` is which of that device's model chunks it
    runs: always 0 except in an interleaved schedule (virtual stage ``chunk * P + stage``)."""

    stage: int
    microbatch: int
    op: Op
    chunk: int = 0

    @property
    def token(self) -> str:
        """The step as a grid cell, e.g. ``"F3"``; ``"F3.1"`` for chunk 1."""
        return f"{self.op}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")

    def __str__(self) -> str:
        chunk = f", chunk {self.chunk}" if self.chunk else ""
        return f"{self.op}(stage {self.stage}, mb {self.microbatch}{chunk})"


Grid = tuple[tuple[Step | None, ...], ...]


@dataclass(frozen=True)
class Schedule:
    """``grid[device][tick]`` is the step that device runs at that tick, or None (a bubble).

    Rows may be given as lists and of different lengths: they are stored as tuples, padded
    with bubbles to the same length. ``n_chunks`` is the model chunks per device (V, 1 unless
    the schedule is interleaved).
    """

    name: str
    n_stages: int
    n_microbatches: int
    grid: Grid
    n_chunks: int = 1

    def __post_init__(self) -> None:
        width = max((len(row) for row in self.grid), default=0)
        rows = tuple(tuple(row) + (None,) * (width - len(row)) for row in self.grid)
        object.__setattr__(self, "grid", rows)

    def __str__(self) -> str:
        return render(self)


# ---- dependencies and placement ------------------------------------------------------------

def _at(virtual: int, n_stages: int, microbatch: int, op: Op) -> Step:
    """The step of virtual stage ``virtual`` (device ``virtual % P``, chunk ``virtual // P``)."""
    return Step(virtual % n_stages, microbatch, op, virtual // n_stages)


def dependencies(step: Step, n_stages: int, n_chunks: int = 1) -> tuple[Step, ...]:
    """The steps that must finish before ``step`` can start (``n_chunks`` model chunks per
    device: virtual stage ``chunk * n_stages + stage`` follows the one before it)."""
    v, m = step.chunk * n_stages + step.stage, step.microbatch
    if step.op == "F":
        return (_at(v - 1, n_stages, m, "F"),) if v > 0 else ()
    if v == n_stages * n_chunks - 1:
        return (_at(v, n_stages, m, "F"),)
    return (_at(v, n_stages, m, "F"), _at(v + 1, n_stages, m, "B"))


def producer_of(step: Step, n_stages: int, n_chunks: int = 1) -> Step | None:
    """The step whose output this step consumes (activations for F, gradients for B), or None
    when the input is local: the first forward reads the batch, the last backward the loss."""
    v = step.chunk * n_stages + step.stage + (-1 if step.op == "F" else 1)
    return _at(v, n_stages, step.microbatch, step.op) if 0 <= v < n_stages * n_chunks else None


def consumer_of(step: Step, n_stages: int, n_chunks: int = 1) -> Step | None:
    """The step that consumes this step's output, or None (the loss, or the input's grad)."""
    v = step.chunk * n_stages + step.stage + (1 if step.op == "F" else -1)
    return _at(v, n_stages, step.microbatch, step.op) if 0 <= v < n_stages * n_chunks else None


def recv_from(step: Step, n_stages: int, n_chunks: int = 1) -> int | None:
    """The device whose output this step consumes: activations for F, gradients for B.

    None when the input is local: stage 0's forward reads the batch, the last stage's
    backward starts from the loss.
    """
    source = producer_of(step, n_stages, n_chunks)
    return None if source is None else source.stage


def send_to(step: Step, n_stages: int, n_chunks: int = 1) -> int | None:
    """The device that consumes this step's output, or None (the loss, or the input's grad)."""
    target = consumer_of(step, n_stages, n_chunks)
    return None if target is None else target.stage


def earliest_starts(orders: Sequence[Sequence[Step]], duration: Callable[[Step], float],
                    send_s: float = 0, n_chunks: int = 1) -> dict[Step, float]:
    """Start time of every step when device d runs ``orders[d]`` in turn, each step as soon as
    the device is free and its dependencies have finished (plus ``send_s`` when the dependency
    ran on another device). Raises ScheduleError if the orders wait on each other forever."""
    n_devices = len(orders)
    start: dict[Step, float] = {}
    end: dict[Step, float] = {}
    done = [0] * n_devices
    free: list[float] = [0] * n_devices
    progress = True
    while progress:
        progress = False
        for device, order in enumerate(orders):
            while done[device] < len(order):
                step = order[done[device]]
                if step in start:
                    raise ScheduleError(f"{step} appears twice in the orders")
                needs = dependencies(step, n_devices, n_chunks)
                if any(need not in end for need in needs):
                    break
                ready = [end[need] + (send_s if need.stage != device else 0) for need in needs]
                start[step] = max([free[device], *ready])
                end[step] = free[device] = start[step] + duration(step)
                done[device] += 1
                progress = True
    _check_finished(orders, done, end, n_chunks)
    return start


def _check_finished(orders: Sequence[Sequence[Step]], done: list[int], end: dict,
                    n_chunks: int) -> None:
    stuck = [(device, order[done[device]]) for device, order in enumerate(orders)
             if done[device] < len(order)]
    if stuck:
        def name(step: Step) -> str:  # chunk 0 named too when there are several
            return (f"{step.op}(stage {step.stage}, mb {step.microbatch}, chunk {step.chunk})"
                    if n_chunks > 1 else str(step))

        waits = "; ".join(
            f"dev {device} cannot run {name(step)}: it waits for "
            + ", ".join(name(need) for need in dependencies(step, len(orders), n_chunks)
                        if need not in end)
            for device, step in stuck)
        raise ScheduleError(f"the step order can never finish: {waits}")


# ---- the grid as text ----------------------------------------------------------------------------

def render(schedule: Schedule, marked: Collection[tuple[int, int]] = ()) -> str:
    """The grid as text, a tick header then one ``dev p | F0 F1 .  B0 |`` line per device.
    Cells listed in ``marked`` as (device, tick) show as ``[F3]!``. An interleaved grid names
    every step's chunk (``F3.0``, ``F3.1``)."""
    n_ticks = len(schedule.grid[0]) if schedule.grid else 0
    header = [str(tick) for tick in range(n_ticks)]
    chunked = schedule.n_chunks > 1
    rows = [[_cell(step, (device, tick) in marked, chunked) for tick, step in enumerate(row)]
            for device, row in enumerate(schedule.grid)]
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    labels = ["tick", *(f"dev {device}" for device in range(len(rows)))]
    label_width = max(len(label) for label in labels)
    return "\n".join(
        f"{label.ljust(label_width)} | "
        + " ".join(cell.ljust(width) for cell, width in zip(cells, widths)) + " |"
        for label, cells in zip(labels, [header, *rows]))


def _cell(step: Step | None, marked: bool, chunked: bool = False) -> str:
    text = "." if step is None else step.token
    if chunked and step is not None and not step.chunk:
        text += ".0"
    return f"[{text}]!" if marked else text
