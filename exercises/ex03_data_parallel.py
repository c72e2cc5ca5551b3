"""Lesson 03 exercises: data parallel training (DDP) piece by piece.

Every rank holds a replica of the model and trains on its own slice of the batch; averaging
the gradients makes every replica take the same step. Here you may use the package's
collectives (``mpgpu_edu.collectives.all_reduce``): lesson 01 built them.
The function just below is solved for you: read it first.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from mpgpu_edu.collectives import all_reduce, broadcast
from mpgpu_edu.comm import Communicator


# ---- worked example (solved, not graded) ---------------------------------------------------

def local_batch(comm: Communicator, batch: torch.Tensor) -> torch.Tensor:
    """This rank's slice of a global batch: the ``rank``-th of ``world_size`` nearly equal
    parts along dimension 0 (``torch.tensor_split``), so every sample is used exactly once.

    The gradient of a mean loss over the whole batch is the mean of the slices' gradients
    when the slices are equal, which is why averaging gradients reproduces one device."""
    return torch.tensor_split(batch, comm.world_size)[comm.rank]


class DDPReplica(Protocol):
    """What ``wrap_ddp`` returns (any class with these two methods will do)."""

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor: ...

    def finish(self) -> None: ...


# ---- exercises ------------------------------------------------------------------------------

def average_gradients(comm: Communicator, model: nn.Module) -> None:
    """After ``loss.backward()``: replace every parameter's ``.grad`` by the mean of that
    gradient over all ranks, in place, so that every replica takes the same optimizer step.

    Every parameter of ``model`` has a gradient. Cost: one all-reduce per parameter, about
    2(N - 1)/N of the model's bytes sent by every rank with the ring.
    """
    # Exercise 3.1 (about 2 lines). mp.hint("3.1") when stuck.
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
    # Exercise 3.2 (about 12 lines). mp.hint("3.2") when stuck.
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
    # Exercise 3.3 (about 11 lines). mp.hint("3.3") when stuck.
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
    # Exercise 3.4 (about 7 lines). mp.hint("3.4") when stuck.
    raise NotImplementedError("Exercise 3.4: adam_memory (notebooks/03_data_parallel.ipynb)")


def wrap_ddp(comm: Communicator, module: nn.Module, bucket_cap_bytes: int) -> DDPReplica:
    """Make ``module`` this rank's DDP replica and return the wrapper, an object of a class
    of your own (write it inside this function) with two methods:

    - ``wrapper(*inputs)`` runs ``module(*inputs)``;
    - ``wrapper.finish()``, called after each ``loss.backward()`` and before the optimizer
      step, returns once every parameter's ``.grad`` holds the mean of that gradient over
      all ranks.

    Contract, as ``torch.nn.parallel.DistributedDataParallel`` keeps it:

    - when ``wrap_ddp`` returns, every rank's parameters are rank 0's: one broadcast of
      all of them as one flat tensor, at construction only (never one per parameter);
    - buckets: the parameters, taken in *reverse* ``module.parameters()`` order, are cut
      into consecutive buckets; a bucket takes parameters until the next one would take its
      gradients over ``bucket_cap_bytes`` (a larger parameter gets a bucket of its own), as
      ``make_buckets`` does;
    - the moment backward has produced the last gradient of a bucket, that bucket's
      gradients, as one flat tensor, start their all-reduce (mean, the package's
      ``all_reduce``) on the communication stream, and backward goes on meanwhile: one
      all-reduce per bucket per step, buckets started in order;
    - every backward of every step works the same way: ``finish`` leaves the wrapper ready
      for the next one. Every parameter has ``requires_grad`` and takes part in the loss.

    Cost: the broadcast once; per step one all-reduce per bucket, 2(N - 1)/N of the
    gradients' bytes sent by every rank, hidden under backward except what the last bucket
    (the first layers) leaves exposed. Li et al., VLDB 2020.
    """
    # Exercise 3.5 (about 36 lines). mp.hint("3.5") when stuck.
    raise NotImplementedError("Exercise 3.5: wrap_ddp (notebooks/03_data_parallel.ipynb)")
