"""What is read off a schedule: each device's steps in order (all an executor needs), the
makespan in ticks, the bubble (idle over all slots, idle over busy slots), the activations a
stage holds at once, and ``validate``, which lists every broken rule on the marked grid."""

from __future__ import annotations

from mpgpu_edu.pipeline.steps import Schedule, ScheduleError, Step, dependencies, render

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
