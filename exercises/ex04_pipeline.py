"""Lesson 04 exercises: pipeline parallelism, from the split to the schedule to the executor.

A pipeline splits the layers into stages, stage p on device p, and streams microbatches
through them. A schedule is a value: for each device, the order of its ``Step``s, where
``Step(stage, microbatch, "F")`` is a forward and ``"B"`` a backward
(``mpgpu_edu.pipeline``). ``from_order`` places such orders on ticks, ``validate`` checks
them, ``render`` draws them. The function just below is solved for you: read it first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from mpgpu_edu.comm import Communicator, Work
from mpgpu_edu.pipeline import Schedule, Step, recv_from, send_to, steps_of
from mpgpu_edu.pipeline.executor import message_tag

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


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
    """Split layers with costs ``costs`` (in model order; whole numbers or not, milliseconds
    say) into ``n_stages`` contiguous, non-empty stages so that the most expensive stage is
    as cheap as possible. Return the boundaries: the index of the first layer of every
    stage after the first (``n_stages - 1`` increasing numbers in ``1 .. len(costs) - 1``),
    as ``partition_by_list`` takes them.

    Raise ``ValueError`` when ``n_stages`` is below 1 or above ``len(costs)``. Do not
    change ``costs``.

    >>> balanced_boundaries([3, 1, 1, 1, 2], 2)
    [2]
    """
    # Exercise 4.1 (about 20 lines). mp.hint("4.1") when stuck.
    raise NotImplementedError("Exercise 4.1: balanced_boundaries (notebooks/04_pipeline.ipynb)")


def gpipe_orders(n_stages: int, n_microbatches: int) -> list[list[Step]]:
    """The GPipe schedule as each device's step order: device p runs the forwards of
    microbatches 0 .. M - 1 on stage p, then their backwards in the same order 0 .. M - 1.

    ``from_order("gpipe", gpipe_orders(P, M))`` then takes 2(M + P - 1) ticks, and stage 0
    holds all M microbatches' activations when it turns from forward to backward.
    """
    # Exercise 4.2 (about 3 lines). mp.hint("4.2") when stuck.
    raise NotImplementedError("Exercise 4.2: gpipe_orders (notebooks/04_pipeline.ipynb)")


def one_f_one_b_orders(n_stages: int, n_microbatches: int) -> list[list[Step]]:
    """The 1F1B schedule (PipeDream-Flush, Narayanan et al., 2021) as each device's step
    order: stage p runs ``min(P - 1 - p, M)`` warm-up forwards, then alternates one forward
    and one backward (backwards in microbatch order 0, 1, ...), then runs the backwards that
    are left.

    Same makespan as GPipe, 2(M + P - 1) ticks, but stage p never holds more than
    ``min(P - p, M)`` microbatches' activations.
    """
    # Exercise 4.3 (about 8 lines). mp.hint("4.3") when stuck.
    raise NotImplementedError("Exercise 4.3: one_f_one_b_orders (notebooks/04_pipeline.ipynb)")


def pipeline_forward_step(comm: Communicator, stage: nn.Module, step: Step, n_stages: int,
                          x: torch.Tensor | None, in_shape: tuple[int, ...]) -> torch.Tensor:
    """Run one forward ``step`` of a pipeline on this rank (rank p runs stage p) and return
    the stage's output, still attached to the autograd graph, so that a later backward step
    can compute the gradient of the stage's parameters *and* of its input (the gradient the
    previous stage waits for).

    - Input: on stage 0 it is ``x`` (the microbatch); a later stage receives a float32
      activation of shape ``in_shape`` from ``recv_from(step, n_stages)``, and that received
      tensor must collect a ``.grad`` when backward runs through this stage's output.
    - The stage's forward runs inside ``comm.compute("forward", step.token)`` (the simulator
      times it).
    - Unless this is the last stage, the output goes to ``send_to(step, n_stages)``; what
      crosses the wire is data only, never the graph.

    Every message is tagged ``message_tag(step)`` (``2 m`` for microbatch m's activation,
    ``2 m + 1`` for its gradient), so microbatches cannot be mixed up, and has left or
    arrived when the function returns (blocking ``send``/``recv``, or every work waited).
    """
    # Exercise 4.4 (about 11 lines). mp.hint("4.4") when stuck.
    raise NotImplementedError("Exercise 4.4: pipeline_forward_step (notebooks/04_pipeline.ipynb)")


def execute_schedule(comm: Communicator, schedule: Schedule, stage: nn.Module,
                     microbatches: Sequence[torch.Tensor] | None,
                     targets: Sequence[torch.Tensor] | None,
                     recv_shapes: Sequence[tuple[int, ...]] | None,
                     loss_fn: LossFn = nn.functional.mse_loss,
                     stage_seconds: tuple[float, float] | None = None) -> float | None:
    """Run this rank's steps of any ``schedule`` (P = ``schedule.n_stages`` stages, M =
    ``schedule.n_microbatches`` microbatches; rank p runs stage ``stage``, row p of the grid,
    in the order ``steps_of(schedule, p)`` gives) and add the gradients of one
    training step to ``stage``'s parameters' ``.grad`` (accumulated, as ``backward`` does:
    never zero them; the caller zeroes them when it wants and steps the optimizer after).
    Return the loss on the last stage, None elsewhere.

    - F(m): stage 0 reads ``microbatches[m]``; a later stage receives microbatch m's
      activation (float32, shape ``recv_shapes[m]``) from ``recv_from(step, P)``. The stage's
      output goes to ``send_to(step, P)``; on the last stage it is scored with
      ``loss_fn(output, targets[m])`` instead.
    - B(m): the last stage starts from its loss; another stage receives the gradient of its
      output from ``recv_from(step, P)``. Every stage but the first sends the gradient of its
      input to ``send_to(step, P)``.
    - The loss convention: the step's loss is the **mean over microbatches**,
      ``(1/M) * sum_m loss_fn(output_m, targets[m])``, and the gradients are its gradients,
      so that the pipeline trains exactly as one device that accumulates the same M
      microbatches (with microbatches of equal size, that is the whole batch's mean loss).
    - Memory: between F(m) and B(m) the stage keeps what B(m) needs (microbatch m's input and
      output), and nothing of them after B(m): not in a loop variable, nor in a send's Work or
      a ``.detach()`` (which shares its numbers' memory). A stage keeps alive as many
      microbatches as the schedule has in flight there (the check looks at the start of every
      F and B which tensors' memory is still alive). Each F and each B runs the stage's
      forward or backward once (no recomputation). The gradients sent back are the exception:
      nothing this stage does later tells it that the previous stage has received one (that
      stage may run its backwards in another order), so their Works are waited on at the end.
    - Messages: tag ``message_tag(step)``, as in 4.4. Under 1F1B two neighbouring stages
      send to each other at the same tick (stage p an activation to p + 1, stage p + 1 a
      gradient to p), each before it receives; and a schedule may have neighbours run their
      microbatches in different orders. So no send may block: ``comm.isend``, with each Work
      waited on (a Work holds its tensor until the message is delivered: let go of F(m)'s
      at B(m)). The forward runs in
      ``comm.compute("forward", step.token, seconds=...)`` and the backward in
      ``comm.compute("backward", ...)``, with ``stage_seconds = (forward_s, backward_s)`` as
      the seconds when given (a stand-in duration for the simulator's timeline).

    The calls: ``comm.recv(tensor, src, tag)`` fills ``tensor``; ``comm.isend(tensor, dst,
    tag)`` returns a Work (``.wait()``); ``with comm.compute(kind, label, seconds=None):``
    times a region. Cost per microbatch and cut: one activation message forward, one
    gradient message back.
    """
    # Exercise 4.5 (about 39 lines). mp.hint("4.5") when stuck.
    raise NotImplementedError("Exercise 4.5: execute_schedule (notebooks/04_pipeline.ipynb)")
