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
from collections.abc import Sequence

from mpgpu_edu.pipeline.steps import Op, Schedule, ScheduleError, Step, earliest_starts


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
