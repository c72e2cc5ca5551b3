"""Lesson 03's demos: the data-parallel recipe, DataParallel against DDP, and what DDP's
refinements hide.

- ``recipe_step`` / ``run_recipe``: one data-parallel step on the demo model, written out in
  its four moves (replica, shard, average, update), reporting what each rank holds.
- ``step_on_meta`` / ``run_step``: one step of ``nn.DataParallel`` (``dp.dataparallel_step``)
  or of a DDP step function on meta tensors (shapes without data), with parameters,
  gradients, optimizer state, activations and buckets recorded in the memory ledger.
- ``deep``: a workload of many small layers, where buckets and overlap show.
- ``hidden_comm_seconds``: communication that ran under compute, costing no time.
- ``plot_steps``: step timelines stacked on one time axis, a dashed line where each ends.
- ``whose``: a short title saying whose function a demo ran.
- ``run_demo``: ``dp.run_demo`` (a DDP variant against one device on the demo model).
- ``run_training``: real DDP training with every tensor in the memory ledger.
- ``run_scaling_study``: ``dp.scaling.scaling_study``, the step time on 1 .. 8 devices.
- ``plot_loss_curves``: lesson 02's loss figure.

With a DDP wrapper (exercise 3.5's ``wrap_ddp``, or what ``mp.yours`` chose in its place):

- ``train_wrapped``: the SPMD program: a replica wrapped once, then training steps;
- ``wrapped_step_on_meta`` / ``run_wrapped_step``: one step of the wrapper on meta tensors;
- ``step_only``: a timeline from the step's first forward on (the start-up broadcast cut);
- ``run_wrapped_demo``: the wrapper against one device on the demo model;
- ``run_scaling_study(..., wrap=...)``: the scaling study with the wrapper's steps;
- ``wrap_ddp`` / ``DDPWrapper``: the package's wrapper, the reference of exercise 3.5
  (``mpgpu_edu.dp.wrapper``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from mpgpu_edu.cluster import Cluster, first_devices
from mpgpu_edu.collectives import all_reduce
from mpgpu_edu.comm import Communicator, LaunchResult, launch
from mpgpu_edu.replica.data import (DEMO_BATCH, DEMO_LR, DEMO_SIZES, Workload, heavy, light,
                            make_batch, make_batches, make_mlp, shard)
from mpgpu_edu.dp import DEMO_BUCKET_BYTES
from mpgpu_edu.dp import run_demo as dp_run_demo
from mpgpu_edu.dp.dataparallel import dataparallel_step
from mpgpu_edu.dp.ddp import (StepFn, ddp_step_overlapped, forward_backward, optimizer_step,
                              train_ddp)
from mpgpu_edu.dp.scaling import PRESETS, WORLD_SIZES, scaling_study
from mpgpu_edu.dp.wrapper import DDPWrapper, wrap_ddp
from mpgpu_edu.comm.torch_threads import one_torch_thread
from mpgpu_edu.viz.server import plot_loss_curves
from mpgpu_edu.memory.measure import track_gradients, track_optimizer_state, track_parameters
from mpgpu_edu.replica.reference import (batch_for_step, compare_to_reference, make_optimizer,
                                 named_params, train_single)
from mpgpu_edu.cluster.trace import Event, Trace, merged_intervals
from mpgpu_edu.viz import plot_timelines_side_by_side

__all__ = ["deep", "hidden_comm_seconds", "plot_loss_curves", "plot_steps", "whose",
           "recipe_step", "run_demo", "run_recipe", "run_scaling_study", "run_step",
           "run_training", "run_wrapped_demo", "run_wrapped_step", "step_on_meta", "step_only",
           "train_wrapped", "wrap_ddp", "wrapped_step_on_meta", "DDPWrapper"]

Wrap = Callable[[Communicator, nn.Module, int], Any]  # exercise 3.5's wrap_ddp

RECIPE_LR = 0.05


# ---- the recipe, move by move ---------------------------------------------------------------

def recipe_step(comm: Communicator, seed: int = 0) -> dict:
    """One data-parallel training step on the demo model and one demo batch:

    1. *replica*: every rank builds the same model (same seed);
    2. *split the batch*: rank r takes shard r of the batch;
    3. *average the gradients*: forward and backward on the shard, then an all-reduce
       (mean) of every gradient;
    4. *identical update*: every rank applies the same SGD step to its replica.

    Returns what this rank saw: its samples, its first weight's gradient before and after
    averaging (``grad_norm_local``, ``grad_norm_mean``), and its parameters after the update
    (``params``, one flat tensor)."""
    model = make_mlp(DEMO_SIZES, seed)
    optimizer = make_optimizer("sgd", model.parameters(), RECIPE_LR)
    batch = make_batch(DEMO_BATCH, DEMO_SIZES[0], DEMO_SIZES[-1], seed)
    (x, y), share = shard(batch, comm.rank, comm.world_size)
    sizes = [len(part) for part in torch.tensor_split(batch[0], comm.world_size)]
    first = sum(sizes[:comm.rank])
    forward_backward(comm, model, x, y, share * comm.world_size)
    weight = next(model.parameters())
    local = weight.grad.norm().item()
    for p in model.parameters():
        all_reduce(comm, p.grad, "mean")
    mean = weight.grad.norm().item()
    optimizer_step(comm, optimizer)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {"samples": (first, first + len(x)), "grad_norm_local": local, "grad_norm_mean": mean,
            "params": params}


def run_recipe(cluster: Cluster | str, world_size: int | None = None) -> LaunchResult:
    """``recipe_step`` on the first ``world_size`` devices of ``cluster``."""
    with one_torch_thread():
        return launch(recipe_step, first_devices(cluster, world_size))


# ---- one step on meta tensors, memory recorded ------------------------------------------------

def step_on_meta(comm: Communicator, workload: Workload, step_fn: StepFn | None,
                 optimizer: str = "adam", steps: int = 2) -> None:
    """Every rank: a meta replica of the workload's model, its parameters and gradients
    recorded, then ``steps`` training steps on a meta batch: ``nn.DataParallel``'s when
    ``step_fn`` is None (the optimizer, and its state, on device 0 only), else ``step_fn``
    (a DDP step: an optimizer on every rank). The optimizer state is recorded once the first
    step has created it (Adam: two moments per parameter), so from the second step on the
    ledger holds everything at once, as in a long run."""
    model = workload.model("meta")
    track_parameters(comm, model)
    track_gradients(comm, model)
    batch = workload.make_batch("meta")
    on_this_rank = step_fn is not None or comm.rank == 0
    opt = make_optimizer(optimizer, model.parameters(), 0.01) if on_this_rank else None
    state = None
    for _ in range(steps):
        if step_fn is None:
            dataparallel_step(comm, model, opt, batch)
        else:
            step_fn(comm, model, opt, batch)
        if opt is not None and state is None:
            state = track_optimizer_state(comm, opt)


def run_step(workload: Workload, cluster: Cluster | str, step_fn: StepFn | None,
             world_size: int | None = None, optimizer: str = "adam",
             steps: int = 1) -> LaunchResult:
    """``step_on_meta`` on the first ``world_size`` devices of ``cluster``: ``steps``
    steps (one by default: its timeline is one step's)."""
    with one_torch_thread():
        return launch(step_on_meta, first_devices(cluster, world_size), workload, step_fn,
                      optimizer, steps)


def deep(batch: int = 32768) -> Workload:
    """24 layers of 512 x 512: 6.3 M parameters in 48 tensors (25 MB of fp32 gradients,
    like ``data.light()``), so a step has many gradients to average, not three big ones."""
    return Workload("deep", (512,) * 25, batch)


# ---- reading a timeline -----------------------------------------------------------------------

def hidden_comm_seconds(trace: Trace, device: int) -> float:
    """Seconds during which ``device`` communicated *while* its compute stream was busy:
    communication hidden under compute, which costs the step nothing."""
    compute = merged_intervals([(e.start, e.end) for e in trace.on(device, "compute")])
    hidden = 0.0
    for start, end in merged_intervals([(e.start, e.end) for e in trace.on(device, "comm")]):
        hidden += sum(max(0.0, min(end, b) - max(start, a)) for a, b in compute)
    return hidden


def plot_steps(traces: dict[str, Trace], devices: Sequence[int] | None = None) -> Any:
    """``plot_timelines_side_by_side`` of several steps, with a dashed line at the end of
    *every* step, the longest included (the shared axis ends there too)."""
    fig = plot_timelines_side_by_side(traces, devices=devices)
    longest = max(t.makespan for t in traces.values())
    for ax, trace in zip(fig.axes, traces.values()):
        if trace.makespan >= longest:
            ax.axvline(trace.makespan, color="black", linestyle="--", linewidth=1)
    if fig.axes:
        fig.axes[0].set_xlim(right=longest * 1.02)  # the longest step's line off the edge
    return fig


def whose(chosen: Any) -> str:
    """A short figure title for what ``mp.yours`` chose: "your DDP wrapper", or "reference
    DDP wrapper (yours: not yet)" (``chosen.note`` says more, for a printed line)."""
    return chosen.label


# ---- whole runs -------------------------------------------------------------------------------

def run_demo(backend: str, world_size: int, steps: int, optimizer: str,
             **options: Any) -> dict:
    """``dp.run_demo`` on one torch thread: DDP (option ``variant``, default "overlapped") on
    ``world_size`` ranks trains the demo model for ``steps`` steps; the report compares with
    one device (``train_single``)."""
    with one_torch_thread():
        return dp_run_demo(backend, world_size, steps, optimizer, **options)


def run_training(cluster: Cluster | str, sizes: Sequence[int], batch: int, steps: int,
                 optimizer: str = "adam", step_fn: StepFn = ddp_step_overlapped,
                 lr: float = 1e-3) -> LaunchResult:
    """Real DDP training (``dp.train_ddp``, real tensors) of ``make_mlp(sizes)`` for
    ``steps`` steps of ``batch`` samples on every device of ``cluster``; each rank's ledger
    records its parameters, gradients, optimizer state, activations and buckets."""
    batches = make_batches(steps, batch, sizes[0], sizes[-1])
    with one_torch_thread():
        return launch(train_ddp, cluster, step_fn, functools.partial(make_mlp, sizes),
                      batches, optimizer, lr)


def run_scaling_study(workloads: Sequence[Workload] | None = None,
                      presets: Sequence[str] = PRESETS,
                      world_sizes: Sequence[int] = WORLD_SIZES, wrap: Wrap | None = None,
                      bucket_bytes: int = 25 * 2**20) -> dict[str, dict[int, float]]:
    """``dp.scaling.scaling_study`` (one overlapped DDP step per point, meta tensors):
    ``{"light model, 8xRTX4090-pcie": {1: seconds, 2: ...}, ...}`` for ``plot_scaling``.
    With ``wrap`` (a DDP wrapper), every point is instead one step of ``wrap``'s replica,
    timed from its first forward (``run_wrapped_step``, ``step_only``)."""
    if wrap is None:
        with one_torch_thread():
            return scaling_study(workloads, presets, world_sizes)
    workloads = list(workloads) if workloads is not None else [light(), heavy()]
    return {f"{w.name} model, {preset}": {
        n: step_only(run_wrapped_step(w, preset, wrap, bucket_bytes, n).trace).makespan
        for n in world_sizes} for w in workloads for preset in presets}


# ---- a DDP wrapper at work ---------------------------------------------------------------------

def train_wrapped(comm: Communicator, wrap: Wrap, model_fn: Callable[[], nn.Module],
                  batches: Sequence[Any], optimizer: str = "sgd", lr: float = DEMO_LR,
                  bucket_bytes: int = DEMO_BUCKET_BYTES) -> dict:
    """Every rank: build a replica and wrap it once (``wrap`` broadcasts rank 0's
    parameters), then per batch: forward and backward on this rank's shard, its loss scaled
    by its share of the samples, ``finish()``, the optimizer step.

    Returns ``{"params": {name: tensor}, "losses": [whole-batch loss of every step]}``."""
    model = model_fn().to(comm.device)
    replica = wrap(comm, model, bucket_bytes)
    opt = make_optimizer(optimizer, model.parameters(), lr)
    losses = []
    for step in range(len(batches)):
        (x, y), share = shard(batch_for_step(batches, step), comm.rank, comm.world_size)
        losses.append(forward_backward(comm, replica, x, y, share * comm.world_size) * share)
        replica.finish()
        optimizer_step(comm, opt)
    total = torch.stack(losses)
    all_reduce(comm, total, "sum")
    return {"params": named_params(model), "losses": total.tolist()}


def run_wrapped_demo(backend: str, world_size: int, steps: int, optimizer: str, *,
                     wrap: Wrap, **_: Any) -> dict:
    """``run_demo`` with the DDP wrapper ``wrap``: ``train_wrapped`` on the demo model against
    one device (``train_single``), the report of ``compare_to_reference``."""
    model_fn = functools.partial(make_mlp, DEMO_SIZES)
    batches = make_batches(steps, DEMO_BATCH, DEMO_SIZES[0], DEMO_SIZES[-1])
    with one_torch_thread():
        run = launch(train_wrapped, world_size, wrap, model_fn, batches, optimizer, DEMO_LR,
                     backend=backend)
    result = run.results[0]
    return compare_to_reference("ddp", backend, world_size, optimizer, result["params"],
                                result["losses"],
                                train_single(model_fn, batches, optimizer, DEMO_LR))


def wrapped_step_on_meta(comm: Communicator, workload: Workload, wrap: Wrap,
                         bucket_bytes: int, optimizer: str = "sgd") -> None:
    """Every rank: a meta replica of the workload's model, wrapped; a barrier, so that every
    rank starts the step together; then one training step on a meta batch."""
    model = workload.model("meta")
    replica = wrap(comm, model, bucket_bytes)
    opt = make_optimizer(optimizer, model.parameters(), 0.01)
    comm.barrier()
    (x, y), share = shard(workload.make_batch("meta"), comm.rank, comm.world_size)
    forward_backward(comm, replica, x, y, share * comm.world_size)
    replica.finish()
    optimizer_step(comm, opt)


def run_wrapped_step(workload: Workload, cluster: Cluster | str, wrap: Wrap,
                     bucket_bytes: int, world_size: int | None = None) -> LaunchResult:
    """``wrapped_step_on_meta`` on the first ``world_size`` devices of ``cluster``."""
    with one_torch_thread():
        return launch(wrapped_step_on_meta, first_devices(cluster, world_size), workload,
                      wrap, bucket_bytes)


def step_only(trace: Trace) -> Trace:
    """The part of ``trace`` from the first forward on, shifted to start at 0: a wrapped
    step without the broadcast that built the replicas."""
    start = min((e.start for e in trace.events if e.kind == "forward"), default=0.0)
    events = [Event(e.device, e.stream, e.kind, max(e.start, start) - start, e.end - start,
                    e.label, e.nbytes, e.flops, e.peer)
              for e in trace.events if e.end > start]
    return Trace(trace.n_devices, events, [], trace.source, dict(trace.meta))
