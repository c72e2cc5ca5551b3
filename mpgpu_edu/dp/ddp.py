"""Distributed data parallel (DDP) from scratch, one refinement at a time.

Every rank holds a full replica of the model and takes its shard of each batch. After
backward, the ranks average their gradients with an all-reduce, so every replica applies the
same update and stays identical. That is all of DDP; the rest is making the averaging cheap:

- ``ddp_step``             naive: after backward, one all-reduce per parameter. Not used in
                           practice, but a good start: every small tensor pays the latency.
- ``ddp_step_bucketed``    flatten the gradients into buckets of about ``bucket_bytes``
                           (reverse parameter order, the order backward produces them) and
                           all-reduce each bucket: few large messages instead of many small.
- ``ddp_step_overlapped``  start a bucket's all-reduce on the comm stream the moment its last
                           gradient is ready, while backward still computes the earlier
                           layers: communication hides behind compute. Engineered as
                           torch's DDP is: gradients are views into the buckets
                           (``GradBuckets``), torch's bucket rule (``make_buckets_torch``)
                           and the engineered ring (``collectives.ring_fast``); on gloo,
                           two buckets at a time at the end, as torch's gloo group does.
- ``ddp_step_accumulated`` gradient accumulation: several micro-batches, one all-reduce
                           (the idea of ``DistributedDataParallel.no_sync``).

Uneven shards are exact: each rank scales its loss by its share of the samples (see
``mpgpu_edu.replica.data.shard``), so the mean over ranks is the whole batch's gradient.
Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training",
VLDB 2020 (buckets, overlap, no_sync).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from mpgpu_edu.collectives import all_reduce, broadcast
from mpgpu_edu.collectives.ring_fast import RingAllReduce
from mpgpu_edu.comm.base import Communicator, Work, nbytes_of
from mpgpu_edu.replica.data import Batch, shard
from mpgpu_edu.memory.measure import track_gradients, track_parameters
from mpgpu_edu.replica.reference import make_optimizer, named_params
from mpgpu_edu.replica.flat import flat_params, flatten_grads, load_flat_params, unflatten_grads
from mpgpu_edu.replica.loop import forward_backward, optimizer_step, run_steps

DEFAULT_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb=25
FIRST_BUCKET_BYTES = 2**20  # torch DDP's first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES)

StepFn = Callable[..., torch.Tensor]


def local_forward_backward(comm: Communicator, model: nn.Module, batch: Batch) -> torch.Tensor:
    """This rank's shard of ``batch``, forward and backward; returns its loss times its
    share, so that the sum over ranks is the whole batch's loss.

    The loss is scaled by ``share * world_size`` before backward: the *mean* over ranks of
    those gradients is ``sum_i share_i * g_i``, the whole batch's gradient, even when the
    shards differ in size."""
    (x, y), share = shard(batch, comm.rank, comm.world_size)
    loss = forward_backward(comm, model, x, y, share * comm.world_size)
    return loss * share


def ddp_step(comm: Communicator, model: nn.Module, optimizer: torch.optim.Optimizer,
             batch: Batch) -> torch.Tensor:
    """One training step, naive: after backward, all-reduce (mean) every gradient, one
    parameter at a time, then step. Returns this rank's share of the batch loss.

    Cost: one all-reduce per parameter tensor: 2(N - 1) alpha each, so a model of many small
    tensors pays mostly latency; none of it overlaps with compute."""
    loss = local_forward_backward(comm, model, batch)
    for p in model.parameters():
        all_reduce(comm, p.grad, "mean")
    optimizer_step(comm, optimizer)
    return loss


def make_buckets(params: Sequence[torch.Tensor], bucket_bytes: int) -> list[list[torch.Tensor]]:
    """Group parameters, last first, into buckets of at most ``bucket_bytes`` (a parameter
    larger than that gets a bucket of its own). Backward produces gradients roughly from
    the last layer to the first, so the first bucket is the first one ready."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for p in reversed(list(params)):
        if not buckets or size + nbytes_of(p) > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += nbytes_of(p)
    return buckets


def all_reduce_buckets(comm: Communicator, model: nn.Module, bucket_bytes: int) -> None:
    """After backward: the gradients in buckets (``make_buckets``), each copied into one flat
    buffer, all-reduced (mean) and copied back."""
    for bucket in make_buckets(list(model.parameters()), bucket_bytes):
        flat = flatten_grads(bucket)
        with comm.memory.hold("comm_buffers", nbytes_of(flat), "bucket"):
            all_reduce(comm, flat, "mean")
            unflatten_grads(flat, bucket)


