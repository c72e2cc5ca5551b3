"""Checks of lesson 03: gradient averaging, buckets, overlap with backward, Adam's memory, and
the capstone, a DDP wrapper.

Every case has two halves: *compute* runs the learner's function on the simulator and returns
plain data (gradients, parameters, byte counts, the trace as a dict, the sizes of the tensors
it all-reduced); *judge* rebuilds the reference from the grader's own code and compares.

References: single-device training (averaging, DDP), ``mpgpu_edu.dp.make_buckets`` (buckets),
``mpgpu_edu.memory.bytes_per_param`` and ``estimate_memory`` (memory).

Modules: ``models`` (the models and data both halves build), ``averaging`` (3.1, 3.3),
``buckets`` (3.2), ``memory`` (3.4), ``ddp`` (3.5).
"""

from __future__ import annotations

from mpgpu_edu.grading.checks import FEEDBACK, FEEDBACK_COMPUTE, Case
from mpgpu_edu.grading.checks.lesson_03.averaging import (OVERLAP_WIDTHS, WIDTHS, _averaged,
                                                          _averaging_hidden, _hooks_after,
                                                          _judge_averaging_hidden,
                                                          _judge_hooks_removed, _judge_mean,
                                                          _judge_overlap_averaged,
                                                          _judge_overlap_timeline,
                                                          _judge_single_device, _judge_traffic,
                                                          _overlap_cluster, _overlap_run)
from mpgpu_edu.grading.checks.lesson_03.buckets import (_bucket_case, _bucket_input_case,
                                                        _buckets_hidden,
                                                        _judge_buckets_hidden)
from mpgpu_edu.grading.checks.lesson_03.ddp import (_ddp_basic, _ddp_hidden, _ddp_timeline,
                                                    _ddp_uneven, _judge_ddp_basic,
                                                    _judge_ddp_buckets, _judge_ddp_calls,
                                                    _judge_ddp_hidden,
                                                    _judge_ddp_timeline, _judge_ddp_uneven)
from mpgpu_edu.grading.checks.lesson_03.memory import (MEMORY_MODELS, _judge_fp32,
                                                       _judge_meta_and_bad, _memory_judge,
                                                       _memory_outputs, _meta_and_bad)


# Run with every rank in a process of its own in class grading (see lesson 01's checks):
# each rank holds only its slice of the batch (and, in 3.5, its own replica).
RANKS_APART = ("3.1", "3.3", "3.5")
# There, too, each comm-stream job runs to its end before run_async returns (in real time
# only: ``comm.apart``'s ``jobs_in_order``), so a job can use only the gradients that exist
# when it starts: one started early that waits for the end of backward never ends, where the
# timeline would show it overlapping backward.
JOBS_IN_ORDER = ("3.3", "3.5")

REFERENCES = {  # the package's own implementation, out of reach while the learner's runs
    "3.1": ["mpgpu_edu.hybrid.train:all_reduce_gradients", "mpgpu_edu.dp.ddp:all_reduce_buckets"],
    "3.2": ["mpgpu_edu.dp.ddp:make_buckets", "mpgpu_edu.dp.ddp:make_buckets_torch"],
    "3.3": ["mpgpu_edu.dp.ddp:grad_buckets", "mpgpu_edu.dp.ddp:ddp_step_overlapped",
            "mpgpu_edu.dp.wrapper:DDPWrapper", "mpgpu_edu.dp.wrapper:wrap_ddp"],
    "3.4": ["mpgpu_edu.memory:estimate_memory", "mpgpu_edu.memory:bytes_per_param",
            "mpgpu_edu.memory.measure:parameter_bytes", "mpgpu_edu.memory.measure:gradient_bytes"],
    "3.5": ["mpgpu_edu.dp.wrapper:*", "mpgpu_edu.dp.ddp:*",  # buckets, broadcast, overlap
            "mpgpu_edu.replica.flat:*"],  # and the flattening: the wrapper is the learner's
}

