"""Sharded parameter server: K server ranks, each owning 1/K of the parameters.

With one server, every gradient and every parameter crosses the server's one link. Split the
flat parameter vector into K shards (``torch.tensor_split``) and give shard k to server k: a
worker sends shard k of its gradient to server k and gets shard k of the new parameters back
from it. Each server's link now carries 1/K of the bytes, so the K links work side by side.

Roles: the last ``n_servers`` ranks are servers (server k is rank ``N - K + k``); ranks
``0 .. N - K - 1`` are workers, and worker ``w`` takes shard ``w`` of every batch. A server
keeps only its shard of the parameters, with its own optimizer over it: SGD and Adam act
element by element, so K optimizers over K shards make exactly the update of one optimizer
over the whole model.
Cost per step on each server's link: 2 (N - K)(alpha + S / (K beta)).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from mpgpu_edu.comm.base import Communicator, nbytes_of
from mpgpu_edu.replica.data import Batch, shard
from mpgpu_edu.memory.measure import Tracked, track_gradients, track_parameters
from mpgpu_edu.ps.sync import check_ps_world
from mpgpu_edu.replica.reference import make_optimizer, named_params
from mpgpu_edu.replica.flat import flat_params, flatten_grads, load_flat_params
from mpgpu_edu.replica.loop import forward_backward, run_steps


def servers_of(world_size: int, n_servers: int) -> list[int]:
    """The server ranks: the last ``n_servers``."""
    return list(range(world_size - n_servers, world_size))


def worker_step_sharded(comm: Communicator, model: nn.Module, batch: Batch,
                        servers: Sequence[int]) -> torch.Tensor:
    """Gradient shard k to server k, parameter shard k back from it. Returns my loss share."""
    n_workers = comm.world_size - len(servers)
    (x, y), share = shard(batch, comm.rank, n_workers, who="workers")
    loss = forward_backward(comm, model, x, y, share)
    grads = torch.tensor_split(flatten_grads(list(model.parameters())), len(servers))
    sends = [comm.isend(g, s) for g, s in zip(grads, servers)]
    fresh = flat_params(model)
    pieces = torch.tensor_split(fresh, len(servers))  # views: receiving fills ``fresh``
    recvs = [comm.irecv(p, s) for p, s in zip(pieces, servers)]
    for work in sends + recvs:
        work.wait()
    model.zero_grad(set_to_none=False)
    load_flat_params(model, fresh)
    return loss * share


def server_step_sharded(comm: Communicator, shard_param: torch.Tensor,
                        optimizer: torch.optim.Optimizer, n_workers: int) -> torch.Tensor:
    """Sum my shard of every worker's gradient, step my shard, send it back to each."""
    workers = range(n_workers)
    buffers = [torch.empty_like(shard_param) for _ in workers]
    works = [comm.irecv(buf, w) for buf, w in zip(buffers, workers)]
    for work in works:
        work.wait()
    with comm.compute("optimizer", "sum and step"):
        shard_param.grad = torch.stack(buffers).sum(dim=0)
        optimizer.step()
    fresh = shard_param.detach()
    sends = [comm.isend(fresh, w) for w in workers]
    for work in sends:
        work.wait()
    return fresh.new_zeros(())


def ps_step_sharded(comm: Communicator, state: nn.Module | torch.Tensor,
                    optimizer: torch.optim.Optimizer | None, batch: Batch,
                    n_servers: int) -> torch.Tensor:
    """One step. ``state`` is a worker's model, or a server's shard (a flat leaf tensor)
    with its ``optimizer``. Returns this rank's share of the batch loss (0 on servers)."""
    servers = servers_of(comm.world_size, n_servers)
    if comm.rank in servers:
        return server_step_sharded(comm, state, optimizer, comm.world_size - n_servers)
    return worker_step_sharded(comm, state, batch, servers)


def train_ps_sharded(comm: Communicator, model_fn: Callable[[], nn.Module],
                     batches: Sequence[Batch], n_servers: int = 2, optimizer: str = "sgd",
                     lr: float = 0.05, steps: int | None = None) -> dict:
    """Train with ``ps_step_sharded``. Every rank builds the model from the same seed; a
    server keeps only its shard of it (and the optimizer state of that shard).

    Returns ``{"params", "losses"}`` on a worker (its replica, the same on every worker) and
    ``{"shard", "losses"}`` on a server: read a worker's result for the model."""
    check_ps_world(comm.world_size, n_servers)
    steps = len(batches) if steps is None else steps
    servers = servers_of(comm.world_size, n_servers)
    model = model_fn().to(comm.device)
    opt = None
    if comm.rank in servers:
        flat = torch.tensor_split(flat_params(model), n_servers)[servers.index(comm.rank)]
        state: nn.Module | torch.Tensor = flat.clone().requires_grad_()
        opt = make_optimizer(optimizer, [state], lr)
        Tracked(comm, "parameters", "shard", lambda: nbytes_of(state))
        Tracked(comm, "gradients", "shard", lambda: nbytes_of(state))
        del model
    else:
        state = model
        track_parameters(comm, model)
        track_gradients(comm, model)
    losses = run_steps(comm, batches, steps,
                       lambda batch: ps_step_sharded(comm, state, opt, batch, n_servers), opt)
    if comm.rank in servers:
        return {"shard": state.detach().clone(), "losses": losses}
    return {"params": named_params(state), "losses": losses}
