"""Lesson 03's demos: the data-parallel recipe, DataParallel against DDP, and what DDP's
refinements hide.

- ``recipe_step`` / ``run_recipe``: one data-parallel step on the demo model, written out in
  its four moves (replica, shard, average, update), reporting what each rank holds.
- ``step_on_meta`` / ``run_step``: one step of ``nn.DataParallel`` (``dp.dataparallel_step``)
  or of a DDP step function on meta tensors (shapes without data), with parameters,
  gradients, optimizer state, activations and buckets recorded in the memory ledger.
- ``deep``: a workload of many small layers, where buckets and overlap show.
- ``hidden_comm_seconds``: communication that ran under compute, costing no time.
- ``run_demo``: ``dp.run_demo`` (a DDP variant against one device on the demo model).
- ``run_training``: real DDP training with every tensor in the memory ledger.
- ``run_scaling_study``: ``dp.scaling.scaling_study``, the step time on 1 .. 8 devices.
- ``plot_loss_curves``: lesson 02's loss figure.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives import all_reduce
from mpgpu_edu.comm import Communicator, LaunchResult, launch
from mpgpu_edu.data import (DEMO_BATCH, DEMO_SIZES, Workload, make_batch, make_batches,
                            make_mlp, shard)
from mpgpu_edu.dp import run_demo as dp_run_demo
from mpgpu_edu.dp.dataparallel import dataparallel_step
from mpgpu_edu.dp.ddp import (StepFn, ddp_step_overlapped, forward_backward, optimizer_step,
                              train_ddp)
from mpgpu_edu.dp.scaling import PRESETS, WORLD_SIZES, scaling_study
from mpgpu_edu.lessons.l01 import first_devices
from mpgpu_edu.lessons.l02 import one_torch_thread, plot_loss_curves
from mpgpu_edu.memory.measure import track_gradients, track_optimizer_state, track_parameters
from mpgpu_edu.reference import make_optimizer
from mpgpu_edu.trace import Trace

__all__ = ["deep", "hidden_comm_seconds", "plot_loss_curves", "recipe_step", "run_demo",
           "run_recipe", "run_scaling_study", "run_step", "run_training", "step_on_meta"]

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

def _merged(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def hidden_comm_seconds(trace: Trace, device: int) -> float:
    """Seconds during which ``device`` communicated *while* its compute stream was busy:
    communication hidden under compute, which costs the step nothing."""
    compute = _merged([(e.start, e.end) for e in trace.on(device, "compute")])
    hidden = 0.0
    for start, end in _merged([(e.start, e.end) for e in trace.on(device, "comm")]):
        hidden += sum(max(0.0, min(end, b) - max(start, a)) for a, b in compute)
    return hidden


# ---- whole runs -------------------------------------------------------------------------------

def run_demo(world_size: int, steps: int, optimizer: str,
             variant: str = "overlapped") -> dict:
    """``dp.run_demo`` on the simulator: DDP (``variant``) on ``world_size`` ranks trains the
    demo model for ``steps`` steps; the report compares with one device (``train_single``)."""
    with one_torch_thread():
        return dp_run_demo("sim", world_size, steps, optimizer, variant=variant)


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
                      world_sizes: Sequence[int] = WORLD_SIZES) -> dict[str, dict[int, float]]:
    """``dp.scaling.scaling_study`` (one overlapped DDP step per point, meta tensors):
    ``{"light model, 8xRTX4090-pcie": {1: seconds, 2: ...}, ...}`` for ``plot_scaling``."""
    with one_torch_thread():
        return scaling_study(workloads, presets, world_sizes)
