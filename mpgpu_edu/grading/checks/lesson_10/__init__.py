"""Checks of lesson 10: interleaved 1F1B's bubble in closed form, and the capstone, the
interleaved 1F1B schedule as each device's step order.

Every case has two halves. *compute* calls the learner's function and returns plain data (the
overheads, the step orders as ``[stage, microbatch, op, chunk]`` rows, or what each refused
input did); *judge* rebuilds the reference in the grader from the simulated schedule
(``pipeline.interleaved_1f1b``, ``bubble_overhead``, ``timed_bubble_overhead``,
``peak_activations``). The package's interleaved schedule is out of reach while the learner's
code runs (``REFERENCES``).

Modules: ``bubble`` (10.1), ``schedule`` (10.2)."""

from __future__ import annotations

from mpgpu_edu.grading.checks import Case
from mpgpu_edu.grading.checks.lesson_10.bubble import (_bubble_hidden, _bubble_judge, _bubbles,
                                                       _judge_bubble_hidden, _judge_refusals,
                                                       _refusals)
from mpgpu_edu.grading.checks.lesson_10 import schedule as sched

REFERENCES = {
    "10.1": ["mpgpu_edu.pipeline.schedules:interleaved_1f1b",
             "mpgpu_edu.pipeline.schedules:_interleaved_order",
             "mpgpu_edu.pipeline.measures:bubble_overhead"],
    "10.2": ["mpgpu_edu.pipeline.schedules:interleaved_1f1b",
             "mpgpu_edu.pipeline.schedules:_interleaved_order"],
}

CASES: dict[str, list[Case]] = {
    "10.1": [
        Case("the docstring's example", 1, _bubbles([(4, 8, 1)]), _bubble_judge([(4, 8, 1)])),
        Case("agrees with the simulated schedule; V=1 is 1F1B", 1,
             _bubbles([(2, 4, 3), (3, 9, 2), (4, 4, 1)]),
             _bubble_judge([(2, 4, 3), (3, 9, 2), (4, 4, 1)])),
        Case("refuses sizes the schedule cannot run", 1, _refusals, _judge_refusals),
        Case("hidden: other sizes", 1, _bubble_hidden, _judge_bubble_hidden, hidden=True),
    ],
    "10.2": [
        Case("the docstring's example and 4 devices: a valid schedule", 2,
             sched._orders([(2, 2, 2), (4, 8, 2)]), sched._judge_valid),
        Case("the bubble is (P-1)/(V M) of the compute time", 2,
             sched._orders([(2, 4, 2), (4, 8, 2), (3, 6, 3)]), sched._judge_bubble),
        Case("rule 2's warm-up (w + 1 forwards before the first backward) and memory: no "
             "device holding more microbatch-chunks than interleaved 1F1B", 1,
             sched._orders([(4, 8, 2), (3, 3, 2), (2, 6, 4)]),
             sched._judge_memory_and_warmup),
        Case("one chunk per device is lesson 04's 1F1B", 1,
             sched._orders([(4, 8, 1), (3, 3, 1)]), sched._judge_plain_1f1b),
        Case("refuses sizes the schedule cannot run", 1, sched._refusals,
             sched._judge_refusals),
        Case("hidden: other sizes", 1, sched._hidden, sched._judge_hidden, hidden=True),
    ],
}
