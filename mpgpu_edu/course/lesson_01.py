"""Lesson 01: communication."""

from __future__ import annotations

from mpgpu_edu.course._types import Lesson, ex

EXERCISES = (
    ex('1.1', 'p2p_time', 'Point-to-point cost: alpha + n / beta', 3,
       ('cluster.route(src, dst) has alpha_s and beta_Bps.',
        'cluster.route(src, dst) has alpha_s and beta_Bps.',
        'cluster.route(src, dst) has alpha_s and beta_Bps.')),
    ex('1.2', 'naive_all_reduce', 'Naive all-reduce through rank 0', 5,
       ('rank 0 receives and adds each tensor, then sends back.',
        'rank 0 receives and adds each tensor, then sends back.',
        'rank 0 receives and adds each tensor, then sends back.')),
    ex('1.3', 'ring_all_reduce', 'Ring all-reduce', 10,
       ('torch.tensor_split makes the chunks; isend before recv.',
        'torch.tensor_split makes the chunks; isend before recv.',
        'torch.tensor_split makes the chunks; isend before recv.')),
    ex('1.4', 'ring_reduce_scatter', 'Ring reduce-scatter', 6,
       ('step k: send chunk (r-1-k) % N, add into (r-2-k) % N.',
        'step k: send chunk (r-1-k) % N, add into (r-2-k) % N.',
        'step k: send chunk (r-1-k) % N, add into (r-2-k) % N.')),
    ex('1.5', 'ring_all_gather', 'Ring all-gather', 5,
       ('step k: send slot (r-k) % N, recv slot (r-1-k) % N.',
        'step k: send slot (r-k) % N, recv slot (r-1-k) % N.',
        'step k: send slot (r-k) % N, recv slot (r-1-k) % N.')),
)

PREDICTIONS = ()

LESSON = Lesson(1, 'communication', 'ex01_communication', 'notebooks/01_communication.ipynb', EXERCISES, PREDICTIONS)
