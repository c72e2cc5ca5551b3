"""Lesson 02: parameter server."""

from __future__ import annotations

from mpgpu_edu.course._types import Lesson, ex

EXERCISES = (
    ex('2.1', 'ps_worker_step', "Parameter server: the worker's step", 4,
       ('comm.send the gradient, then comm.recv into params.',
        'comm.send the gradient, then comm.recv into params.',
        'comm.send the gradient, then comm.recv into params.')),
    ex('2.2', 'ps_server_step', "Parameter server: the server's step", 6,
       ('recv into a buffer per worker, sum, sgd_update, send.',
        'recv into a buffer per worker, sum, sgd_update, send.',
        'recv into a buffer per worker, sum, sgd_update, send.')),
)

PREDICTIONS = ()

LESSON = Lesson(2, 'parameter server', 'ex02_parameter_server', 'notebooks/02_parameter_server.ipynb', EXERCISES, PREDICTIONS)
