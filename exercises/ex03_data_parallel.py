"""Lesson 03 exercises: data parallel training (DDP) piece by piece.

Every rank holds a replica of the model and trains on its own slice of the batch; averaging
the gradients makes every replica take the same step. Here you may use the package's
collectives (``mpgpu_edu.collectives.all_reduce``): lesson 01 built them.
The function just below is solved for you: read it first.
"""

from __future__ import annotations

import torch
from torch import nn

from mpgpu_edu.collectives import all_reduce
from mpgpu_edu.comm import Communicator


# ---- worked example (solved, not graded) ---------------------------------------------------

def local_batch(comm: Communicator, batch: torch.Tensor) -> torch.Tensor:
    """This rank's slice of a global batch: the ``rank``-th of ``world_size`` nearly equal
    parts along dimension 0 (``torch.tensor_split``), so every sample is used exactly once.

    The gradient of a mean loss over the whole batch is the mean of the slices' gradients
    when the slices are equal, which is why averaging gradients reproduces one device."""
    return torch.tensor_split(batch, comm.world_size)[comm.rank]


# ---- exercises ------------------------------------------------------------------------------

def average_gradients(comm: Communicator, model: nn.Module) -> None:
    """After ``loss.backward()``: replace every parameter's ``.grad`` by the mean of that
    gradient over all ranks, in place, so that every replica takes the same optimizer step.

    Every parameter of ``model`` has a gradient. Cost: one all-reduce per parameter, about
    2(N - 1)/N of the model's bytes sent by every rank with the ring.
    """
    # Exercise 3.1 (about 2 lines). Hint: all_reduce(comm, p.grad, op='mean') for each parameter.
    raise NotImplementedError("Exercise 3.1: average_gradients (notebooks/03_data_parallel.ipynb)")


def make_buckets(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Group parameters into buckets for all-reduce, as DDP does: ``sizes[i]`` is the
    gradient size in bytes of parameter i (in ``model.parameters()`` order). Return lists
    of parameter indices.

    Backward produces gradients from the last parameter to the first, so walk the
    parameters in *reverse* order and fill a bucket until the next parameter would take it
    over ``bucket_bytes``; then start a new bucket. A parameter larger than ``bucket_bytes``
    gets a bucket of its own. Do not change ``sizes``.

    >>> make_buckets([4, 4, 4, 8], bucket_bytes=8)
    [[3], [2, 1], [0]]
    """
    # Exercise 3.2 (about 12 lines). Hint: walk reversed(range(len(sizes))); close a full bucket.
    raise NotImplementedError("Exercise 3.2: make_buckets (notebooks/03_data_parallel.ipynb)")


def backward_with_overlap(comm: Communicator, model: nn.Module, loss: torch.Tensor) -> None:
    """Run ``loss.backward()`` and average every gradient over the ranks (as
    ``average_gradients`` does) *while* backward is still running: start each parameter's
    all-reduce on the communication stream (``comm.run_async``) as soon as its gradient is
    ready (``param.register_post_accumulate_grad_hook``). Wait for all of them before
    returning, and remove the hooks, so a later backward triggers no communication.

    Cost: the all-reduces of the last layers hide behind the backward of the first ones;
    only what is left after backward ends adds to the step time.
    """
    # Exercise 3.3 (about 11 lines). Hint: p.register_post_accumulate_grad_hook + comm.run_async.
    raise NotImplementedError("Exercise 3.3: backward_with_overlap (notebooks/03_data_parallel.ipynb)")


def adam_memory(model: nn.Module, precision: str = "fp32") -> dict[str, int]:
    """Bytes that training ``model`` with Adam holds, by category: ``{"parameters": ...,
    "gradients": ..., "optimizer": ...}``. Activations are not counted.

    ``precision="fp32"``: 4 B per weight, 4 B per gradient, 8 B of optimizer state (two
    moments). ``"mixed"``: 2 B weights and gradients, 12 B of fp32 optimizer state (master
    copy + two moments). Frozen parameters (``requires_grad=False``) hold their weights
    only: no gradient, no optimizer state. Raise ``ValueError`` for another precision.
    Works for models on the meta device (use ``numel()``, never the data).
    """
    # Exercise 3.4 (about 7 lines). Hint: sum p.numel(); frozen: no gradient, no optimizer state.
    raise NotImplementedError("Exercise 3.4: adam_memory (notebooks/03_data_parallel.ipynb)")
