"""Pipeline schedules as values: which device runs which microbatch's forward or backward, when.

A schedule is a grid with one row per device and one column per tick. Each cell is a ``Step``
(the forward "F" or backward "B" of one microbatch on that device's stage) or ``None``, a
bubble: the device idles. Device p runs stage p. A builder says only the *order* of steps on
each device; ``from_order`` places that order on the earliest ticks its dependencies allow, in
a unit-time model where a forward and a backward each take one tick:

    F(s, m) needs F(s-1, m)              activations flow forward, one stage per tick
    B(s, m) needs F(s, m) and B(s+1, m)  gradients flow backward; the last stage needs only F

Everything else is a function of the value: ``validate``, ``render``, ``bubble_fraction``,
``peak_activations``. A learner's hand-drawn grid (``from_grid``) is checked the same way as
ours, and an executor runs any schedule by walking ``steps_of(schedule, device)``, receiving
from ``recv_from(step, P)`` and sending to ``send_to(step, P)``, with no schedule logic of its own.

    >>> print(gpipe(2, 2))
    tick  | 0  1  2  3  4  5  |
    dev 0 | F0 F1 .  .  B0 B1 |
    dev 1 | .  F0 F1 B0 B1 .  |

Cost (P stages, M microbatches): GPipe and 1F1B both take 2(M+P-1) ticks, so a device idles
(P-1)/(M+P-1) of the time; GPipe's stage 0 holds M microbatches' activations, 1F1B's stage p
at most P-p. References: Huang et al., "GPipe" (2019); Narayanan et al., "PipeDream" (2019)
and "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (2021).

Interleaved 1F1B (virtual stages) cuts the model into P x V chunks and gives device p the
chunks p, p+P, p+2P, ...: a ``Step`` then names its ``chunk`` (0..V-1), and virtual stage
``chunk * P + stage`` feeds the next one, wrapping from the last device back to the first.
Each chunk step does 1/V of a stage's work, so the fill and drain shrink V-fold: for M a
multiple of P and free sends the bubble costs (P-1)/(V M) of the ideal compute time
(``bubble_overhead``), against (P-1)/M for 1F1B, for V times as many messages.
"""

from __future__ import annotations

import re
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
        waits = "; ".join(
            f"dev {device} cannot run {step}: it waits for "
            + ", ".join(str(need) for need in dependencies(step, len(orders), n_chunks)
                       if need not in end)
            for device, step in stuck)
        raise ScheduleError(f"the step order can never finish: {waits}")


def from_order(name: str, orders: Sequence[Sequence[Step]],
               n_microbatches: int | None = None, n_chunks: int = 1) -> Schedule:
    """A schedule from each device's step order, every step on the earliest tick it can run."""
    starts = earliest_starts(orders, duration=lambda step: 1, n_chunks=n_chunks)
    width = max((int(tick) + 1 for tick in starts.values()), default=0)
    grid: list[list[Step | None]] = [[None] * width for _ in orders]
    for device, order in enumerate(orders):
        for step in order:
            grid[device][int(starts[step])] = step
    if n_microbatches is None:
        n_microbatches = max((step.microbatch for step in starts), default=-1) + 1
    return Schedule(name, len(orders), n_microbatches, tuple(map(tuple, grid)), n_chunks)


# ---- the builders ----------------------------------------------------------------------------

def naive(n_stages: int) -> Schedule:
    """The whole batch as one microbatch: forward through the stages in turn, then backward in
    reverse. This is plain model parallelism ("layers 1-10 on GPU 1, 11-20 on GPU 2, ..."):
    one device works at a time, so each idles (P-1)/P of the time."""
    _check_sizes(n_stages, 1)
    orders = [[Step(p, 0, "F"), Step(p, 0, "B")] for p in range(n_stages)]
    return from_order("naive", orders, n_microbatches=1)


def gpipe(n_stages: int, n_microbatches: int) -> Schedule:
    """GPipe: every device runs all its forwards, then all its backwards.

    Backwards run in microbatch order 0, 1, ..., M-1, the order 1F1B uses too, so the two
    schedules differ only in *when* backwards start. Stage 0 holds all M microbatches'
    activations when it turns from forward to backward.
    """
    _check_sizes(n_stages, n_microbatches)
    mbs = range(n_microbatches)
    orders = [[*(Step(p, m, "F") for m in mbs), *(Step(p, m, "B") for m in mbs)]
              for p in range(n_stages)]
    return from_order("gpipe", orders, n_microbatches)


def one_f_one_b(n_stages: int, n_microbatches: int) -> Schedule:
    """1F1B (PipeDream-Flush): stage p runs P-1-p warm-up forwards, then alternates one forward
    and one backward, then runs the remaining backwards. Same makespan as GPipe, but a backward
    frees its microbatch's activations early: stage p holds at most min(P-p, M) at once."""
    _check_sizes(n_stages, n_microbatches)
    orders = [_one_f_one_b_order(p, n_stages, n_microbatches) for p in range(n_stages)]
    return from_order("1f1b", orders, n_microbatches)


