"""Lesson 04: pipeline."""

from __future__ import annotations

from mpgpu_edu.course._types import Lesson, ex

EXERCISES = (
    ex('4.1', 'balanced_boundaries', 'Pipeline: balanced layer partition', 5,
       ('DP: best[k][j] = cheapest max for j layers in k stages.',
        'DP: best[k][j] = cheapest max for j layers in k stages.',
        'DP: best[k][j] = cheapest max for j layers in k stages.')),
    ex('4.2', 'gpipe_orders', 'Pipeline: the GPipe schedule', 4,
       ('all F steps in microbatch order, then all B steps.',
        'all F steps in microbatch order, then all B steps.',
        'all F steps in microbatch order, then all B steps.')),
    ex('4.3', 'one_f_one_b_orders', 'Pipeline: the 1F1B schedule', 6,
       ('P - 1 - p warm-up forwards, then pairs of F and B.',
        'P - 1 - p warm-up forwards, then pairs of F and B.',
        'P - 1 - p warm-up forwards, then pairs of F and B.')),
    ex('4.4', 'pipeline_forward_step', 'Pipeline: one forward step of the executor', 6,
       ('recv_from / send_to(step, n_stages); tag=microbatch.',
        'recv_from / send_to(step, n_stages); tag=microbatch.',
        'recv_from / send_to(step, n_stages); tag=microbatch.')),
)

PREDICTIONS = ()

LESSON = Lesson(4, 'pipeline', 'ex04_pipeline', 'notebooks/04_pipeline.ipynb', EXERCISES, PREDICTIONS)
