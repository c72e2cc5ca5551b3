"""Synchronous parameter server: one rank keeps the model, the others compute gradients.

Roles (SPMD: every rank runs ``ps_step``; its rank decides its role): the *server* is the
last rank, ``N - 1``; ranks ``0 .. N - 2`` are *workers*, and worker ``w`` takes shard ``w``
of every batch. One step:

1. every worker runs forward and backward on its shard and sends its gradients (one flat
   message) to the server;
2. the server adds them up (each worker scaled its loss by its share of the samples, so the
   sum is the whole batch's gradient), steps its optimizer, and sends the new parameters back
   to every worker, which wait for them before their next step.

The server's link is the bottleneck: it receives N - 1 gradients and sends N - 1 copies of
the parameters through its one port, while each worker's link carries one of each. Messages
that cross the port at the same time share it (on an NVSwitch each gets a fair share of its
bandwidth and they end together) or queue for it (a port that carries one transfer at a
time); either way the port's busy time grows linearly with N (``ps.sharded`` spreads the
load over several servers).
Cost per step: compute + 2 (N - 1)(alpha + S / beta) on the server's link.
Li et al., "Scaling Distributed Machine Learning with the Parameter Server", OSDI 2014.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from mpgpu_edu.comm.base import Communicator
from mpgpu_edu.replica.data import Batch, shard
from mpgpu_edu.memory.measure import track_gradients, track_parameters
from mpgpu_edu.replica.reference import make_optimizer, named_params
from mpgpu_edu.replica.flat import flat_params, flatten_grads, grads_from_flat, load_flat_params
from mpgpu_edu.replica.loop import forward_backward, run_steps


def check_ps_world(world_size: int, n_servers: int = 1) -> None:
    """A parameter server needs at least one worker besides its server ranks."""
    if world_size < n_servers + 1:
        raise ValueError(f"a parameter server with {n_servers} server rank(s) needs at least "
                         f"{n_servers + 1} ranks (one worker), got world size {world_size}")


def worker_step(comm: Communicator, model: nn.Module, batch: Batch, server: int) -> torch.Tensor:
    """Gradients of my shard up to the server, new parameters back. Returns my loss share."""
    n_workers = comm.world_size - 1
    (x, y), share = shard(batch, comm.rank, n_workers, who="workers")
    loss = forward_backward(comm, model, x, y, share)
    comm.send(flatten_grads(list(model.parameters())), server)
    model.zero_grad(set_to_none=False)
    fresh = flat_params(model)
    comm.recv(fresh, server)
    load_flat_params(model, fresh)
    return loss * share


def server_step(comm: Communicator, model: nn.Module,
                optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """Receive every worker's gradients, sum them, step, send the parameters back."""
    workers = [r for r in range(comm.world_size) if r != comm.rank]
    params = list(model.parameters())
    buffers = [flat_params(model) for _ in workers]
    works = [comm.irecv(buf, w) for buf, w in zip(buffers, workers)]
    for work in works:
        work.wait()
    with comm.compute("optimizer", "sum and step"):
        grads_from_flat(params, torch.stack(buffers).sum(dim=0))
        optimizer.step()
    fresh = flat_params(model)
    sends = [comm.isend(fresh, w) for w in workers]
    for work in sends:
        work.wait()
    return fresh.new_zeros(())


def ps_step(comm: Communicator, model: nn.Module, optimizer: torch.optim.Optimizer | None,
            batch: Batch) -> torch.Tensor:
    """One synchronous step. ``optimizer`` is used on the server only (``None`` elsewhere).
    Returns this rank's share of the batch loss (0 on the server)."""
    server = comm.world_size - 1
    if comm.rank == server:
        return server_step(comm, model, optimizer)
    return worker_step(comm, model, batch, server)


def pull_parameters(comm: Communicator, model: nn.Module, server: int) -> None:
    """Workers start from the server's parameters (the server sends them to each)."""
    flat = flat_params(model)
    if comm.rank == server:
        for w in range(comm.world_size):
            if w != server:
                comm.send(flat, w)
    else:
        comm.recv(flat, server)
        load_flat_params(model, flat)


def train_ps(comm: Communicator, model_fn: Callable[[], nn.Module], batches: Sequence[Batch],
             optimizer: str = "sgd", lr: float = 0.05, steps: int | None = None) -> dict:
    """Train with ``ps_step``: the server holds the optimizer (and its state), the workers a
    replica each. Returns ``{"params", "losses"}``, the same on every rank."""
    check_ps_world(comm.world_size)
    steps = len(batches) if steps is None else steps
    server = comm.world_size - 1
    model = model_fn().to(comm.device)
    pull_parameters(comm, model, server)
    opt = make_optimizer(optimizer, model.parameters(), lr) if comm.rank == server else None
    track_parameters(comm, model)
    track_gradients(comm, model)
    losses = run_steps(comm, batches, steps, lambda batch: ps_step(comm, model, opt, batch), opt)
    return {"params": named_params(model), "losses": losses}
