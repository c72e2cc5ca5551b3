"""The course's ZeRO-3 against ``torch.distributed.fsdp.fully_shard`` (FSDP2), on gloo.

``compare_fsdp(wrap)`` trains one model three ways on the same batches, steps interleaved
(``result.take_turns``): on one device (rank 0, the whole batch), with ``wrap`` (lesson 08's
contract: ``wrap(comm, module, prefetch)`` returns a replica; ``replica(x)`` runs forward,
``loss.backward()`` then ``replica.finish()`` leave in every local shard's ``.grad`` the mean
gradient of that shard, and ``replica.parameters()`` yields the local shards for a torch
optimizer), and with FSDP2: ``fully_shard`` on every ``Linear`` and then on the whole model,
over a one-dimensional ``DeviceMesh`` of the ranks. Every rank takes an equal shard of the
batch and minimises the mean loss over it; both average the gradients over the ranks (a
reduce-scatter), so each step's gradient is the whole batch's mean-loss gradient.

What FSDP2 does that ours does not: its parameters are ``DTensor``s (each rank's shard of dim
0, with the layout written on the tensor), it all-gathers every layer's parameters as one flat
buffer, in backward starts the gather of the next layer to run before the backward of this
one (prefetch, on by default), and can keep parameters gathered from forward to backward
(``reshard_after_forward=False``: ZeRO-2's memory). What is the same: a layer's parameters are
gathered just before its forward and again before its backward, freed after each, and its
gradients are reduce-scattered, so each rank keeps 1/N of the parameters, gradients and
optimizer state between steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from mpgpu_edu.comm import Communicator, launch
from mpgpu_edu.replica.data import Batch
from mpgpu_edu.sidebyside.ddp import CONVENTION, data_parallel_job, label_of, plain, three_ways
from mpgpu_edu.sidebyside.result import SideBySide, from_ranks

Wrap = Callable[[Communicator, nn.Sequential, bool], Any]  # lesson 08's wrap_fsdp

SIZES = (64, 256, 256, 8)
BATCH = 64
STEPS = 8
LR = 0.05


def fully_shard_layers(model: nn.Sequential) -> nn.Sequential:
    """FSDP2 as its documentation applies it: ``fully_shard`` on every ``Linear``, then on
    the root, over every rank of the default process group (CPU tensors, gloo)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def fsdp_side_by_side(comm: Communicator, wrap: Wrap, model_fn: Callable[[], nn.Sequential],
                      batches: Sequence[Batch], optimizer: str, lr: float,
                      prefetch: bool) -> dict:
    """SPMD, on gloo: one device (rank 0), ``wrap``'s sharded replica and FSDP2, step by
    step (``take_turns``). Returns this rank's losses and seconds per step."""
    ours = wrap(comm, model_fn(), prefetch)
    theirs = fully_shard_layers(model_fn())
    return three_ways(comm, model_fn, batches, optimizer, lr, ours, ours.parameters(), theirs)


def package_wrap() -> Wrap:
    """The package's sharded wrapper, ``dp.fsdp.wrap_fsdp``."""
    try:
        from mpgpu_edu.dp.fsdp import wrap_fsdp
    except ImportError as exc:
        raise ValueError("the package's sharded wrapper (mpgpu_edu/dp/fsdp.py, wrap_fsdp) "
                         f"cannot be imported ({exc}): pass wrap= a function of lesson 08's "
                         "contract") from None
    return wrap_fsdp


def compare_fsdp(wrap: Wrap | None = None, ranks: int = 2, steps: int = STEPS,
                 sizes: Sequence[int] = SIZES, batch: int = BATCH, optimizer: str = "sgd",
                 lr: float = LR, prefetch: bool = False, timeout: float = 120.0) -> SideBySide:
    """Train ``make_mlp(sizes)`` for ``steps`` steps of ``batch`` samples on ``ranks`` gloo
    processes with ``wrap`` (lesson 08's ``wrap_fsdp``, or ``mp.yours``'s choice; None: the
    package's, ``dp.fsdp.wrap_fsdp``), with FSDP2 (``fully_shard``) and on one device.
    ``batch`` must split evenly over the ranks. Returns the losses and step times of all
    three (``SideBySide``)."""
    model_fn, batches, setup = data_parallel_job("compare_fsdp", ranks, steps, sizes, batch,
                                                 optimizer, lr)
    label = "the package's sharded wrapper" if wrap is None else label_of(wrap)
    wrap = package_wrap() if wrap is None else wrap
    run = launch(fsdp_side_by_side, ranks, plain(wrap), model_fn, batches, optimizer, lr,
                 prefetch, backend="gloo", timeout=timeout)
    return from_ranks(
        run.results, title=f"ZeRO-3 on {ranks} gloo processes: {label} against torch's FSDP2",
        setup=f"{setup}, our prefetch {'on' if prefetch else 'off'} (FSDP2's: its default, on)",
        convention=CONVENTION, ours=label, torch_label="torch fully_shard (FSDP2)")