def ddp_step_bucketed(comm: Communicator, model: nn.Module, optimizer: torch.optim.Optimizer,
                      batch: Batch, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> torch.Tensor:
    """``ddp_step`` with the gradients flattened into buckets, one all-reduce per bucket.

    Cost: per bucket 2(N - 1) alpha + 2 (N - 1)/N S_bucket / beta: the latency is paid once
    per bucket instead of once per parameter; still after backward, never during it."""
    loss = local_forward_backward(comm, model, batch)
    all_reduce_buckets(comm, model, bucket_bytes)
    optimizer_step(comm, optimizer)
    return loss


def make_buckets_torch(params: Sequence[torch.Tensor], bucket_bytes: int,
                       first_bucket_bytes: int = FIRST_BUCKET_BYTES) -> list[list[torch.Tensor]]:
    """torch DDP's bucket rule: parameters last first; a bucket is closed once it holds at
    least its cap, ``min(first_bucket_bytes, bucket_bytes)`` for the first bucket and
    ``bucket_bytes`` after it (and when the dtype or device changes: a bucket is one flat
    buffer). The small first bucket starts communicating early; closing *after* the cap
    leaves a smaller last bucket than ``make_buckets`` ("at most the cap") often does, and
    the last bucket's all-reduce is the one backward cannot hide."""
    if bucket_bytes < 1 or first_bucket_bytes < 1:
        raise ValueError(f"bucket sizes must be positive, got {first_bucket_bytes} and "
                         f"{bucket_bytes}")
    buckets: list[list[torch.Tensor]] = []
    size, cap = 0, min(first_bucket_bytes, bucket_bytes)
    for p in reversed(list(params)):
        if buckets and buckets[-1] and (size >= cap or (p.dtype, p.device) != (
                buckets[-1][0].dtype, buckets[-1][0].device)):
            buckets.append([])
            size, cap = 0, bucket_bytes
        if not buckets:
            buckets.append([])
        buckets[-1].append(p)
        size += nbytes_of(p)
    return buckets


class GradBuckets:
    """What DDP keeps from one step to the next (torch's ``Reducer`` with
    ``gradient_as_bucket_view=True``): the buckets (``make_buckets_torch``), one flat buffer
    per bucket, every parameter's ``.grad`` a view into its bucket's buffer, and the ring
    (``RingAllReduce``) with its scratch buffers.

    Backward accumulates straight into the buffers, so a bucket is all-reduced where it
    lies: no copy into a flat buffer before, none back into ``.grad`` after."""

    def __init__(self, comm: Communicator, params: Sequence[torch.Tensor],
                 bucket_bytes: int) -> None:
        self.params, self.bucket_bytes, self.comm_id = list(params), bucket_bytes, id(comm)
        self.buckets = make_buckets_torch(self.params, bucket_bytes)
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.flats: list[torch.Tensor] = []
        self.views: list[tuple[torch.Tensor, torch.Tensor]] = []
        for bucket in self.buckets:
            flat = torch.zeros(sum(p.numel() for p in bucket), dtype=bucket[0].dtype,
                               device=bucket[0].device)
            views = flat.split([p.numel() for p in bucket])
            self.views += [(p, view.view_as(p)) for p, view in zip(bucket, views)]
            self.flats.append(flat)
        self.ring = RingAllReduce()  # segments by backend (ring_fast.GLOO_SEGMENT_BYTES)
        for flat in self.flats:
            self.ring.reserve(comm, flat)  # scratch now, not inside the first backward
        # Where two collectives run at once (gloo), the last bucket runs on the rank's own
        # thread beside the stream's: a ring of its own, so that they share no scratch.
        self.ring_here = RingAllReduce() if comm.collectives_at_once > 1 else None
        if self.ring_here is not None:
            self.ring_here.reserve(comm, self.flats[-1])

    def fits(self, comm: Communicator, params: Sequence[torch.Tensor],
             bucket_bytes: int) -> bool:
        """Made for this communicator, these parameters and this cap?"""
        return (self.comm_id == id(comm) and bucket_bytes == self.bucket_bytes
                and len(params) == len(self.params)
                and all(a is b for a, b in zip(params, self.params)))

    def attach(self) -> None:
        """Make every ``.grad`` its view again (after ``zero_grad(set_to_none=True)`` or a
        gradient set by hand, whose values are kept)."""
        with torch.no_grad():
            for p, view in self.views:
                if p.grad is view:
                    continue
                if p.grad is None:
                    view.zero_()
                else:
                    view.copy_(p.grad)
                p.grad = view


def grad_buckets(comm: Communicator, model: nn.Module, bucket_bytes: int) -> GradBuckets:
    """The model's ``GradBuckets``, made at its first ``ddp_step_overlapped`` and kept on the
    model (``model.ddp_grad_buckets``, as torch's ``DistributedDataParallel`` keeps its
    reducer), made again if the communicator, the parameters or the cap changed."""
    params = [p for p in model.parameters() if p.requires_grad]
    kept = getattr(model, "ddp_grad_buckets", None)
    if not isinstance(kept, GradBuckets) or not kept.fits(comm, params, bucket_bytes):
        kept = GradBuckets(comm, params, bucket_bytes)
        model.ddp_grad_buckets = kept
    kept.attach()
    return kept


def ddp_step_overlapped(comm: Communicator, model: nn.Module, optimizer: torch.optim.Optimizer,
                        batch: Batch, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> torch.Tensor:
    """``ddp_step_bucketed`` with communication overlapped with backward, engineered as
    torch's DDP is.

    A hook on every parameter (``register_post_accumulate_grad_hook``) counts the gradients
    of its bucket; when the last one is in, the bucket's all-reduce starts on the comm stream
    (``comm.run_async``) while backward goes on with earlier layers. After backward only the
    last bucket (the first layers', whose gradients come last) is still to wait for.
    Buckets start in the same order on every rank, because every rank runs the same
    backward. Three refinements over the lesson's version (``grad_buckets``):
    gradients are views into the buckets (no flatten, no copy back), torch's bucket rule
    (``make_buckets_torch``: a 1 MiB first bucket, buckets closed once past the cap), and
    the engineered ring (``RingAllReduce``: kept scratch, pipelined segments).
    Cost: about max(backward, communication) instead of their sum; what stays exposed is
    the last bucket's all-reduce.

    Where the backend runs two collectives at once (``comm.collectives_at_once``: gloo,
    whose process group has two worker threads, so torch's DDP there all-reduces two
    buckets at a time), the bucket completed last is not queued behind the others on the
    stream: the rank's own thread, free once backward returns, all-reduces it while the
    stream finishes the earlier ones. On the simulator, as with NCCL, buckets go one after
    another on the stream."""
    kept = grad_buckets(comm, model, bucket_bytes)
    missing = [len(bucket) for bucket in kept.buckets]
    works: list[Work] = []
    here: list[int] = []  # the bucket left for this thread (at most one)

    def on_grad_ready(p: torch.Tensor) -> None:
        i = kept.bucket_of[id(p)]
        missing[i] -= 1
        if missing[i] != 0:
            return
        if kept.ring_here is not None and len(works) == len(kept.buckets) - 1:
            here.append(i)  # the last bucket to complete: all-reduced below, beside the stream
        else:
            works.append(comm.run_async(kept.ring, comm, kept.flats[i], "mean"))

    hooks = [p.register_post_accumulate_grad_hook(on_grad_ready) for p in kept.params]
    try:
        loss = local_forward_backward(comm, model, batch)
    finally:
        for hook in hooks:
            hook.remove()
    if len(works) + len(here) != len(kept.buckets):
        raise RuntimeError(f"only {len(works) + len(here)} of {len(kept.buckets)} buckets got "
                           "all their gradients: does every parameter take part in the loss?")
    for i in here:
        kept.ring_here(comm, kept.flats[i], "mean")
    for work in works:
        work.wait()
    optimizer_step(comm, optimizer)
    return loss


def ddp_step_accumulated(comm: Communicator, model: nn.Module,
                         optimizer: torch.optim.Optimizer, batch: Batch, micro_steps: int = 2,
                         bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> torch.Tensor:
    """Gradient accumulation without sync: this rank's shard in ``micro_steps`` micro-batches,
    each backward adding into ``.grad`` locally, then one bucketed all-reduce.

    Only one micro-batch's activations are alive at a time, and the bytes sent per step do
    not grow with ``micro_steps``: syncing after every micro-batch would send them
    ``micro_steps`` times."""
    (x, y), share = shard(batch, comm.rank, comm.world_size)
    loss = torch.zeros((), device=x.device)
    for j in range(micro_steps):
        (xj, yj), micro_share = shard((x, y), j, micro_steps, who="micro-batches")
        part = share * micro_share  # this micro-batch's share of the whole batch
        loss = loss + forward_backward(comm, model, xj, yj, part * comm.world_size) * part
    all_reduce_buckets(comm, model, bucket_bytes)
    optimizer_step(comm, optimizer)
    return loss


def broadcast_parameters(comm: Communicator, model: nn.Module) -> None:
    """Make every replica start from rank 0's parameters (what DDP's constructor does)."""
    flat = flat_params(model)
    broadcast(comm, flat, root=0)
    load_flat_params(model, flat)


def train_ddp(comm: Communicator, step_fn: StepFn, model_fn: Callable[[], nn.Module],
              batches: Sequence[Batch], optimizer: str = "sgd", lr: float = 0.05,
              steps: int | None = None) -> dict:
    """Every rank: build a replica, take rank 0's parameters, run ``steps`` steps of
    ``step_fn`` (one of the ``ddp_step*``, or a ``functools.partial`` of one), and record
    parameters, gradients and optimizer state in ``comm.memory``.

    Returns ``{"params": {name: tensor}, "losses": [whole-batch loss of every step]}``,
    identical on every rank (the losses are summed over ranks once, at the end)."""
    steps = len(batches) if steps is None else steps
    model = model_fn().to(comm.device)
    broadcast_parameters(comm, model)
    opt = make_optimizer(optimizer, model.parameters(), lr)
    track_parameters(comm, model)
    track_gradients(comm, model)
    losses = run_steps(comm, batches, steps,
                       lambda batch: step_fn(comm, model, opt, batch), opt)
    return {"params": named_params(model), "losses": losses}
