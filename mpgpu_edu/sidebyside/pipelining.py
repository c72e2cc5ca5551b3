"""The course's 1F1B executor against ``torch.distributed.pipelining``, on gloo processes.

``compare_pipelining(execute)`` splits one model into as many stages as there are ranks
(``partition_balanced``, the same split for both) and trains it three ways on the same
batches, steps interleaved (``result.take_turns``): on one device (rank 0, the whole batch),
with ``execute`` (exercise 4.5's contract) running the course's ``one_f_one_b`` schedule,
and with torch's ``PipelineStage`` driven by ``Schedule1F1B``.

The loss convention is the mean over microbatches: ours scores each microbatch with the mean
squared error and divides by M; torch's schedule scores each with the same loss and divides
the gradients by M at the end (``scale_grads=True``, its default). With M equal microbatches
that is the whole batch's mean loss, so both match one device.

What torch's pipelining does that ours does not: it learns the shapes of what crosses each cut
at the first step (ours is told them), posts a send together with the next receive
(``batch_isend_irecv``), keeps its own receive buffers, and offers many schedules (interleaved,
zero bubble) under one ``step(x)``. What is the same: stages of consecutive layers, one per
rank, 1F1B's order (warm-up forwards, then one forward one backward, then the backwards), an
activation forward and a gradient back per microbatch and cut.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from mpgpu_edu.comm import Communicator, launch
from mpgpu_edu.replica.data import Batch, loss_fn, make_batches, make_mlp
from mpgpu_edu.pipeline import one_f_one_b, partition_balanced, split_module
from mpgpu_edu.pipeline.executor import split_batch, stage_inputs_like
from mpgpu_edu.replica.reference import batch_for_step, make_optimizer
from mpgpu_edu.sidebyside.ddp import label_of, one_device_steps, plain
from mpgpu_edu.sidebyside.result import SideBySide, from_ranks, take_turns

Executor = Callable[..., Any]  # exercise 4.5's execute_schedule

SIZES = (64, 256, 256, 256, 8)
BATCH = 64
MICROBATCHES = 4
STEPS = 8
LR = 0.05
CONVENTION = ("the mean over microbatches of each microbatch's mean squared error (M equal "
              "microbatches: the whole batch's mean loss)")


def stages_of(model: nn.Sequential, n_stages: int) -> list[nn.Sequential]:
    """``model`` cut into ``n_stages`` stages balanced by parameters."""
    return split_module(model, partition_balanced(model, n_stages))


def ours_steps(comm: Communicator, execute: Executor, model: nn.Sequential,
               batches: Sequence[Batch], n_microbatches: int, optimizer: str,
               lr: float) -> Callable[[int], float | None]:
    """Step k on this rank's stage with ``execute`` running 1F1B; the loss on the last
    stage, None elsewhere."""
    rank, n_stages = comm.rank, comm.world_size
    stages = stages_of(model, n_stages)
    schedule = one_f_one_b(n_stages, n_microbatches)
    opt = make_optimizer(optimizer, stages[rank].parameters(), lr)
    last = rank == n_stages - 1
    x0 = split_batch(batches[0][0], n_microbatches)
    shapes = [tuple(t.shape) for t in stage_inputs_like(stages[:rank], x0)] if rank else None

    def step(k: int) -> float | None:
        x, y = batch_for_step(batches, k)
        opt.zero_grad()
        loss = execute(comm, schedule, stages[rank],
                       split_batch(x, n_microbatches) if rank == 0 else None,
                       split_batch(y, n_microbatches) if last else None, shapes, loss_fn)
        opt.step()
        return float(loss) if last else None

    return step


def torch_steps(comm: Communicator, model: nn.Sequential, batches: Sequence[Batch],
                n_microbatches: int, optimizer: str, lr: float) -> Callable[[int], float | None]:
    """Step k on this rank's stage with ``PipelineStage`` and ``Schedule1F1B``; the mean of
    the microbatches' losses on the last stage, None elsewhere."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    rank, n_stages = comm.rank, comm.world_size
    module = stages_of(model, n_stages)[rank]
    stage = PipelineStage(module, rank, n_stages, comm.device)
    schedule = Schedule1F1B(stage, n_microbatches, loss_fn=loss_fn)
    opt = make_optimizer(optimizer, module.parameters(), lr)
    last = rank == n_stages - 1

    def step(k: int) -> float | None:
        x, y = batch_for_step(batches, k)
        opt.zero_grad()
        losses: list[torch.Tensor] = []
        if rank == 0:
            schedule.step(x)
        elif last:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        opt.step()
        return sum(loss.item() for loss in losses) / n_microbatches if last else None

    return step


