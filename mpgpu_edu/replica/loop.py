"""One rank's training work on its replica: forward and backward of a scaled loss, the
optimizer step, and the loop of steps every strategy's ``train_*`` runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from mpgpu_edu.collectives import all_reduce
from mpgpu_edu.comm.base import Communicator
from mpgpu_edu.replica.data import Batch, loss_fn
from mpgpu_edu.memory.measure import saved_activations, track_optimizer_state
from mpgpu_edu.replica.reference import batch_for_step


def forward_backward(comm: Communicator, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """Forward and backward of ``scale * loss`` on ``(x, y)``, timed and with its saved
    activations recorded; returns the (unscaled, detached) loss."""
    with saved_activations(comm, "activations") as acts:
        with comm.compute("forward"):
            loss = loss_fn(model(x), y)
        with comm.compute("backward"):
            (loss * scale).backward()
    acts.free()
    return loss.detach()


def optimizer_step(comm: Communicator, optimizer: torch.optim.Optimizer) -> None:
    """Apply the averaged gradients, then zero them (kept allocated, as DDP's buckets are)."""
    with comm.compute("optimizer"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)


def run_steps(comm: Communicator, batches: Sequence[Batch], steps: int,
              step: Callable[[Batch], torch.Tensor],
              optimizer: torch.optim.Optimizer | None) -> list[float]:
    """Run ``step`` on the batches of ``steps`` steps (moved to ``comm.device``), record the
    optimizer's state in ``comm.memory`` once its first step made it (``optimizer`` None: a
    rank without one), and return the whole batch's loss of every step: each rank's losses
    summed over ranks, once, at the end, so the list is the same on every rank."""
    tracked = None
    losses = []
    for i in range(steps):
        x, y = batch_for_step(batches, i)
        losses.append(step((x.to(comm.device), y.to(comm.device))))
        if optimizer is not None and tracked is None:
            tracked = track_optimizer_state(comm, optimizer)
    total = torch.stack(losses) if losses else torch.zeros(0)
    all_reduce(comm, total, "sum")
    return total.tolist()
