"""Lesson 03: data parallel."""

from __future__ import annotations

from mpgpu_edu.course._types import Lesson, ex

EXERCISES = (
    ex('3.1', 'average_gradients', 'DDP: average the gradients', 5,
       ("all_reduce(comm, p.grad, op='mean') for each parameter.",
        "all_reduce(comm, p.grad, op='mean') for each parameter.",
        "all_reduce(comm, p.grad, op='mean') for each parameter.")),
    ex('3.2', 'make_buckets', 'DDP: bucket the gradients', 5,
       ('walk reversed(range(len(sizes))); close a full bucket.',
        'walk reversed(range(len(sizes))); close a full bucket.',
        'walk reversed(range(len(sizes))); close a full bucket.')),
    ex('3.3', 'backward_with_overlap', 'DDP: overlap communication with backward', 8,
       ('p.register_post_accumulate_grad_hook + comm.run_async.',
        'p.register_post_accumulate_grad_hook + comm.run_async.',
        'p.register_post_accumulate_grad_hook + comm.run_async.')),
    ex('3.4', 'adam_memory', 'Memory of training with Adam', 4,
       ('sum p.numel(); frozen: no gradient, no optimizer state.',
        'sum p.numel(); frozen: no gradient, no optimizer state.',
        'sum p.numel(); frozen: no gradient, no optimizer state.')),
)

PREDICTIONS = ()

LESSON = Lesson(3, 'data parallel', 'ex03_data_parallel', 'notebooks/03_data_parallel.ipynb', EXERCISES, PREDICTIONS)
