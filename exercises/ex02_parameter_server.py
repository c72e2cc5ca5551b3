"""Lesson 02 exercises: a parameter server, one training step at a time.

One rank is the server (``server``, rank 0 by default); every other rank is a worker. A step:
each worker sends its gradient to the server; the server averages the gradients, updates the
parameters, and sends them back. Parameters and gradients are flat 1-D tensors here, so the
step is only about who sends what to whom. The function just below is solved for you.
"""

from __future__ import annotations

import torch

from mpgpu_edu.comm import Communicator


# ---- worked example (solved, not graded) ---------------------------------------------------

def sgd_update(params: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
    """Plain SGD, in place: ``params <- params - lr * grad``. No communication: this is
    what the server does once it has the averaged gradient."""
    params.sub_(grad, alpha=lr)


# ---- exercises ------------------------------------------------------------------------------

def ps_worker_step(comm: Communicator, params: torch.Tensor, grad: torch.Tensor,
                   server: int = 0) -> None:
    """One step of a worker: send this rank's gradient ``grad`` to rank ``server`` (tag 0),
    then receive the updated parameters from it (tag 0) into ``params``, in place.

    A worker talks to the server only. Cost: one message of S bytes each way.
    """
    # Exercise 2.1 (about 2 lines). Hint: comm.send the gradient, then comm.recv into params.
    raise NotImplementedError("Exercise 2.1: ps_worker_step (notebooks/02_parameter_server.ipynb)")


def ps_server_step(comm: Communicator, params: torch.Tensor, lr: float) -> None:
    """One step of the server (this rank): receive one gradient (tag 0) from every other
    rank, average them, apply ``sgd_update`` with ``lr`` to ``params`` (in place), then send
    the updated ``params`` (tag 0) to every other rank. The server computes no gradient of
    its own: the average is over the N - 1 workers.

    Cost: the server's link carries (N - 1) S bytes in and (N - 1) S out, one message at
    a time: 2(N - 1)(alpha + S / beta). That single link is the bottleneck as N grows.
    """
    # Exercise 2.2 (about 9 lines). Hint: recv into a buffer per worker, sum, sgd_update, send.
    raise NotImplementedError("Exercise 2.2: ps_server_step (notebooks/02_parameter_server.ipynb)")
