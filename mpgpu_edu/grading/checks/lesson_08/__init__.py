"""Checks of lesson 08: a rank's flat shard, and the capstone, a sharded (ZeRO-3 / FSDP) layer
wrapper.

Every case has two halves: *compute* runs the learner's function (on the simulator for the
wrapper) and returns plain data (shards, gradients, the collectives it called and their
sizes, makespans, the trace as a dict); *judge* rebuilds the reference from the grader's own
code and compares. The oracle for the wrapper is single-device training on the same batches;
its shards are ``mpgpu_edu.dp.fsdp.flat_shard`` of the single-device parameters.

The package's own wrapper (``mpgpu_edu.dp.fsdp``) is out of the capstone's reach: while the
learner's code runs, every function and class of that module raises, however it was reached
(``grading.compute.ANSWERS``, blocked for every exercise).

Modules: ``shard`` (8.1), ``setup`` (the capstone's models, data and reference), ``wrapper``
(its compute halves), ``judges`` (its judge halves)."""

from __future__ import annotations

import torch

from mpgpu_edu.grading.checks import FEEDBACK, FEEDBACK_COMPUTE, Case
from mpgpu_edu.grading.checks.lesson_08.judges import (_judge_accumulation, _judge_adam_prefetch,
                                                       _judge_adam_prefetch_calls,
                                                       _judge_basic, _judge_basic_calls,
                                                       _judge_basic_messages, _judge_freed,
                                                       _judge_hidden, _judge_prefetch)
from mpgpu_edu.grading.checks.lesson_08.shard import (_judge_own_memory, _judge_shards,
                                                      _judge_shards_hidden, _shards,
                                                      _shards_hidden)
from mpgpu_edu.grading.checks.lesson_08.wrapper import (_accumulation, _adam_prefetch, _basic,
                                                        _hidden, _prefetch_runs)

# Run with every rank in a process of its own in class grading (see lesson 01's checks):
# each rank holds only its own slice of every batch. Its calls of the collectives, what it
# kept alive and which gathers it started ahead are seen only in its own process, and its
# timeline's compute is its own report: those cases earn no points; the collectives it ran
# are read from its messages, and which gathers went ahead from the order of its jobs.
RANKS_APART = ("8.2",)
JOBS_IN_ORDER = ("8.2",)  # each gather or reduce-scatter job ends before the program goes on
# (see lesson 03's checks): the prefetch the timeline shows used only what existed then

REFERENCES = {  # the package's own implementation, out of reach while the learner's runs
    "8.1": ["mpgpu_edu.dp.fsdp:flat_shard"],
}

CASES: dict[str, list[Case]] = {
    "8.1": [
        Case("the docstring's example", 1, _shards([(5, 2)]), _judge_shards),
        Case("equal shards, zero padding at the end, in the vector's dtype", 1,
             _shards([(10, 3), (12, 4), (2, 5), (0, 3), (7, 2), (9, 4)],
                     dtypes=[torch.float32] * 4 + [torch.int64, torch.bfloat16]),
             _judge_shards),
        Case("hidden: other sizes and world sizes", 1, _shards_hidden, _judge_shards_hidden,
             hidden=True),
        Case("each a tensor of its own, the vector left as it was " + FEEDBACK, 0,
             _shards([(10, 3), (12, 4), (2, 5), (0, 3), (7, 2), (9, 4)],
                     dtypes=[torch.float32] * 4 + [torch.int64, torch.bfloat16]),
             _judge_own_memory),
    ],
    "8.2": [
        Case("3 ranks: the shards, the mean gradients, then one device's training", 5,
             _basic, _judge_basic),
        Case("collectives: two all-gathers and one reduce-scatter per layer", 4,
             _basic, _judge_basic_messages),
        Case("the calls: all_gather and reduce_scatter (mean), none started ahead; the module "
             "given left as it was; nn.Parameters to optimize " + FEEDBACK,
             0, _basic, _judge_basic_calls),
        Case("memory: forward leaves no layer's full parameters for backward " + FEEDBACK, 0,
             _basic, _judge_freed),
        Case("gradients accumulate: two backward passes before finish(), then one more", 3,
             _accumulation, _judge_accumulation),
        Case("4 ranks, Adam, uneven batch shards, prefetch on", 3, _adam_prefetch,
             _judge_adam_prefetch),
        Case("prefetch on: exactly the next layer's gather started ahead " + FEEDBACK, 0,
             _adam_prefetch, _judge_adam_prefetch_calls),
        Case("timeline: prefetch hides the gathers " + FEEDBACK_COMPUTE, 0, _prefetch_runs,
             _judge_prefetch, timeout_s=60.0),
        Case("hidden: 2-5 ranks, other widths, SGD and Adam", 3, _hidden, _judge_hidden,
             hidden=True, timeout_s=60.0),
    ],
}
