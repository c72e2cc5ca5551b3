"""Lesson 04 exercises: pipeline parallelism, from the split to the schedule to the executor.

A pipeline splits the layers into stages, stage p on device p, and streams microbatches
through them. A schedule is a value: for each device, the order of its ``Step``s, where
``Step(stage, microbatch, "F")`` is a forward and ``"B"`` a backward
(``mpgpu_edu.pipeline``). ``from_order`` places such orders on ticks, ``validate`` checks
them, ``render`` draws them. The function just below is solved for you: read it first.
"""

from __future__ import annotations

import torch
from torch import nn

from mpgpu_edu.comm import Communicator
from mpgpu_edu.pipeline import Step, recv_from, send_to


# ---- worked example (solved, not graded) ---------------------------------------------------

def naive_orders(n_stages: int) -> list[list[Step]]:
    """Plain model parallelism as a schedule: the whole batch is one microbatch (0); device
    p runs its forward, then, once the later stages are done, its backward.

    >>> from mpgpu_edu.pipeline import from_order
    >>> print(from_order("naive", naive_orders(2)))
    tick  | 0  1  2  3  |
    dev 0 | F0 .  .  B0 |
    dev 1 | .  F0 B0 .  |
    """
    return [[Step(p, 0, "F"), Step(p, 0, "B")] for p in range(n_stages)]


# ---- exercises ------------------------------------------------------------------------------

def balanced_boundaries(costs: list[float], n_stages: int) -> list[int]:
    """Split layers with costs ``costs`` (in model order) into ``n_stages`` contiguous,
    non-empty stages so that the most expensive stage is as cheap as possible. Return the
    boundaries: the index of the first layer of every stage after the first (``n_stages - 1``
    increasing numbers in ``1 .. len(costs) - 1``), as ``partition_by_list`` takes them.

    Raise ``ValueError`` when ``n_stages`` is below 1 or above ``len(costs)``. Do not
    change ``costs``.

    >>> balanced_boundaries([3, 1, 1, 1, 2], 2)
    [2]
    """
    # Exercise 4.1 (about 20 lines). Hint: DP: best[k][j] = cheapest max for j layers in k stages.
    raise NotImplementedError("Exercise 4.1: balanced_boundaries (notebooks/04_pipeline.ipynb)")


def gpipe_orders(n_stages: int, n_microbatches: int) -> list[list[Step]]:
    """The GPipe schedule as each device's step order: device p runs the forwards of
    microbatches 0 .. M - 1 on stage p, then their backwards in the same order 0 .. M - 1.

    ``from_order("gpipe", gpipe_orders(P, M))`` then takes 2(M + P - 1) ticks, and stage 0
    holds all M microbatches' activations when it turns from forward to backward.
    """
    # Exercise 4.2 (about 3 lines). Hint: all F steps in microbatch order, then all B steps.
    raise NotImplementedError("Exercise 4.2: gpipe_orders (notebooks/04_pipeline.ipynb)")


def one_f_one_b_orders(n_stages: int, n_microbatches: int) -> list[list[Step]]:
    """The 1F1B schedule (PipeDream-Flush) as each device's step order: stage p runs
    ``min(P - 1 - p, M)`` warm-up forwards, then alternates one forward and one backward
    (backwards in microbatch order 0, 1, ...), then runs the backwards that are left.

    Same makespan as GPipe, 2(M + P - 1) ticks, but stage p never holds more than
    ``min(P - p, M)`` microbatches' activations.
    """
    # Exercise 4.3 (about 8 lines). Hint: P - 1 - p warm-up forwards, then pairs of F and B.
    raise NotImplementedError("Exercise 4.3: one_f_one_b_orders (notebooks/04_pipeline.ipynb)")


def pipeline_forward_step(comm: Communicator, stage: nn.Module, step: Step, n_stages: int,
                          x: torch.Tensor | None, in_shape: tuple[int, ...]) -> torch.Tensor:
    """Run one forward ``step`` of a pipeline on this rank (rank p runs stage p) and return
    the stage's output, still attached to the autograd graph (a backward step needs it).

    1. Input: on stage 0 it is ``x`` (the microbatch); on later stages receive a float32
       activation of shape ``in_shape`` from ``recv_from(step, n_stages)``.
    2. Forward: ``stage(input)`` inside ``with comm.compute("forward", ...)`` so the
       simulator times it.
    3. Output: unless this is the last stage, send the output (detached) to
       ``send_to(step, n_stages)``.

    Every message uses ``tag=step.microbatch``, so microbatches cannot be mixed up.
    """
    # Exercise 4.4 (about 10 lines). Hint: recv_from / send_to(step, n_stages); tag=microbatch.
    raise NotImplementedError("Exercise 4.4: pipeline_forward_step (notebooks/04_pipeline.ipynb)")