def _one_f_one_b_order(stage: int, n_stages: int, n_microbatches: int) -> list[Step]:
    warmup = min(n_stages - 1 - stage, n_microbatches)
    forwards = [Step(stage, m, "F") for m in range(n_microbatches)]
    backwards = [Step(stage, m, "B") for m in range(n_microbatches)]
    steady = [step for pair in zip(forwards[warmup:], backwards) for step in pair]
    return forwards[:warmup] + steady + backwards[n_microbatches - warmup:]


def interleaved_1f1b(n_stages: int, n_microbatches: int, n_chunks: int) -> Schedule:
    """Interleaved 1F1B (Narayanan et al. 2021, section 2.2.2): each device holds ``n_chunks``
    model chunks (virtual stages) and runs 1F1B over (microbatch, chunk) pairs.

    Device p's forwards go in rounds of P microbatches: microbatches 0..P-1 through chunk 0,
    then the same P through chunk 1, ..., then the next P microbatches; backwards go in the
    same rounds with the chunks reversed. Device p first runs 2(P-1-p) + (V-1)P forwards (the
    warm-up), then alternates one forward and one backward, then drains. Needs M a multiple
    of P, so that every round is full. Bubble overhead (P-1)/(V M) of the compute time.
    """
    _check_sizes(n_stages, n_microbatches)
    if n_chunks < 1:
        raise ValueError(f"an interleaved schedule needs at least 1 chunk per device, got "
                         f"n_chunks={n_chunks}")
    if n_microbatches % n_stages:
        raise ValueError(f"interleaved 1F1B runs microbatches in rounds of P={n_stages}: "
                         f"n_microbatches={n_microbatches} is not a multiple of {n_stages}; "
                         f"use {n_stages * max(1, round(n_microbatches / n_stages))}")
    orders = [_interleaved_order(p, n_stages, n_microbatches, n_chunks)
              for p in range(n_stages)]
    return from_order("interleaved", orders, n_microbatches, n_chunks)


def _interleaved_order(stage: int, n_stages: int, n_microbatches: int,
                       n_chunks: int) -> list[Step]:
    total = n_microbatches * n_chunks

    def nth(k: int, op: Op) -> Step:  # the k-th forward (or backward) this device runs
        round_, within = divmod(k, n_stages * n_chunks)
        chunk = within // n_stages
        if op == "B":
            chunk = n_chunks - 1 - chunk
        return Step(stage, round_ * n_stages + within % n_stages, op, chunk)

    warmup = min(2 * (n_stages - 1 - stage) + (n_chunks - 1) * n_stages, total)
    if n_chunks == 1:
        warmup = min(n_stages - 1 - stage, total)  # plain 1F1B
    forwards = [nth(k, "F") for k in range(total)]
    backwards = [nth(k, "B") for k in range(total)]
    steady = [step for pair in zip(forwards[warmup:], backwards) for step in pair]
    return forwards[:warmup] + steady + backwards[total - warmup:]


def _check_sizes(n_stages: int, n_microbatches: int) -> None:
    if n_stages < 1 or n_microbatches < 1:
        raise ValueError(f"a pipeline needs at least 1 stage and 1 microbatch, got "
                         f"n_stages={n_stages}, n_microbatches={n_microbatches}")


# ---- hand-drawn grids --------------------------------------------------------------------------

_TOKEN = re.compile(r"([FB])(\d+)(?:\.(\d+))?")


def from_grid(name: str, rows: str | Sequence[str | Sequence[Step | None]],
              n_microbatches: int | None = None) -> Schedule:
    """A schedule from a drawn grid, one row per device: ``["F0 F1 . B0 B1", ...]``.

    Row p's tokens are stage p's steps; "." (or "-") is a bubble; ``F3.1`` is chunk 1's step
    in an interleaved grid. ``rows`` may also be one multi-line string such as render()'s
    output (the tick line, "dev p |" and bars are skipped), or rows of Steps.
    ``n_microbatches`` defaults to the largest microbatch + 1, the chunks to the largest + 1.
    """
    if isinstance(rows, str):
        rows = [line for line in rows.splitlines()
                if line.strip() and not line.lstrip().startswith("tick")]
    grid = [_parse_row(row, device) if isinstance(row, str) else tuple(row)
            for device, row in enumerate(rows)]
    if n_microbatches is None:
        steps = [step for row in grid for step in row if step is not None]
        n_microbatches = max((step.microbatch for step in steps), default=-1) + 1
    n_chunks = max((step.chunk + 1 for row in grid for step in row if step is not None),
                   default=1)
    return Schedule(name, len(grid), n_microbatches, tuple(grid), n_chunks)


def _parse_row(text: str, device: int) -> tuple[Step | None, ...]:
    body = re.sub(r"^\s*dev\s*\d+", "", text).replace("|", " ")
    cells: list[Step | None] = []
    for token in body.split():
        token = token.strip("[]!").upper()
        match = _TOKEN.fullmatch(token)
        if token in (".", "-"):
            cells.append(None)
        elif match:
            chunk = int(match[3]) if match[3] else 0
            cells.append(Step(device, int(match[2]), match[1], chunk))  # type: ignore[arg-type]
        else:
            raise ScheduleError(f"row {device}: cannot read {token!r}; write F<mb>, B<mb> or "
                                f"'.' for a bubble, e.g. 'F0 F1 . B0'")
    return tuple(cells)


