"""Checks of lesson 04: partition, GPipe and 1F1B schedules, the forward step, the executor.

Every case has two halves. *compute* runs the learner's function and hands back plain data:
boundaries, step orders as ``[stage, microbatch, op]`` triples, a pipeline run's outputs,
gradients, parameters and counts. *judge* rebuilds the package's reference from the example
alone (``partition_balanced``, ``gpipe``, ``one_f_one_b``, the whole model on one device) and
compares. The executor is held to one device's training step (loss, gradients and parameters
after SGD) on GPipe, 1F1B and three hand-made schedules (in one neighbouring stages run their
backwards in different orders, so that only the tags keep the gradients apart; in another their
forwards, so that a blocking send deadlocks), and to the schedule's memory: a wrapper around
each stage watches the tensors it hands out and their memory (``weakref.finalize``, a weak
reference to the storage) and sees, at the start of every forward and backward, which
microbatches the executor still keeps alive.

Modules: ``partition`` (4.1), ``schedules`` (4.2, 4.3), ``forward`` (4.4), and for 4.5
``stages`` (what both halves build), ``executor`` (*compute*), ``executor_judges``.
"""

from __future__ import annotations

from mpgpu_edu.grading.checks import FEEDBACK, FEEDBACK_COMPUTE, Case
from mpgpu_edu.grading.checks.lesson_04.executor import (IN_FLIGHT, SECONDS, STEP_1F1B,
                                                         STEP_GPIPE, STEP_OTHER, _hidden_executor,
                                                         _runs)
from mpgpu_edu.grading.checks.lesson_04.executor_judges import (_judge_hidden_executor,
                                                                _judge_in_flight,
                                                                _judge_in_flight_runs,
                                                                _judge_runs,
                                                                _judge_timed_executor,
                                                                _judge_traffic_both)
from mpgpu_edu.grading.checks.lesson_04.forward import (_compute_forward,
                                                        _judge_backward_reaches_input,
                                                        _judge_timed, _judge_traffic,
                                                        _judge_values_all)
from mpgpu_edu.grading.checks.lesson_04.partition import (DEEP_COSTS, _compute_bad,
                                                          _compute_partition_hidden,
                                                          _judge_bad, _judge_partition_hidden,
                                                          _partition_case,
                                                          _partition_input_case)
from mpgpu_edu.grading.checks.lesson_04.schedules import (MAKESPAN_SIZES, _gpipe_ticks_memory,
                                                          _hidden_orders, _hidden_orders_judge,
                                                          _makespan_judge, _one_f_one_b_memory,
                                                          _orders_case, _same_judge, _valid_judge)
from mpgpu_edu.pipeline import gpipe, one_f_one_b


# Run with every rank in a process of its own in class grading (see lesson 01's checks):
# each rank holds only its own stage, the first only the microbatches, the last only the
# targets (4.5).
RANKS_APART = ("4.4", "4.5")

REFERENCES = {  # the package's own implementation, out of reach while the learner's runs
    "4.1": ["mpgpu_edu.pipeline.partition:partition_balanced",
            "mpgpu_edu.pipeline.partition:_min_max_boundaries",
            "mpgpu_edu.pipeline.partition:_check_stage_count"],
    "4.2": ["mpgpu_edu.pipeline.schedules:gpipe", "mpgpu_edu.pipeline.schedules:_interleaved_order",
            "mpgpu_edu.pipeline.measures:_all_steps",
            "mpgpu_edu.pipeline.schedules:_one_f_one_b_order"],
    "4.3": ["mpgpu_edu.pipeline.schedules:one_f_one_b",
            "mpgpu_edu.pipeline.schedules:_one_f_one_b_order",
            "mpgpu_edu.pipeline.schedules:_interleaved_order"],
    "4.4": ["mpgpu_edu.pipeline.executor:_Pipeline", "mpgpu_edu.pipeline.executor:_forward",
            "mpgpu_edu.pipeline.executor:_backward", "mpgpu_edu.pipeline.executor:run_schedule"],
    "4.5": ["mpgpu_edu.pipeline.executor:run_schedule", "mpgpu_edu.pipeline.executor:_Pipeline",
            "mpgpu_edu.pipeline.executor:_forward", "mpgpu_edu.pipeline.executor:_backward"],
}

