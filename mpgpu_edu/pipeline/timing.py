"""A schedule in seconds: each device runs its steps in the schedule's order, each step as soon
as the device is free and its inputs have arrived.

A schedule's grid fixes the *order* of steps on each device; here stages may take different
times (unequal stages), a backward may cost more than a forward, and a send between devices
adds ``send_s``. That turns the unit-tick grid into a timeline, the same thing the simulator
measures when an executor runs the schedule.

Two bubble formulas, for P stages, M microbatches, every stage taking f per forward and b per
backward, sends free. In GPipe and 1F1B a device waits P-1 forwards for the pipeline to fill
and P-1 backwards for it to drain, so the makespan is (M+P-1)(f+b) while each device computes
M(f+b):

    idle fraction  = idle / total         = (P-1)(f+b) / ((M+P-1)(f+b)) = (P-1)/(M+P-1)
    bubble overhead = idle / ideal compute = (P-1)(f+b) / (M(f+b))       = (P-1)/M

The first (``timed_bubble_fraction``, and ``bubble_fraction`` on the grid) is the share of a
device's time lost; GPipe's paper quotes it. The second is how much longer a step takes than
it would with no bubble; Megatron-LM's paper (Narayanan et al., 2021) quotes it. Both depend
only on P and M: (f+b) cancels, so they hold for b = 2f as well as for b = f. With unequal
stages the slowest stage sets the pace and the bubble grows.

Interleaved 1F1B with V chunks per device: each chunk step takes f/V and b/V, the fill and
drain take (P-1)(f+b)/V, and the overhead is (P-1)/(V M) (``timed_bubble_overhead``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mpgpu_edu.pipeline.measures import steps_of, validate
from mpgpu_edu.pipeline.steps import Schedule, Step, earliest_starts
from mpgpu_edu.cluster.trace import Event, Trace

Seconds = float | Sequence[float]


@dataclass(frozen=True)
class TimedStep:
    """One step of a schedule on the clock: it runs on ``device`` from ``start`` to ``end``."""

    device: int
    step: Step
    start: float
    end: float


def schedule_timeline(schedule: Schedule, forward_s: Seconds, backward_s: Seconds,
                      send_s: float = 0) -> list[TimedStep]:
    """The earliest-start timeline of ``schedule``'s per-device step order, sorted by start.

    ``forward_s`` and ``backward_s`` are seconds per step, one number for every stage or one per
    stage. A step waits for its device and for its dependencies; a dependency on another device
    also waits ``send_s`` for the activation or gradient to arrive. Any real numbers work:
    pass ``fractions.Fraction`` values for exact arithmetic.
    """
    validate(schedule)
    forward = _per_stage(forward_s, schedule.n_stages, "forward_s")
    backward = _per_stage(backward_s, schedule.n_stages, "backward_s")

    def duration(step: Step) -> float:
        return forward[step.stage] if step.op == "F" else backward[step.stage]

    orders = [steps_of(schedule, device) for device in range(schedule.n_stages)]
    starts = earliest_starts(orders, duration, send_s, schedule.n_chunks)
    timeline = [TimedStep(step.stage, step, start, start + duration(step))
                for step, start in starts.items()]
    return sorted(timeline, key=lambda timed: (timed.start, timed.device))


def timed_bubble_fraction(schedule: Schedule, forward_s: Seconds, backward_s: Seconds,
                          send_s: float = 0) -> float:
    """Idle time / (P devices x makespan) on ``schedule_timeline``'s timeline."""
    timeline = schedule_timeline(schedule, forward_s, backward_s, send_s)
    total = schedule.n_stages * max((timed.end for timed in timeline), default=0)
    busy = sum(timed.end - timed.start for timed in timeline)
    return (total - busy) / total if total else 0.0


def timed_bubble_overhead(schedule: Schedule, forward_s: Seconds, backward_s: Seconds,
                          send_s: float = 0) -> float:
    """Idle time / busy time on ``schedule_timeline``'s timeline: how much longer the step
    takes than its compute alone ((P-1)/M for 1F1B, (P-1)/(V M) interleaved, free sends)."""
    timeline = schedule_timeline(schedule, forward_s, backward_s, send_s)
    total = schedule.n_stages * max((timed.end for timed in timeline), default=0)
    busy = sum(timed.end - timed.start for timed in timeline)
    return (total - busy) / busy if busy else 0.0


def timeline_trace(timeline: Sequence[TimedStep], n_devices: int) -> Trace:
    """The timeline as a Trace (forward and backward events on each compute stream), so the
    figures and metrics made for simulated runs draw a schedule before anything runs."""
    kinds = {"F": "forward", "B": "backward"}
    events = [Event(timed.device, "compute", kinds[timed.step.op], timed.start, timed.end,
                    label=timed.step.token) for timed in timeline]
    return Trace(n_devices, events)


def _per_stage(seconds: Seconds, n_stages: int, name: str) -> list[float]:
    if isinstance(seconds, Sequence):
        if len(seconds) != n_stages:
            raise ValueError(f"{name} has {len(seconds)} values for {n_stages} stages: "
                             f"give one number, or one per stage")
        return list(seconds)
    return [seconds] * n_stages
