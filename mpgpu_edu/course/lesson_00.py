"""Lesson 00: welcome: devices."""

from __future__ import annotations

from mpgpu_edu.course._types import Lesson, ex

EXERCISES = (
    ex('0.1', 'visible_devices', 'CUDA_VISIBLE_DEVICES: logical -> physical', 5,
       ('read the leading digits; stop at the first bad entry.',
        'read the leading digits; stop at the first bad entry.',
        'read the leading digits; stop at the first bad entry.')),
    ex('0.2', 'data_parallel_device_ids', 'The device_ids question', 3,
       ('device_ids are positions in visible: visible.index(gpu).',
        'device_ids are positions in visible: visible.index(gpu).',
        'device_ids are positions in visible: visible.index(gpu).')),
)

PREDICTIONS = ()

LESSON = Lesson(0, 'welcome: devices', 'ex00_devices', 'notebooks/00_welcome.ipynb', EXERCISES, PREDICTIONS)