CASES: dict[str, list[Case]] = {
    "4.1": [
        Case("the best split: the docstring's example, uneven layers, fractional costs "
             "(milliseconds, seconds)", 1,
             *_partition_case([([3, 1, 1, 1, 2], 2), ([5, 1, 1, 1, 1, 1], 2),
                               ([9, 6, 10, 8], 3), ([1, 2, 3, 4, 5, 6, 7, 8, 9], 3),
                               ([4, 4, 4], 3), ([7, 2], 1), ([0, 0, 9, 0], 2),
                               ([0.5, 0.4, 0.3], 2), ([1.25, 0.5, 0.75, 2.0, 0.25], 3),
                               ([0.1, 0.2, 0.3, 0.4], 2),
                               ([5e-07, 4e-07, 3e-07, 6e-07, 1e-07], 3)])),
        Case("too many or too few stages raise ValueError", 1, _compute_bad, _judge_bad),
        Case("hidden: random costs", 1, _compute_partition_hidden, _judge_partition_hidden,
             hidden=True),
        Case("96 layers into 8 stages within 10 s (trying every split would take hours)", 1,
             *_partition_case([(DEEP_COSTS, 8)]), timeout_s=10),
        Case("the caller's costs left unchanged " + FEEDBACK, 0,
             *_partition_input_case([([3, 1, 1, 1, 2], 2), ([9, 6, 10, 8], 3), ([7, 2], 1),
                                     ([1.25, 0.5, 0.75, 2.0, 0.25], 3)])),
    ],
    "4.2": [
        Case("a valid schedule", 1, _orders_case([(2, 2), (4, 3)]),
             _valid_judge("gpipe", "gpipe_orders")),
        Case("the GPipe order", 1, _orders_case([(3, 4), (1, 2), (4, 1)]),
             _same_judge(gpipe, "gpipe", "gpipe_orders")),
        Case("2(M+P-1) ticks; stage 0 holds M microbatches", 1,
             _orders_case(MAKESPAN_SIZES + [(4, 6), (2, 3)]), _gpipe_ticks_memory),
        Case("hidden: random sizes", 1, _hidden_orders,
             _hidden_orders_judge(gpipe, "gpipe", "gpipe_orders"), hidden=True),
    ],
    "4.3": [
        Case("a valid schedule", 1, _orders_case([(2, 2), (4, 6), (4, 2)]),
             _valid_judge("1f1b", "one_f_one_b_orders")),
        Case("as fast as GPipe: 2(M+P-1) ticks", 1, _orders_case(MAKESPAN_SIZES),
             _makespan_judge("1f1b", "one_f_one_b_orders")),
        Case("memory: stage p holds at most min(P-p, M) microbatches", 1,
             _orders_case([(4, 8), (4, 2), (3, 5), (5, 12)]), _one_f_one_b_memory),
        Case("the 1F1B order", 1, _orders_case([(4, 6), (3, 2), (1, 3)]),
             _same_judge(one_f_one_b, "1f1b", "one_f_one_b_orders")),
        Case("hidden: random sizes", 1, _hidden_orders,
             _hidden_orders_judge(one_f_one_b, "1f1b", "one_f_one_b_orders"), hidden=True),
    ],
    "4.4": [
        Case("matches the whole model on one device", 3,
             lambda impl: [_compute_forward(impl, 3, 4), _compute_forward(impl, 1, 2)],
             _judge_values_all),
        Case("traffic: one activation per microbatch, to the next stage, tagged message_tag, "
             "every message waited", 1,
             lambda impl: _compute_forward(impl, 3, 4), _judge_traffic),
        Case("timed as forward compute " + FEEDBACK_COMPUTE, 0,
             lambda impl: _compute_forward(impl, 2, 3), _judge_timed),
        Case("the output keeps its graph, and backward reaches the received activation (its "
             "gradient goes back) " + FEEDBACK, 0,
             lambda impl: _compute_forward(impl, 3, 2), _judge_backward_reaches_input),
    ],
    "4.5": [
        Case("GPipe: loss, gradients and parameters after a step equal one device's", 5,
             _runs(STEP_GPIPE), _judge_runs, timeout_s=60),
        Case("1F1B from the same executor: equal to one device", 3, _runs(STEP_1F1B),
             _judge_runs, timeout_s=60),
        Case("any schedule: hand-made orders (backwards last first; neighbours' backwards, or "
             "forwards, in different orders)", 2,
             _runs(STEP_OTHER), _judge_runs, timeout_s=60),
        Case("traffic: per microbatch one activation forward, one gradient back", 2,
             _runs(STEP_1F1B[:1]), _judge_traffic_both, timeout_s=60),
        Case("in flight: by the messages, no more microbatches than the schedule's "
             "(1F1B <= P)", 3, _runs(IN_FLIGHT, seconds=SECONDS), _judge_in_flight_runs,
             timeout_s=60),
        Case("memory: what each stage keeps alive matches the schedule " + FEEDBACK, 0,
             _runs(IN_FLIGHT), _judge_in_flight, timeout_s=60),
        Case("timed: M forwards and M backwards per stage at stage_seconds "
             + FEEDBACK_COMPUTE, 0,
             _runs(STEP_GPIPE[:1] + STEP_1F1B[:1], seconds=SECONDS), _judge_timed_executor,
             timeout_s=60),
        Case("hidden: 2-5 stages, M not a multiple of P, uneven microbatches, other splits", 3,
             _hidden_executor, _judge_hidden_executor, hidden=True, timeout_s=120),
    ],
}