CASES: dict[str, list[Case]] = {
    "3.1": [
        Case("every replica holds the mean gradient", 1,
             lambda impl: _averaged(impl, 3, WIDTHS, 12),
             lambda data: _judge_mean(data, 3, WIDTHS, 12)),
        Case("same gradients as one device on the whole batch", 1,
             lambda impl: _averaged(impl, 4, WIDTHS, 12), _judge_single_device),
        Case("traffic: no rank sends more than a ring all-reduce", 1,
             lambda impl: _averaged(impl, 4, WIDTHS, 12), _judge_traffic),
        Case("hidden: other world sizes and widths", 1, _averaging_hidden,
             _judge_averaging_hidden, hidden=True),
    ],
    "3.2": [
        Case("the docstring's example", 1, *_bucket_case([([4, 4, 4, 8], 8)])),
        Case("reverse order, full buckets", 1,
             *_bucket_case([([1, 2, 3, 4, 5, 6], 7), ([5, 5, 5, 5], 10), ([], 4)])),
        Case("a parameter larger than a bucket gets its own", 1,
             *_bucket_case([([2, 40, 2, 2], 8), ([9], 8)])),
        Case("hidden: random sizes", 2, _buckets_hidden, _judge_buckets_hidden, hidden=True),
        Case("the caller's list left unchanged " + FEEDBACK, 0,
             *_bucket_input_case([([4, 4, 4, 8], 8), ([1, 2, 3, 4, 5, 6], 7), ([], 4),
                                  ([2, 40, 2, 2], 8)])),
    ],
    "3.3": [
        Case("gradients are averaged, by one all-reduce (mean) per parameter", 4,
             lambda impl: _averaged(impl, 3, OVERLAP_WIDTHS[:3], 12, overlap=True,
                                    cluster=_overlap_cluster(3)),
             lambda data: _judge_overlap_averaged(data, 3, OVERLAP_WIDTHS[:3], 12)),
        Case("timeline: communication overlaps backward " + FEEDBACK_COMPUTE, 0, _overlap_run,
             _judge_overlap_timeline, timeout_s=40.0),
        Case("hooks are removed afterwards", 1, _hooks_after, _judge_hooks_removed),
    ],
    "3.4": [
        Case("fp32: 16 bytes per parameter", 1, _memory_outputs([("mlp", "fp32")]),
             _judge_fp32),
        Case("mixed precision: 2 + 2 + 12 bytes", 1, _memory_outputs([("mlp", "mixed")]),
             _memory_judge([("mlp", "mixed")], MEMORY_MODELS)),
        Case("frozen parameters: weights only", 1,
             _memory_outputs([("frozen", "fp32"), ("frozen", "mixed")]),
             _memory_judge([("frozen", "fp32"), ("frozen", "mixed")], MEMORY_MODELS)),
        Case("meta device and bad precision", 1, _meta_and_bad, _judge_meta_and_bad),
    ],
    "3.5": [
        Case("3 ranks from different starts: rank 0's start, then one device's training", 5,
             _ddp_basic, _judge_ddp_basic),
        Case("buckets: reverse order, one all-reduce each; one broadcast, at construction", 5,
             _ddp_basic, _judge_ddp_buckets),
        Case("the calls: one broadcast while constructing, then one all_reduce per bucket, "
             "in the buckets' order " + FEEDBACK, 0, _ddp_basic, _judge_ddp_calls),
        Case("4 ranks, uneven shards of the batch", 3, _ddp_uneven, _judge_ddp_uneven),
        Case("timeline: all-reduces launched during backward, overlapping it "
             + FEEDBACK_COMPUTE, 0, _ddp_timeline, _judge_ddp_timeline, timeout_s=40.0),
        Case("hidden: 2-5 ranks, other layers, bucket caps that split unevenly", 7,
             _ddp_hidden, _judge_ddp_hidden, hidden=True, timeout_s=60.0),
    ],
}
