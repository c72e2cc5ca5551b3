"""Lesson 05: tensor and hybrid parallel."""

from __future__ import annotations

from mpgpu_edu.course._types import Lesson, ex

EXERCISES = (
    ex('5.1', 'column_parallel_linear', 'Tensor parallel: column-parallel linear', 6,
       ('x @ weight_shard.T + bias_shard, all_gather, torch.cat.',
        'x @ weight_shard.T + bias_shard, all_gather, torch.cat.',
        'x @ weight_shard.T + bias_shard, all_gather, torch.cat.')),
    ex('5.2', 'zero1_adam_step', 'ZeRO-1: sharded optimizer state', 8,
       ('reduce_scatter (mean), adam_update, all_gather.',
        'reduce_scatter (mean), adam_update, all_gather.',
        'reduce_scatter (mean), adam_update, all_gather.')),
    ex('5.3', 'hybrid_groups', 'Hybrid parallel: the DP x PP mesh', 4,
       ('rank = replica * pp_size + stage.',
        'rank = replica * pp_size + stage.',
        'rank = replica * pp_size + stage.')),
)

PREDICTIONS = ()

LESSON = Lesson(5, 'tensor and hybrid parallel', 'ex05_tensor_and_hybrid', 'notebooks/05_tensor_and_hybrid.ipynb', EXERCISES, PREDICTIONS)
