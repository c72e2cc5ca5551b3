"""``nn.DataParallel``, simulated: one process drives every device, and device 0 does the rest.

What ``torch.nn.DataParallel(model)(x)`` does on every step, written out as messages so that
its cost shows on the timeline (here rank 0 plays the one Python process and its device 0):

1. *replicate*: device 0 copies the parameters to every other device (a broadcast), every
   step, because only device 0's copy is ever updated;
2. *scatter*: device 0 splits the batch and sends each device its shard;
3. every device runs the forward pass of its replica on its shard;
4. *gather*: the outputs go back to device 0, which computes the loss on the whole batch;
5. backward: the gradient of each output goes back to its device, every device runs its
   backward, and the parameter gradients are summed on device 0 (a reduce);
6. device 0 steps the optimizer.

Device 0 receives every output and every gradient, computes the loss and the optimizer step,
and holds the optimizer state, the gathered outputs and their gradients: it is busier and
fuller than the others, and its links carry N - 1 times the traffic. ``DistributedDataParallel``
(``mpgpu_edu.dp.ddp``) has no such device: every rank is alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from mpgpu_edu.collectives import broadcast, reduce
from mpgpu_edu.comm.base import Communicator
from mpgpu_edu.replica.data import Batch, loss_fn, shard
from mpgpu_edu.memory.measure import (saved_activations, track_gradients, track_optimizer_state,
                                      track_parameters)
from mpgpu_edu.replica.reference import batch_for_step, make_optimizer, named_params
from mpgpu_edu.replica.flat import flat_params, flatten_grads, load_flat_params, unflatten_grads

MAIN = 0  # the device that runs the process: nn.DataParallel's output_device


def replicate(comm: Communicator, model: nn.Module) -> None:
    """Step 1: device 0's parameters into every replica (a broadcast of all of them)."""
    flat = flat_params(model)
    broadcast(comm, flat, root=MAIN)
    if comm.rank != MAIN:
        load_flat_params(model, flat)


def scatter_inputs(comm: Communicator, batch: Batch) -> torch.Tensor:
    """Step 2: device 0 sends every other device its shard of the inputs. The other ranks
    read only the batch's shape, to know what they will receive."""

    def inputs_of(rank: int) -> torch.Tensor:
        (x, _), _ = shard(batch, rank, comm.world_size)
        return x

    if comm.rank == MAIN:
        for peer in range(comm.world_size):
            if peer != MAIN:
                comm.send(inputs_of(peer).contiguous(), peer)
        return inputs_of(MAIN)
    mine = torch.empty_like(inputs_of(comm.rank))
    comm.recv(mine, MAIN)
    return mine


def loss_on_main(comm: Communicator, out: torch.Tensor, y: torch.Tensor) -> tuple[
        torch.Tensor, list[torch.Tensor]]:
    """Steps 4-5 on device 0: gather the outputs, compute the loss of the whole batch, and
    return it with the gradient of every device's output."""
    outs = [out] + [out.new_empty(len(t), out.shape[1]) for t in
                    torch.tensor_split(y, comm.world_size)[1:]]
    for peer in range(1, comm.world_size):
        comm.recv(outs[peer], peer)
        outs[peer].requires_grad_()
    with saved_activations(comm, "gathered outputs") as acts:
        with comm.compute("forward", "loss"):
            loss = loss_fn(torch.cat(outs), y)
        with comm.compute("backward", "loss"):
            grads = torch.autograd.grad(loss, outs)
    acts.free()
    return loss.detach(), list(grads)


def dataparallel_step(comm: Communicator, model: nn.Module,
                      optimizer: torch.optim.Optimizer | None, batch: Batch) -> torch.Tensor:
    """One ``nn.DataParallel`` training step (see the module's docstring). ``model`` is the
    master copy on device 0 and a replica elsewhere; only device 0 has an ``optimizer``.
    Returns the whole batch's loss on device 0 (0 elsewhere).

    Cost per step: a broadcast of the parameters, N - 1 input and output messages through
    device 0, a reduce of the gradients into device 0; device 0 alone computes the loss and
    the update."""
    replicate(comm, model)
    x = scatter_inputs(comm, batch)
    with saved_activations(comm, "activations") as acts:
        with comm.compute("forward"):
            out = model(x)
        if comm.rank == MAIN:
            loss, grads = loss_on_main(comm, out, batch[1])
            for peer in range(1, comm.world_size):
                comm.send(grads[peer], peer)
            grad_out = grads[MAIN]
        else:
            comm.send(out.detach(), MAIN)
            loss, grad_out = out.new_zeros(()), torch.empty_like(out)
            comm.recv(grad_out, MAIN)
        with comm.compute("backward"):
            out.backward(grad_out)
    acts.free()
    flat = flatten_grads(model.parameters())
    reduce(comm, flat, root=MAIN, op="sum")
    if comm.rank == MAIN:
        unflatten_grads(flat, model.parameters())
        with comm.compute("optimizer"):
            optimizer.step()
    model.zero_grad(set_to_none=False)
    return loss


def train_dataparallel(comm: Communicator, model_fn: Callable[[], nn.Module],
                       batches: Sequence[Batch], optimizer: str = "sgd", lr: float = 0.05,
                       steps: int | None = None) -> dict:
    """Train with ``dataparallel_step``. Device 0 holds the master model and the optimizer;
    every device records its parameters and gradients, device 0 also the optimizer state.

    Returns ``{"params", "losses"}``: the final parameters (copied to every device once
    more at the end, so every rank returns them) and device 0's losses (zeros elsewhere)."""
    steps = len(batches) if steps is None else steps
    model = model_fn()
    opt = make_optimizer(optimizer, model.parameters(), lr) if comm.rank == MAIN else None
    track_parameters(comm, model)
    track_gradients(comm, model)
    state = None
    losses = []
    for step in range(steps):
        losses.append(float(dataparallel_step(comm, model, opt, batch_for_step(batches, step))))
        if opt is not None and state is None:
            state = track_optimizer_state(comm, opt)
    replicate(comm, model)
    return {"params": named_params(model), "losses": losses}