def pipelining_side_by_side(comm: Communicator, execute: Executor,
                            model_fn: Callable[[], nn.Sequential], batches: Sequence[Batch],
                            n_microbatches: int, optimizer: str, lr: float) -> dict:
    """SPMD, on gloo: one device (rank 0), ``execute`` and torch's ``Schedule1F1B``, step by
    step (``take_turns``). Returns this rank's losses and seconds per step."""
    runs = {"one device": (one_device_steps(model_fn, batches, optimizer, lr)
                           if comm.rank == 0 else None),
            "ours": ours_steps(comm, execute, model_fn(), batches, n_microbatches, optimizer,
                               lr),
            "torch": torch_steps(comm, model_fn(), batches, n_microbatches, optimizer, lr)}
    return take_turns(runs, len(batches))


def compare_pipelining(execute: Executor | None = None, ranks: int = 2, steps: int = STEPS,
                       microbatches: int = MICROBATCHES, sizes: Sequence[int] = SIZES,
                       batch: int = BATCH, optimizer: str = "sgd", lr: float = LR,
                       timeout: float = 120.0) -> SideBySide:
    """Train ``make_mlp(sizes)`` cut into ``ranks`` stages (one per gloo process) for
    ``steps`` steps of ``batch`` samples in ``microbatches`` microbatches: with ``execute``
    (exercise 4.5's ``execute_schedule``, or ``mp.yours``'s choice; None: the package's
    executor, ``lessons.pipeline.reference_executor``) running ``one_f_one_b``, with torch's
    ``PipelineStage`` + ``Schedule1F1B``, and on one device. ``batch`` must split into equal
    microbatches. Returns the losses and step times of all three (``SideBySide``)."""
    if ranks < 2 or batch % microbatches or microbatches < 1:
        raise ValueError(f"compare_pipelining needs 2 or more ranks and a batch that splits "
                         f"into equal microbatches; got {ranks} ranks and a batch of {batch} "
                         f"in {microbatches} microbatches")
    label = "the package's executor" if execute is None else label_of(execute)
    if execute is None:
        from mpgpu_edu.lessons.pipeline import reference_executor as execute
    model_fn = functools.partial(make_mlp, tuple(sizes))
    _check_stages(model_fn(), ranks)
    batches = make_batches(steps, batch, sizes[0], sizes[-1])
    run = launch(pipelining_side_by_side, ranks, plain(execute), model_fn, batches,
                 microbatches, optimizer, lr, backend="gloo", timeout=timeout)
    return from_ranks(
        run.results,
        title=f"1F1B on {ranks} gloo processes: {label} against torch.distributed.pipelining",
        setup=(f"MLP {'-'.join(map(str, sizes))} in {ranks} stages, batch {batch} in "
               f"{microbatches} microbatches, {steps} steps, {optimizer} lr {lr}"),
        convention=CONVENTION, ours=label, torch_label="torch PipelineStage + Schedule1F1B",
        losses_of=lambda per_rank, name: per_rank[-1]["losses"][name])  # the last stage's


def _check_stages(model: nn.Sequential, ranks: int) -> None:
    for p, stage in enumerate(stages_of(model, ranks)):
        if not any(True for _ in stage.parameters()):
            raise ValueError(f"the model cut into {ranks} stages leaves stage {p} without "
                             "parameters: use fewer ranks or more layers (sizes=)")
