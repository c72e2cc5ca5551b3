"""Pipeline parallelism: split the layers into stages, one stage per device, and stream
microbatches through them on a schedule.

- ``partition``: which layers go on which stage (by hand, or balanced by parameters or FLOPs).
- ``steps``: a ``Step``, a ``Schedule`` (a grid of steps per tick) and their dependencies.
- ``schedules``: the builders: naive, GPipe, 1F1B, interleaved 1F1B, from an order or a grid.
- ``measures``: bubbles, peak activations, ``validate``.
- ``timing``: the same schedules with real seconds per stage and per send.
"""

from mpgpu_edu.pipeline.partition import (
    LayerCost,
    Placement,
    StagePlacement,
    layer_costs,
    partition_balanced,
    partition_by_list,
    partition_by_sizes,
    split_module,
)
from mpgpu_edu.pipeline.measures import (
    bubble_fraction,
    bubble_overhead,
    makespan_ticks,
    peak_activations,
    steps_of,
    validate,
)
from mpgpu_edu.pipeline.schedules import (
    from_grid,
    from_order,
    gpipe,
    interleaved_1f1b,
    naive,
    one_f_one_b,
)
from mpgpu_edu.pipeline.steps import (
    Schedule,
    ScheduleError,
    Step,
    consumer_of,
    dependencies,
    earliest_starts,
    producer_of,
    recv_from,
    render,
    send_to,
)
from mpgpu_edu.pipeline.timing import (
    TimedStep,
    schedule_timeline,
    timed_bubble_fraction,
    timed_bubble_overhead,
    timeline_trace,
)

__all__ = [
    "LayerCost", "Placement", "StagePlacement", "layer_costs", "partition_balanced",
    "partition_by_list", "partition_by_sizes", "split_module",
    "Schedule", "ScheduleError", "Step", "bubble_fraction", "bubble_overhead", "consumer_of",
    "dependencies", "earliest_starts", "from_grid", "from_order", "gpipe", "interleaved_1f1b",
    "makespan_ticks", "naive", "one_f_one_b", "peak_activations", "producer_of", "recv_from",
    "render", "send_to", "steps_of", "validate",
    "TimedStep", "schedule_timeline", "timed_bubble_fraction", "timed_bubble_overhead",
    "timeline_trace",
]
