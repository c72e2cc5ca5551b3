"""Lesson 08 exercises: fitting bigger models.

A model too big for one device's memory needs its state split, not copied: ZeRO-3 (FSDP) keeps
1/N of every layer's parameters on each rank and gathers a layer only while it runs. Here you
may use the package's collectives (``mpgpu_edu.collectives.all_gather`` and
``reduce_scatter``): lesson 01 built them. The functions and the class just below are solved
for you; their docstrings say what you need (what each does, not how). ``layer_views``,
``run_layer``, ``layer_backward`` and ``ShardedLayerFn`` are 8.2's autograd plumbing, and
``wrap_fsdp`` solves the shards and the replica's forward too, so that 8.2 is only the
sharding's timing: what to gather when, what to keep, what to reduce-scatter, what to start
early.
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


def run_layer(layer: nn.Module, full: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``layer``'s forward on ``x`` with ``full`` (its flat parameters) in place of its own."""
    return functional_call(layer, layer_views(layer, full), (x,))


def layer_backward(layer: nn.Module, full: torch.Tensor, x: torch.Tensor,
                   grad_out: torch.Tensor, needs_input_grad: bool
                   ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The backward of ``run_layer(layer, full, x)`` for a forward that kept only its input
    ``x``: runs the forward again with autograd on (recomputation), then backpropagates
    ``grad_out``. Returns the gradient of ``x`` (None unless ``needs_input_grad``) and of
    ``full``, one flat vector like ``full``. Costs one more forward of the layer."""
    full = full.detach().requires_grad_()
    x = x.detach().requires_grad_(needs_input_grad)
    with torch.enable_grad():
        torch.autograd.backward(run_layer(layer, full, x), grad_out)
    return (x.grad if needs_input_grad else None), full.grad


class ShardedLayerFn(torch.autograd.Function):
    """One layer as one autograd node whose work a replica of yours decides.

    ``ShardedLayerFn.apply(x, shard, replica, i)`` returns ``replica.forward_layer(i, x)``,
    run with autograd off: autograd keeps nothing of it but ``x``. In ``loss.backward()``
    the node calls ``replica.backward_layer(i, x, grad_out, needs_input_grad)``, which
    returns the gradient of ``x`` (or None). ``shard`` (the layer's ``nn.Parameter``) is an
    input only so that autograd runs this node's backward even when ``x`` needs no gradient;
    autograd gives it no gradient: your replica sets ``shard.grad`` itself, in ``finish``.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, shard: torch.Tensor, replica: Any,
                i: int) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.replica, ctx.i = replica, i
        return replica.forward_layer(i, x)  # autograd is off inside a Function's forward

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        (x,) = ctx.saved_tensors
        grad_x = ctx.replica.backward_layer(ctx.i, x, grad_out, ctx.needs_input_grad[0])
        return grad_x, None, None, None


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


def wrap_fsdp(comm: Communicator, module: nn.Sequential, prefetch: bool = False) -> FSDPReplica:
    """Shard ``module`` over the ranks as ZeRO-3 / FSDP does and return this rank's replica.

    Solved below: ``layers``, ``sizes`` (parameters per layer) and ``shards`` (each layer's
    ``nn.Parameter``, None without parameters), by layer index; the class ``Sharded`` with
    ``self.pending`` (started gathers), ``self.reducing`` (started reduce-scatters), its
    forward, ``parameters()``, ``start_gather(i)`` and ``next_layer(i, step)``. Yours
    (exercise 8.2): four methods of ``Sharded``, where the stub stands.

    - ``gather(i, step)``: layer ``i``'s full flat parameters, every rank's shard joined (cut
      to its ``sizes[i]`` elements, or not: ``layer_views`` reads only those). Start its gather unless started (``self.start_gather(i)``),
      wait (``self.pending.pop(i).wait()`` is the list of every rank's shard); with
      ``prefetch``, start the next layer's gather (``self.next_layer(i, step)``, ``step``
      +1 in forward, -1 in backward) as soon as these parameters have arrived, before this
      layer computes.
    - ``forward_layer(i, x)`` (forward): gather, ``run_layer``; keep nothing of the full
      vector.
    - ``backward_layer(i, x, grad_out, needs_input_grad)`` (in ``loss.backward()``): gather
      again, ``layer_backward``, pad the full gradient with zeros to
      ``shards[i].numel() * N`` elements, start ``comm.run_async(reduce_scatter, comm,
      padded, "mean")`` and note it in ``self.reducing``; return the input's gradient.
    - ``finish()`` (after ``loss.backward()``, before the optimizer): wait for every started
      reduce-scatter (its result is this rank's shard of the mean gradient), add it into that
      shard's ``.grad`` (None at first: gradients accumulate, as in torch), and clear
      ``self.reducing``.

    Every collective runs on the comm stream (``comm.run_async``), which runs its jobs one at
    a time in the order started; no other copy of a layer's parameters is kept. Rajbhandari
    et al. 2020.
    """
    layers = list(module)
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    shards = [nn.Parameter(shard_of(torch.cat([p.detach().reshape(-1)
                                               for p in layer.parameters()]),
                                    comm.rank, comm.world_size)) if size else None
              for layer, size in zip(layers, sizes)]

    class Sharded:
        def __init__(self) -> None:
            self.pending: dict[int, Any] = {}  # layer -> its all-gather, started
            self.reducing: list[tuple[int, Any]] = []  # (layer, its reduce-scatter), started

        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            for i, layer in enumerate(layers):
                x = ShardedLayerFn.apply(x, shards[i], self, i) if sizes[i] else layer(x)
            return x

        def parameters(self) -> list[nn.Parameter]:
            return [shard for shard in shards if shard is not None]

        def start_gather(self, i: int) -> None:
            """Start layer ``i``'s all-gather on the comm stream, unless it has no
            parameters, does not exist, or was started already."""
            if 0 <= i < len(layers) and sizes[i] and i not in self.pending:
                self.pending[i] = comm.run_async(all_gather, comm, shards[i].detach())

        def next_layer(self, i: int, step: int) -> int:
            """The next layer with parameters after ``i`` going by ``step`` (+1: forward,
            -1: backward); out of range (start_gather ignores it) when there is none."""
            j = i + step
            while 0 <= j < len(layers) and not sizes[j]:
                j += step
            return j

        # Yours: gather(self, i, step), forward_layer(self, i, x),
        # backward_layer(self, i, x, grad_out, needs_input_grad) and finish(self).
        # Exercise 8.2 (about 21 lines). mp.hint("8.2") when stuck.
        raise NotImplementedError("Exercise 8.2: wrap_fsdp (notebooks/08_bigger_models.ipynb)")

    return Sharded()
