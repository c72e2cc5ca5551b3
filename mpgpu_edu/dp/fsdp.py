"""ZeRO-3 / FSDP from scratch: every rank holds 1/N of every layer's parameters.

Data parallel training keeps a whole replica on every rank. Here each layer's parameters are
flattened into one vector, padded to a multiple of N, and cut into N equal shards; rank r keeps
only shard r (an ``nn.Parameter`` the optimizer updates). A layer's full parameters exist only
while the layer runs:

    forward of layer i:   all-gather the shards -> full flat vector -> the layer's forward;
                          free the full vector (autograd keeps only a marker, not the weights)
    backward of layer i:  all-gather again -> the layer's backward -> free the full vector;
                          reduce-scatter the full gradient (mean over ranks) -> my shard's grad

So a rank holds its shards (P/N), one or two gathered layers, and its activations, instead of
the whole model. The price: 3 collectives of the layer's size per step instead of DDP's one
all-reduce (= reduce-scatter + all-gather): 1.5x DDP's traffic. With ``prefetch`` the gather
of the next layer that has parameters (the previous one, in backward) starts on the comm stream
while this layer computes, in forward as in backward (FSDP's forward and backward prefetch),
so communication hides behind compute, for one more gathered layer in memory.

Every collective runs on the rank's comm stream, in the same order on every rank, so the
gathers of one direction and the reduce-scatters of the other never cross. Shards are
``torch.tensor_split`` of the padded vector, the chunks ``collectives.reduce_scatter`` returns.

Cost per layer of S bytes on N ranks (ring): 3 (N-1) (alpha + S/(N beta)) per step.
Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"
(2020), stage 3; Zhao et al., "PyTorch FSDP" (2023).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.nn.utils import parameters_to_vector

from mpgpu_edu.collectives import all_gather, reduce_scatter
from mpgpu_edu.comm.base import Communicator, Work, nbytes_of
from mpgpu_edu.replica.data import Batch, loss_fn, shard
from mpgpu_edu.replica.reference import batch_for_step, make_optimizer

GATHERED = "comm_buffers"  # the memory category of a layer's full parameters while it runs


@dataclass
class ShardedLayer:
    """One layer: its flat shard, and what it takes to rebuild the full parameters."""

    index: int
    layer: nn.Module  # the layer with its parameters moved to the meta device (shapes only)
    names: list[str]
    shapes: list[torch.Size]
    numel: int  # real elements (the flat vector without its padding)
    shard: nn.Parameter
    pending: tuple[Work, int] | None = None  # a prefetched all-gather and its memory record
    works: list[Work] = field(default_factory=list)  # reduce-scatters in flight


def flat_shard(params: list[torch.Tensor], rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s shard of the parameters flattened into one vector, padded with zeros
    to a multiple of ``world_size`` (every shard the same length, as all-gather needs)."""
    flat = parameters_to_vector(p.detach() for p in params) if params else torch.zeros(0)
    padded = torch.zeros(-(-flat.numel() // world_size) * world_size, dtype=flat.dtype)
    padded[: flat.numel()] = flat
    return torch.tensor_split(padded, world_size)[rank].clone()


class FSDPReplica:
    """What ``wrap_fsdp`` returns: call it for the forward, ``finish()`` after backward,
    ``parameters()`` for the optimizer (this rank's shards)."""

    def __init__(self, comm: Communicator, module: nn.Sequential, prefetch: bool = False) -> None:
        self.comm, self.prefetch = comm, prefetch
        with comm.compute("setup", "shard the layers", seconds=0):  # once, not per step
            self.units = [self._shard(i, layer) for i, layer in enumerate(module)]
        for unit in self.parameters_by_layer():
            comm.memory.alloc_tensor(unit.shard, "parameters", f"shard of layer {unit.index}")
            comm.memory.alloc_tensor(unit.shard, "gradients", f"shard of layer {unit.index}")

    def parameters_by_layer(self) -> list[ShardedLayer]:
        """The layers that have parameters, in order."""
        return [unit for unit in self.units if unit.numel]

    def _shard(self, index: int, layer: nn.Module) -> ShardedLayer:
        names = [name for name, _ in layer.named_parameters()]
        params = [p for _, p in layer.named_parameters()]
        shard = nn.Parameter(flat_shard(params, self.comm.rank, self.comm.world_size)
                             .to(self.comm.device))
        return ShardedLayer(index, _without_parameters(layer, self.comm.device), names,
                            [p.shape for p in params], sum(p.numel() for p in params), shard)

    def parameters(self) -> Iterator[nn.Parameter]:
        """This rank's shards, one per layer with parameters."""
        return (unit.shard for unit in self.units if unit.numel)

    # ---- gather and free ------------------------------------------------------------------

    def _start_gather(self, unit: ShardedLayer) -> tuple[Work, int]:
        """Start the all-gather on the comm stream; the full buffer is held from now on."""
        nbytes = unit.shard.numel() * self.comm.world_size * unit.shard.element_size()
        token = self.comm.memory.alloc(GATHERED, nbytes, f"gathered layer {unit.index}")
        return self.comm.run_async(_gather_flat, self.comm, unit.shard.detach()), token

    def gather(self, unit: ShardedLayer) -> tuple[torch.Tensor, int]:
        """The layer's full flat parameters (prefetched or gathered now) and the memory
        record of them (free it when the layer is done)."""
        (work, token), unit.pending = unit.pending or self._start_gather(unit), None
        return work.wait()[: unit.numel], token

    def prefetch_next(self, index: int) -> None:
        """With prefetch on, start gathering layer ``index`` (if it has parameters)."""
        if self.prefetch and 0 <= index < len(self.units):
            unit = self.units[index]
            if unit.numel and unit.pending is None:
                unit.pending = self._start_gather(unit)

    def views(self, unit: ShardedLayer, full: torch.Tensor) -> dict[str, torch.Tensor]:
        """The layer's parameters as views of the full flat vector."""
        out, offset = {}, 0
        for name, shape in zip(unit.names, unit.shapes):
            n = shape.numel()
            out[name] = full[offset: offset + n].view(shape)
            offset += n
        return out

    def reduce_grad(self, unit: ShardedLayer, grad: torch.Tensor) -> None:
        """Start the mean reduce-scatter of the layer's full flat gradient into its shard."""
        padded = torch.zeros(unit.shard.numel() * self.comm.world_size, dtype=grad.dtype,
                             device=grad.device)
        padded[: grad.numel()] = grad
        unit.works.append(self.comm.run_async(reduce_scatter, self.comm, padded, "mean"))

    # ---- the step ---------------------------------------------------------------------------

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for unit in self.units:
            if not unit.numel:  # a layer without parameters (ReLU) runs as it is
                with self.comm.compute("forward", f"layer {unit.index}"):
                    x = unit.layer(x)
                continue
            x = _ShardedForward.apply(x, unit.shard, self, unit)
        return x

    def finish(self) -> None:
        """Wait for the reduce-scatters; afterwards every shard's ``.grad`` holds the mean
        over ranks of its gradient (added to what it held, as backward accumulates)."""
        for unit in self.units:
            for work in unit.works:
                grad = work.wait().view_as(unit.shard)
                unit.shard.grad = grad if unit.shard.grad is None else unit.shard.grad + grad
            unit.works = []

    def full_state(self) -> dict[str, torch.Tensor]:
        """Every layer's full parameters, under the model's own names (``"2.weight"``): an
        all-gather per layer (every rank calls it), for checkpoints and comparisons."""
        state = {}
        for unit in self.units:
            if unit.numel:
                full = _gather_flat(self.comm, unit.shard.detach())[: unit.numel]
                for name, view in self.views(unit, full).items():
                    state[f"{unit.index}.{name}"] = view.clone().cpu()
        return state


def wrap_fsdp(comm: Communicator, module: nn.Sequential, prefetch: bool = False) -> FSDPReplica:
    """Shard every layer of ``module`` over the ranks (ZeRO-3 / FSDP); see ``FSDPReplica``.

    Every rank passes the same ``module`` (same initial parameters) and keeps only its shards;
    ``module`` itself is left untouched."""
    return FSDPReplica(comm, module, prefetch)


def _gather_flat(comm: Communicator, shard: torch.Tensor) -> torch.Tensor:
    return torch.cat(all_gather(comm, shard))


def _without_parameters(layer: nn.Module, device: torch.device) -> nn.Module:
    """A copy of ``layer`` whose parameters are meta tensors (shapes, no data): the layer's
    forward gets real ones from ``functional_call``. Buffers stay real."""
    copied = copy.deepcopy(layer).to(device)
    for module in copied.modules():
        for name, param in module._parameters.items():
            if param is not None:
                module._parameters[name] = nn.Parameter(torch.empty_like(param, device="meta"),
                                                        param.requires_grad)
    return copied


class _ShardedForward(torch.autograd.Function):
    """One sharded layer as one autograd node: its forward gathers, runs the layer and frees;
    its backward gathers again, runs the layer's backward and reduce-scatters. The layer's
    own graph lives inside (``ctx``), with its weights saved as markers, not as tensors."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, shard: torch.Tensor, replica: FSDPReplica,
                unit: ShardedLayer) -> torch.Tensor:
        comm = replica.comm
        full, token = replica.gather(unit)
        replica.prefetch_next(_next_with_params(replica, unit.index, +1))
        weights = full.detach().requires_grad_()
        inputs = x.detach().requires_grad_(x.requires_grad)
        saved = _WeightsAsMarkers(weights)
        with torch.enable_grad(), saved, comm.compute("forward", f"layer {unit.index}"):
            out = functional_call(unit.layer, replica.views(unit, weights), (inputs,))
        weights.untyped_storage().resize_(0)  # free the full parameters; the shard stays
        comm.memory.free(token)
        ctx.acts = comm.memory.alloc("activations", saved.nbytes, f"layer {unit.index}")
        ctx.state = (replica, unit, inputs, out, weights, saved)
        return out.detach()

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        replica, unit, inputs, out, weights, saved = ctx.state
        comm = replica.comm
        full, token = replica.gather(unit)
        replica.prefetch_next(_next_with_params(replica, unit.index, -1))
        saved.full = full  # the markers unpack into this freshly gathered copy
        with comm.compute("backward", f"layer {unit.index}"):
            torch.autograd.backward(out, grad_out)
        saved.full = None
        comm.memory.free(token)
        comm.memory.free(ctx.acts)
        replica.reduce_grad(unit, weights.grad)
        weights.grad, ctx.state = None, None
        return (inputs.grad if inputs.requires_grad else None), None, None, None


def _next_with_params(replica: FSDPReplica, index: int, step: int) -> int:
    """The next layer after ``index`` in direction ``step`` (+1 forward, -1 backward) that has
    parameters, skipping those without (ReLU): the one whose gather to start ahead. -1 or
    ``len(units)`` when there is none."""
    i = index + step
    while 0 <= i < len(replica.units) and not replica.units[i].numel:
        i += step
    return i


class _WeightsAsMarkers(torch.autograd.graph.saved_tensors_hooks):
    """While the layer runs forward, a saved tensor that is a view of the full parameters is
    kept as (offset, shape, stride) instead: the full vector can be freed. In backward each
    marker unpacks into the same view of ``full``, the copy gathered again. Other saved
    tensors (the activations) are kept as they are, and their bytes counted."""

    def __init__(self, weights: torch.Tensor) -> None:
        self.full: torch.Tensor | None = None
        self.nbytes = 0
        self._base = weights.untyped_storage().data_ptr()
        super().__init__(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor) -> Any:
        if tensor.untyped_storage().data_ptr() == self._base:
            return ("weights", tensor.storage_offset(), tensor.shape, tensor.stride())
        self.nbytes += nbytes_of(tensor)
        return tensor

    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, tuple) and packed and packed[0] == "weights":
            _, offset, shape, stride = packed
            return self.full.as_strided(shape, stride, offset)
        return packed


def fsdp_step(comm: Communicator, replica: FSDPReplica, optimizer: torch.optim.Optimizer,
              batch: tuple[torch.Tensor, torch.Tensor]) -> float:
    """One training step: this rank's shard of ``batch`` forward and backward (its loss
    scaled by its share x N, so the mean over ranks is the whole batch's gradient, as in
    ``ddp``), the reduce-scatters finished, the shards stepped. Returns this rank's share
    of the batch loss (the sum over ranks is the batch's loss)."""
    (x, y), share = shard(batch, comm.rank, comm.world_size)
    loss = loss_fn(replica(x.to(comm.device)), y.to(comm.device))
    (loss * share * comm.world_size).backward()
    replica.finish()
    with comm.compute("optimizer", "step"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.item() * share


def train_fsdp(comm: Communicator, model: nn.Sequential, batches: Sequence[Batch],
               optimizer: str = "sgd", lr: float = 0.05, prefetch: bool = False,
               steps: int | None = None) -> dict[str, Any]:
    """SPMD: train ``model`` sharded over the ranks, one step per batch (cycled for
    ``steps``). Returns ``{"losses": this rank's share of each step's loss, "state": the full
    parameters at the end (``full_state``)}``, to compare with ``reference.train_single``."""
    replica = wrap_fsdp(comm, model, prefetch)
    opt = make_optimizer(optimizer, list(replica.parameters()), lr)
    losses = [fsdp_step(comm, replica, opt, batch_for_step(batches, step))
              for step in range(steps or len(batches))]
    return {"losses": losses, "state": replica.full_state()}
