"""Pipeline parallelism: split the layers into stages, one stage per device, and stream
microbatches through them on a schedule.

- ``partition``: which layers go on which stage (by hand, or balanced by parameters or FLOPs).
- ``schedules``: naive, GPipe and 1F1B as values: grids of forward/backward steps per tick.
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
from mpgpu_edu.pipeline.schedules import (
    Schedule,
    ScheduleError,
    Step,
    bubble_fraction,
    dependencies,
    earliest_starts,
    from_grid,
    from_order,
    gpipe,
    makespan_ticks,
    naive,
    one_f_one_b,
    peak_activations,
    recv_from,
    render,
    send_to,
    steps_of,
    validate,
)
from mpgpu_edu.pipeline.timing import (
    TimedStep,
    schedule_timeline,
    timed_bubble_fraction,
    timeline_trace,
)

__all__ = [
    "LayerCost", "Placement", "StagePlacement", "layer_costs", "partition_balanced",
    "partition_by_list", "partition_by_sizes", "split_module",
    "Schedule", "ScheduleError", "Step", "bubble_fraction", "dependencies", "earliest_starts",
    "from_grid", "from_order", "gpipe", "makespan_ticks", "naive", "one_f_one_b",
    "peak_activations", "recv_from", "render", "send_to", "steps_of", "validate",
    "TimedStep", "schedule_timeline", "timed_bubble_fraction", "timeline_trace",
]