# ---- functions of a schedule ----------------------------------------------------------------

def steps_of(schedule: Schedule, device: int) -> list[Step]:
    """The steps device ``device`` runs, in order: all an executor needs to know."""
    return [step for step in schedule.grid[device] if step is not None]


def makespan_ticks(schedule: Schedule) -> int:
    """Ticks from the start to the end of the last step (trailing bubbles do not count)."""
    return max((tick + 1 for row in schedule.grid
                for tick, step in enumerate(row) if step is not None), default=0)


def bubble_fraction(schedule: Schedule) -> float:
    """Idle slots / all slots, over P devices x makespan ticks."""
    slots = schedule.n_stages * makespan_ticks(schedule)
    busy = sum(step is not None for row in schedule.grid for step in row)
    return (slots - busy) / slots if slots else 0.0


def bubble_overhead(schedule: Schedule) -> float:
    """Idle slots / busy slots: how much longer the step takes than its compute alone
    (Megatron-LM's measure: (P-1)/M for GPipe and 1F1B, (P-1)/(V M) interleaved)."""
    slots = schedule.n_stages * makespan_ticks(schedule)
    busy = sum(step is not None for row in schedule.grid for step in row)
    return (slots - busy) / busy if busy else 0.0


def peak_activations(schedule: Schedule) -> list[int]:
    """Per stage, the most microbatches whose forward has run and whose backward has not
    finished: how many microbatches' activations the stage keeps at once."""
    peaks = []
    for row in schedule.grid:
        held = peak = 0
        for step in filter(None, row):
            held += 1 if step.op == "F" else -1
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


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


def validate(schedule: Schedule) -> None:
    """Raise ScheduleError unless every step of every microbatch appears exactly once, on its
    stage's device, after the steps it depends on. The message lists each problem and shows
    the grid with the offending cells marked."""
    problems, marked = _problems(schedule)
    if problems:
        listed = "\n".join(f"  - {problem}" for problem in problems[:8])
        more = f"\n  ... and {len(problems) - 8} more" if len(problems) > 8 else ""
        raise ScheduleError(f"schedule {schedule.name!r} is invalid:\n{listed}{more}\n"
                            f"{render(schedule, marked)}")


def _problems(schedule: Schedule) -> tuple[list[str], set[tuple[int, int]]]:
    n_stages, n_mbs, n_chunks = schedule.n_stages, schedule.n_microbatches, schedule.n_chunks
    if len(schedule.grid) != n_stages:
        return [f"the grid has {len(schedule.grid)} rows for {n_stages} stages: "
                f"draw one row per device"], set()
    problems: list[str] = []
    marked: set[tuple[int, int]] = set()
    where: dict[Step, int] = {}  # the tick of each step's first appearance
    for device, row in enumerate(schedule.grid):
        for tick, step in filter(lambda cell: cell[1] is not None, enumerate(row)):
            problem = _misplaced(step, device, n_mbs, n_chunks)
            if problem is None and step in where:
                problem = f"{step} appears twice, at ticks {where[step]} and {tick}"
                marked.add((device, where[step]))
            if problem is not None:
                problems.append(problem)
                marked.add((device, tick))
            else:
                where[step] = tick
    problems += [f"{step} is missing: put {step.token} in dev {step.stage}'s row"
                 for step in _all_steps(n_stages, n_mbs, n_chunks) if step not in where]
    for step, tick in where.items():
        for need in dependencies(step, n_stages, n_chunks):
            if need in where and where[need] >= tick:
                problems.append(f"{step} at tick {tick} runs before {need} finishes: that "
                                f"runs at tick {where[need]}, so this can start at tick "
                                f"{where[need] + 1} at the earliest")
                marked.add((step.stage, tick))
    return problems, marked


def _misplaced(step: Step, device: int, n_mbs: int, n_chunks: int) -> str | None:
    if step.op not in ("F", "B"):
        return f"{step} has op {step.op!r}: a step is 'F' (forward) or 'B' (backward)"
    if step.stage != device:
        return f"{step} sits on dev {device}, but stage {step.stage} runs on dev {step.stage}"
    if not 0 <= step.microbatch < n_mbs:
        return f"{step}: microbatch {step.microbatch} is outside 0..{n_mbs - 1}"
    if not 0 <= step.chunk < n_chunks:
        return f"{step}: chunk {step.chunk} is outside 0..{n_chunks - 1}"
    return None


def _all_steps(n_stages: int, n_mbs: int, n_chunks: int = 1) -> list[Step]:
    return [Step(stage, m, op, chunk) for op in ("F", "B") for chunk in range(n_chunks)
            for stage in range(n_stages) for m in range(n_mbs)]
