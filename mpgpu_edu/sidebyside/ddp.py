"""The course's DDP against ``torch.nn.parallel.DistributedDataParallel``, on gloo processes.

``compare_ddp(wrap)`` trains one model three ways on the same batches, in the same worker
processes, steps interleaved (``result.take_turns``): on one device (rank 0, the whole
batch), with ``wrap`` (exercise 3.5's contract: ``wrap(comm, module, bucket_cap_bytes)``
returns a replica with ``finish()``), and with torch's DDP, the same bucket cap. Every rank
starts from the same parameters, takes an equal shard of the batch and minimises the mean
loss over its shard; both DDPs average the gradients over the ranks, so each step's gradient
is the whole batch's mean-loss gradient, as on one device.

What torch's DDP does that ours does not: its reducer, in C++, copies each gradient into a
bucket allocated once (``gradient_as_bucket_view=True`` makes the ``.grad``s views into them
instead) and gloo all-reduces it on its own threads, where ours is a ring of Python sends on
the comm stream; after the first step it rebuilds its buckets in the order the gradients
really arrived; and it offers ``no_sync()`` for gradient accumulation and broadcasts buffers
every forward. What is the same: one broadcast at the start, buckets in reverse parameter
order, an all-reduce (mean) per bucket started from a gradient hook during backward.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from mpgpu_edu.comm import Communicator, launch
from mpgpu_edu.replica.data import Batch, loss_fn, make_batches, make_mlp
from mpgpu_edu.replica.reference import batch_for_step, make_optimizer
from mpgpu_edu.sidebyside.result import SideBySide, from_ranks, take_turns

Wrap = Callable[[Communicator, nn.Module, int], Any]  # exercise 3.5's wrap_ddp

SIZES = (64, 256, 256, 8)
BATCH = 64
STEPS = 8
LR = 0.05
BUCKET_BYTES = 2**18  # 256 KiB: several buckets for this model
CONVENTION = ("the mean squared error over the whole batch; each rank takes the mean over its "
              "equal shard and the gradients are averaged over the ranks")


def one_device_steps(model_fn: Callable[[], nn.Module], batches: Sequence[Batch],
                     optimizer: str, lr: float) -> Callable[[int], float]:
    """Step k of plain training on the whole batch (``reference.train_single``'s loop)."""
    model = model_fn()
    opt = make_optimizer(optimizer, model.parameters(), lr)

    def step(k: int) -> float:
        x, y = batch_for_step(batches, k)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def shard_of(batch: Batch, rank: int, world_size: int) -> Batch:
    """Rank ``rank``'s equal part of ``batch``."""
    x, y = batch
    return x.chunk(world_size)[rank], y.chunk(world_size)[rank]


def replica_steps(comm: Communicator, replica: Any, params: Any, finish: bool,
                  batches: Sequence[Batch], optimizer: str, lr: float) -> Callable[[int], float]:
    """Step k of data-parallel training: forward and backward of this rank's shard's mean
    loss through ``replica``, ``replica.finish()`` when ``finish``, the optimizer step."""
    opt = make_optimizer(optimizer, params, lr)

    def step(k: int) -> float:
        x, y = shard_of(batch_for_step(batches, k), comm.rank, comm.world_size)
        loss = loss_fn(replica(x), y)
        loss.backward()
        if finish:
            replica.finish()
        opt.step()
        opt.zero_grad()
        return loss.item()

    return step


def ddp_side_by_side(comm: Communicator, wrap: Wrap, model_fn: Callable[[], nn.Module],
                     batches: Sequence[Batch], optimizer: str, lr: float,
                     bucket_bytes: int) -> dict:
    """SPMD, on gloo: one device (rank 0), ``wrap``'s DDP and torch's DDP, step by step
    (``take_turns``). Returns this rank's losses and seconds per step."""
    from torch.nn.parallel import DistributedDataParallel

    ours_model = model_fn()
    ours = wrap(comm, ours_model, bucket_bytes)
    torch_model = model_fn()
    theirs = DistributedDataParallel(torch_model, bucket_cap_mb=bucket_bytes / 2**20)
    return three_ways(comm, model_fn, batches, optimizer, lr, ours, ours_model.parameters(),
                      theirs)


def three_ways(comm: Communicator, model_fn: Callable[[], nn.Module],
               batches: Sequence[Batch], optimizer: str, lr: float, ours: Any, ours_params: Any,
               theirs: nn.Module) -> dict:
    """One device (rank 0), the replica ``ours`` (training ``ours_params``, ``finish()``
    after each backward) and torch's ``theirs``, step by step (``take_turns``): this rank's
    losses and seconds per step."""
    runs = {"one device": (one_device_steps(model_fn, batches, optimizer, lr)
                           if comm.rank == 0 else None),
            "ours": replica_steps(comm, ours, ours_params, True, batches, optimizer, lr),
            "torch": replica_steps(comm, theirs, theirs.parameters(), False, batches,
                                   optimizer, lr)}
    return take_turns(runs, len(batches))


def data_parallel_job(compare: str, ranks: int, steps: int, sizes: Sequence[int], batch: int,
                      optimizer: str, lr: float
                      ) -> tuple[Callable[[], nn.Module], list[Batch], str]:
    """What a data-parallel comparison (``compare``: its name, for the error) starts from:
    the check that ``batch`` splits evenly over ``ranks``; the model's maker, the batches,
    and the start of the setup line."""
    if ranks < 2 or batch % ranks:
        raise ValueError(f"{compare} needs 2 or more ranks and a batch that splits evenly "
                         f"over them; got {ranks} ranks and a batch of {batch}")
    model_fn = functools.partial(make_mlp, tuple(sizes))
    batches = make_batches(steps, batch, sizes[0], sizes[-1])
    setup = (f"MLP {'-'.join(map(str, sizes))}, batch {batch} ({batch // ranks} per rank), "
             f"{steps} steps, {optimizer} lr {lr}")
    return model_fn, batches, setup


def label_of(fn: Any) -> str:
    """What ran as "ours", in a few words: a ``mp.yours`` choice's label ("your DDP
    wrapper", "reference DDP wrapper (yours: not yet)"), else the function's module and
    name."""
    if hasattr(fn, "is_yours"):
        return fn.label
    return f"{fn.__module__}.{fn.__qualname__}"


def plain(fn: Any) -> Any:
    """The function itself: a ``mp.yours`` choice unwrapped (workers import it by name)."""
    return getattr(fn, "fn", fn)


def compare_ddp(wrap: Wrap | None = None, ranks: int = 2, steps: int = STEPS,
                sizes: Sequence[int] = SIZES, batch: int = BATCH, optimizer: str = "sgd",
                lr: float = LR, bucket_bytes: int = BUCKET_BYTES,
                timeout: float = 120.0) -> SideBySide:
    """Train ``make_mlp(sizes)`` for ``steps`` steps of ``batch`` samples on ``ranks`` gloo
    processes with ``wrap`` (exercise 3.5's ``wrap_ddp``, or ``mp.yours``'s choice; None:
    the package's DDP wrapper, ``dp.wrapper.wrap_ddp``, made of ``dp.ddp``'s buckets and
    hooks) and with ``torch.nn.parallel.DistributedDataParallel``, and on one device.
    ``batch`` must split evenly over the ranks. Returns the losses and step times of all
    three (``SideBySide``: print it, ``.plot()`` it)."""
    model_fn, batches, setup = data_parallel_job("compare_ddp", ranks, steps, sizes, batch,
                                                 optimizer, lr)
    label = "the package's DDP wrapper" if wrap is None else label_of(wrap)
    if wrap is None:
        from mpgpu_edu.dp.wrapper import wrap_ddp as wrap
    run = launch(ddp_side_by_side, ranks, plain(wrap), model_fn, batches, optimizer, lr,
                 bucket_bytes, backend="gloo", timeout=timeout)
    return from_ranks(
        run.results, title=f"DDP on {ranks} gloo processes: {label} against torch's",
        setup=f"{setup}, buckets of {bucket_bytes // 1024} KiB",
        convention=CONVENTION, ours=label, torch_label="torch DistributedDataParallel")
