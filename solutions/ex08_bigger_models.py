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
    ### BEGIN SOLUTION 8.1
    size = -(-flat.numel() // world_size)
    padded = torch.zeros(size * world_size, dtype=flat.dtype, device=flat.device)
    padded[: flat.numel()] = flat
    return padded[rank * size: (rank + 1) * size].clone()
    ### END SOLUTION


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
    ### BEGIN SOLUTION 8.2
    if min(n_stages, n_microbatches, n_chunks) < 1:
        raise ValueError("stages, microbatches and chunks must each be at least 1")
    if n_microbatches % n_stages:
        raise ValueError(f"{n_microbatches} microbatches are not a multiple of {n_stages}")
    return (n_stages - 1) / (n_chunks * n_microbatches)
    ### END SOLUTION


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
    ### BEGIN SOLUTION 8.3
    layers = list(module)
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    shards = [nn.Parameter(shard_of(torch.cat([p.detach().reshape(-1)
                                               for p in layer.parameters()]),
                                    comm.rank, comm.world_size)) if size else None
              for layer, size in zip(layers, sizes)]

    class Sharded:
        def __init__(self) -> None:
            self.pending: dict[int, Any] = {}  # layer -> its gather, started
            self.reducing: list[tuple[int, Any]] = []

        def start_gather(self, i: int) -> None:
            if 0 <= i < len(layers) and sizes[i] and i not in self.pending:
                self.pending[i] = comm.run_async(all_gather, comm, shards[i].detach())

        def gather(self, i: int, step: int) -> torch.Tensor:
            self.start_gather(i)
            full = torch.cat(self.pending.pop(i).wait())[: sizes[i]]
            if prefetch:
                self.start_gather(self._next_with_params(i, step))
            return full

        def _next_with_params(self, i: int, step: int) -> int:
            i += step
            while 0 <= i < len(layers) and not sizes[i]:
                i += step
            return i

        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            for i, layer in enumerate(layers):
                x = _Layer.apply(x, shards[i], self, i) if sizes[i] else layer(x)
            return x

        def finish(self) -> None:
            for i, work in self.reducing:
                grad = work.wait()
                shards[i].grad = grad if shards[i].grad is None else shards[i].grad + grad
            self.reducing.clear()

        def parameters(self) -> list[nn.Parameter]:
            return [shard for shard in shards if shard is not None]

    class _Layer(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, shard: torch.Tensor, owner: Sharded,
                    i: int) -> torch.Tensor:
            full = owner.gather(i, +1)
            with torch.no_grad():
                out = functional_call(layers[i], layer_views(layers[i], full), (x,))
            ctx.save_for_backward(x)
            ctx.owner, ctx.i = owner, i
            return out  # full goes out of scope here: freed

        @staticmethod
        def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
            (x,), owner, i = ctx.saved_tensors, ctx.owner, ctx.i
            full = owner.gather(i, -1).requires_grad_()
            x = x.detach().requires_grad_(ctx.needs_input_grad[0])
            with torch.enable_grad():  # the layer's forward again, then its backward
                out = functional_call(layers[i], layer_views(layers[i], full), (x,))
                torch.autograd.backward(out, grad_out)
            padded = torch.zeros(shards[i].numel() * comm.world_size, dtype=full.dtype)
            padded[: sizes[i]] = full.grad
            owner.reducing.append((i, comm.run_async(reduce_scatter, comm, padded, "mean")))
            return (x.grad if ctx.needs_input_grad[0] else None), None, None, None

    return Sharded()
    ### END SOLUTION
