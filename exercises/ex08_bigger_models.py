"""Lesson 08 exercises: fitting bigger models.

A model too big for one device's memory needs its state split, not copied: ZeRO-3 (FSDP) keeps
1/N of every layer's parameters on each rank and gathers a layer only while it runs. Here you
may use the package's collectives (``mpgpu_edu.collectives.all_gather`` and
``reduce_scatter``): lesson 01 built them. The function just below is solved for you: read
it first.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn
from torch.func import functional_call

from mpgpu_edu.collectives import all_gather, reduce_scatter
from mpgpu_edu.comm import Communicator


# ---- worked example (solved, not graded) ---------------------------------------------------

def layer_views(layer: nn.Module, full: torch.Tensor) -> dict[str, torch.Tensor]:
    """The layer's parameters as views of ``full``, its parameters flattened one after the
    other in ``named_parameters()`` order: ``{"weight": ..., "bias": ...}``, ready for
    ``torch.func.functional_call(layer, views, (x,))``, which runs ``layer`` with these
    tensors in place of its own. Autograd follows the views back to ``full``, so a backward
    through them leaves the whole layer's gradient in ``full.grad``, one flat vector."""
    views, offset = {}, 0
    for name, param in layer.named_parameters():
        views[name] = full[offset: offset + param.numel()].view(param.shape)
        offset += param.numel()
    return views


class FSDPReplica(Protocol):
    """What ``wrap_fsdp`` returns (any class with these methods will do)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

    def finish(self) -> None: ...

    def parameters(self) -> Any: ...


# ---- exercises ------------------------------------------------------------------------------

def shard_of(flat: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s shard of the 1-D tensor ``flat``: pad ``flat`` with zeros at the end
    to the next multiple of ``world_size`` elements, cut it into ``world_size`` equal chunks,
    return chunk ``rank`` (a new tensor, not a view: the padded copy can be freed).

    Every shard has ceil(E / N) elements, so an all-gather of the shards (equal sizes, as it
    needs) gives back the padded vector, whose first E elements are ``flat``.

    >>> shard_of(torch.arange(5.0), 1, 2)
    tensor([3., 4., 0.])
    """
    # Exercise 8.1 (about 4 lines). mp.hint("8.1") when stuck.
    raise NotImplementedError("Exercise 8.1: shard_of (notebooks/08_bigger_models.ipynb)")


def interleaved_bubble_overhead(n_stages: int, n_microbatches: int, n_chunks: int) -> float:
    """The bubble of interleaved 1F1B as a share of the ideal compute time: P stages (devices),
    M microbatches, V model chunks per device, equal stages and free sends.

    Each chunk step does 1/V of a stage's work, so filling and draining the pipeline costs
    1/V of what it costs in 1F1B, whose overhead is (P-1)/M. The schedule runs microbatches in
    rounds of P: raise ``ValueError`` when M is not a multiple of P, or any argument is
    below 1.

    >>> interleaved_bubble_overhead(4, 8, 2)
    0.1875
    """
    # Exercise 8.2 (about 5 lines). mp.hint("8.2") when stuck.
    raise NotImplementedError("Exercise 8.2: interleaved_bubble_overhead (notebooks/08_bigger_models.ipynb)")


def wrap_fsdp(comm: Communicator, module: nn.Sequential, prefetch: bool = False) -> FSDPReplica:
    """Shard ``module`` over the ranks as ZeRO-3 / FSDP does and return this rank's replica,
    an object of a class of your own (write it inside this function) with three methods:

    - ``replica(x)`` runs the forward of ``module`` on ``x``, layer by layer;
    - ``replica.finish()``, called after ``loss.backward()`` and before the optimizer step,
      returns once every shard's ``.grad`` holds the mean over the ranks of that shard's
      gradient (added to what ``.grad`` held: gradients accumulate, as in torch);
    - ``replica.parameters()`` returns this rank's shards, the ``nn.Parameter``s a torch
      optimizer updates (one per layer that has parameters, in layer order).

    Contract:

    - shards: for every layer (child of ``module``) with parameters, flatten its parameters
      in ``named_parameters()`` order into one vector; this rank keeps
      ``shard_of(vector, comm.rank, comm.world_size)`` as an ``nn.Parameter`` and nothing
      else of the layer's parameters. Every rank passes the same ``module``; leave it as it is.
    - forward: just before a layer's forward, all-gather its shards (the package's
      ``all_gather``) into the full vector; run the layer with it (``layer_views``,
      ``functional_call``); keep nothing of the full vector after the layer's forward
      (autograd must not keep the weights either: keep the layer's input, say, and run its
      forward again in backward, or save the weights another way).
    - backward (``loss.backward()``): just before a layer's backward, all-gather its shards
      again; compute the layer's backward; reduce-scatter the full flat gradient, padded as
      the shards are, with ``op="mean"`` (the package's ``reduce_scatter``): the result is
      this rank's shard of the mean gradient. One all-gather per layer in forward, one in
      backward, one reduce-scatter, per step.
    - run every collective on the communication stream (``comm.run_async``), so that they
      never cross each other on the wires; a reduce-scatter may still be running when
      backward returns (``finish`` waits for it). With ``prefetch=True``, start the gather of
      the next layer to run (the next one in forward, the previous one in backward) as soon
      as this layer's parameters have arrived, so that it runs while this layer computes.
    - layers without parameters (``nn.ReLU``) run as they are. Every rank calls ``replica``
      and ``backward`` the same number of times.

    Cost per step: 3 collectives of each layer's size, each rank sending 3 (N-1)/N of the
    model's bytes (DDP: 2 (N-1)/N); each rank holds 1/N of the parameters, gradients and
    optimizer state, plus one gathered layer (two with prefetch). Rajbhandari et al. 2020.
    """
    # Exercise 8.3 (about 58 lines). mp.hint("8.3") when stuck.
    raise NotImplementedError("Exercise 8.3: wrap_fsdp (notebooks/08_bigger_models.ipynb)")
