"""Lesson 02 exercises: a parameter server, both sides, then sharded over every rank.

In this course the server is the LAST rank, ``N - 1``; ranks ``0 .. N - 2`` are workers. A
step: each worker sends its gradient to the server; the server averages the gradients,
updates the parameters, and sends them back. Parameters and gradients are flat 1-D tensors
here, so the exercises are only about who sends what to whom (the checks also train small
models with them and compare with one device). The function just below is solved for you.
"""

from __future__ import annotations

import torch

from mpgpu_edu.comm import Communicator


# ---- worked example (solved, not graded) ---------------------------------------------------

def sgd_update(params: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
    """Plain SGD, in place: ``params <- params - lr * grad``. No communication: this is
    what the server does once it has the averaged gradient."""
    params.sub_(grad, alpha=lr)


# ---- warm-ups -----------------------------------------------------------------------------------

def ps_worker_step(comm: Communicator, params: torch.Tensor, grad: torch.Tensor,
                   server: int) -> None:
    """One step of a worker: send this rank's gradient ``grad`` to rank ``server`` (tag 0),
    then receive the updated parameters from it (tag 0) into ``params``, in place. ``grad``
    is the caller's: send it, leave it as it is. Every message has arrived or left when the
    function returns.

    A worker talks to the server only. Cost: one message of S bytes each way.
    """
    ### BEGIN SOLUTION 2.1
    comm.send(grad, server)
    comm.recv(params, server)
    ### END SOLUTION


def ps_server_step(comm: Communicator, params: torch.Tensor, lr: float) -> None:
    """One step of the server (this rank): receive one gradient (tag 0) from every other
    rank, average them, apply ``sgd_update`` with ``lr`` to ``params`` (in place, once,
    after the last gradient is in), then send the updated ``params`` (tag 0) to every other
    rank. The server computes no gradient of its own: the average is over the N - 1 workers.
    Every message has arrived or left when the function returns.

    Cost: the server's link carries (N - 1) S bytes in and (N - 1) S out, one message at
    a time: 2(N - 1)(alpha + S / beta). That single link is the bottleneck as N grows.
    """
    ### BEGIN SOLUTION 2.2
    workers = [r for r in range(comm.world_size) if r != comm.rank]
    total = torch.zeros_like(params)
    buffer = torch.empty_like(params)
    for worker in workers:
        comm.recv(buffer, worker)
        total.add_(buffer)
    sgd_update(params, total / len(workers), lr)
    for worker in workers:
        comm.send(params, worker)
    ### END SOLUTION


# ---- capstones ----------------------------------------------------------------------------------

def ps_server_loop(comm: Communicator, params: torch.Tensor, steps: int, lr: float) -> None:
    """The server (this rank, the last one) for ``steps`` synchronous steps. In each step
    every other rank, a worker, sends one gradient (tag 0) and then waits for the
    parameters (tag 0). The server takes the gradients *in the order they arrive*
    (``comm.recv_any``), so a slow worker never holds up a fast one's message; once it has
    one gradient from every worker, it applies ``sgd_update`` with their mean to ``params``
    (in place) and sends the new ``params`` to every worker.

    Invariant: no update before all N - 1 gradients of the step are in, so every worker
    starts every step from the same parameters and training equals one device's.
    Cost per step: the server's link carries (N - 1) S in and (N - 1) S out.
    """
    ### BEGIN SOLUTION 2.3
    workers = [r for r in range(comm.world_size) if r != comm.rank]
    buffer = torch.empty_like(params)
    for _step in range(steps):
        total = torch.zeros_like(params)
        waiting = list(workers)
        while waiting:
            # Each worker sends once per step and then blocks on its recv, so asking only
            # the workers still missing this step keeps steps apart.
            src = comm.recv_any(buffer, waiting)
            waiting.remove(src)
            total.add_(buffer)
        sgd_update(params, total / len(workers), lr)
        sends = [comm.isend(params, worker) for worker in workers]
        for work in sends:
            work.wait()
    ### END SOLUTION


def ps_sharded_step(comm: Communicator, params: torch.Tensor, grad: torch.Tensor,
                    lr: float) -> None:
    """One step of a parameter server sharded over every rank. Every rank is a worker (its
    own ``grad``) *and* the server of one shard: rank r owns shard r of the flat
    parameters, ``torch.tensor_split(params, N)[r]`` (sizes differ by one when N does not
    divide), and only rank r averages and updates it.

    On return ``params`` is ``params - lr * mean(grads over all N ranks)`` on every rank;
    ``grad`` is the caller's and stays as it was. Rank r updates its shard once, with
    ``sgd_update``, after every rank's shard r of the gradient is in.
    Traffic: rank r sends each other rank k only what k serves (shard k of r's gradient)
    and what k needs from r (r's updated shard), nothing else.
    Cost: each rank sends and receives (N - 1)/N of S twice, with every link busy at once:
    a reduce-scatter and an all-gather.
    """
    ### BEGIN SOLUTION 2.4
    n, me = comm.world_size, comm.rank
    others = [r for r in range(n) if r != me]
    grad_shards = torch.tensor_split(grad, n)
    param_shards = torch.tensor_split(params, n)  # views: receiving into them fills params
    inbox = {r: torch.empty_like(grad_shards[me]) for r in others}
    works = [comm.isend(grad_shards[r].contiguous(), r) for r in others]
    works += [comm.irecv(inbox[r], r) for r in others]
    for work in works:
        work.wait()
    total = grad_shards[me].clone()
    for r in others:
        total.add_(inbox[r])
    sgd_update(param_shards[me], total / n, lr)
    mine = param_shards[me].clone()
    works = [comm.isend(mine, r) for r in others]
    received = {r: torch.empty_like(param_shards[r]) for r in others}
    works += [comm.irecv(received[r], r) for r in others]
    for work in works:
        work.wait()
    for r in others:
        param_shards[r].copy_(received[r])
    ### END SOLUTION
