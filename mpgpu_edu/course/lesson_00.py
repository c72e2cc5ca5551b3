"""Lesson 00: welcome: devices."""

from __future__ import annotations

from mpgpu_edu.course._types import WARM_UP, Lesson, Prediction, ex

EXERCISES = (
    ex('0.1', 'visible_devices', 'CUDA_VISIBLE_DEVICES: logical -> physical', 5,
       ('CUDA reads the list once, left to right, and keeps what it reads until something '
        'stops it: the list is a prefix of the entries, not a filter over them.',
        'Handle the unset case first. Then walk the comma-separated entries in order and '
        'read the number at the start of each (sign included). Each entry has one of three '
        'fates: it ends the walk, it empties the whole answer, or it adds a GPU.',
        'if value is None: ...; devices = []; for entry in value.split(","): '
        'number = re.match(r"[+-]?[0-9]+", entry.strip()) (import re); which of: no '
        'number, a negative '
        'one, one >= n_physical, one already in devices, makes you break and which makes '
        'you return []? Otherwise devices.append(...).'),
       WARM_UP),
    ex('0.2', 'data_parallel_device_ids', 'The device_ids question', 3,
       ('device_ids count in the process\'s own numbering (cuda:0, cuda:1, ...), which is the '
        'order of the visible list, not nvidia-smi\'s numbers.',
        'One answer per requested GPU, in the order requested: where does that physical GPU '
        'sit in visible? A GPU that is not there cannot be used: raise.',
        'A list\'s .index(x) gives the position of x, and raises its own ValueError (about '
        'lists, not GPUs) when x is absent: test membership with `in` first and raise a '
        'ValueError that names the GPU and what is visible.'),
       WARM_UP),
)

PREDICTIONS = (
    Prediction(
        key="00.visible-order",
        question="A process starts with CUDA_VISIBLE_DEVICES=2,3 on a 4-GPU machine. Which "
                 "physical GPU is cuda:1 in that process?",
        choices=("GPU 1", "GPU 2", "GPU 3", "none: cuda:1 does not exist"),
        answer=2,
        why="CUDA numbers the listed GPUs cuda:0, cuda:1, ... in the order listed: cuda:0 is "
            "GPU 2 and cuda:1 is GPU 3. nvidia-smi keeps calling it GPU 3."),
    Prediction(
        key="00.workers-needed",
        question="One loader worker needs 512 ms to prepare a batch of 256 images; the GPU "
                 "trains on a batch in 73 ms. Workers prepare batches in parallel, each its "
                 "own. How many workers until the GPU is busy (idle under 10% after the "
                 "first batch)?",
        choices=("2-3", "4-5", "6-8", "more than 8"),
        answer=2,
        why="Each worker delivers a batch every 512 ms and the GPU takes one every 73 ms, so "
            "it needs 512 / 73 = 7 workers delivering at once: with 4 it still waits about "
            "40% of the time, from 7 on only for the very first batch. A GPU twice as fast "
            "would need twice the workers."),
)

LESSON = Lesson(0, 'welcome: devices', 'ex00_devices', 'notebooks/00_welcome.ipynb', EXERCISES,
                PREDICTIONS, drives_demos=("0.1", "0.2"))
