"""Lesson 04's demos: a model split layer by layer, who waits for whom, and what the bubble costs.
Its figures (``plot_stage_costs``, ``plot_flow``, ...) are ``mpgpu_edu.viz.stages``'s.

- ``seed_model``: the seed's deep network, layers named ``"1" .. "30"``, so a placement reads
  "layers 1-10 on cuda:0"; ``uneven_model``: layers of very different sizes, to balance.
- ``run_step``: one training step of a small model through the package's pipeline executor on
  the simulator, each stage taking fixed seconds for the whole batch (shared out over the
  microbatches), so every schedule processes the same work.
- ``describe_messages``: the activations each stage sends forward and the gradients it
  sends back.
- ``bubble_rows``: the two bubble formulas against measured schedules (``plot_bubble``).
- ``timed_trace``: a schedule on the clock of a real link (send = alpha + bytes / beta).
- ``executor_step`` / ``run_executor_step``: one training step run by an executor with
  exercise 4.5's signature (the learner's, or ``reference_executor``, the package's), each
  stage a ``TrackedStage`` that records its activations from the forward until the executor
  lets go of them; ``microbatches_held`` reads the runs.
"""

from __future__ import annotations

import copy
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.comm import Communicator, LaunchResult, launch, nbytes_of
from mpgpu_edu.replica.data import loss_fn, make_batch, make_mlp
from mpgpu_edu.memory.measure import track_gradients, track_parameters
from mpgpu_edu.pipeline import (LayerCost, Schedule, Step, gpipe, one_f_one_b, partition_balanced,
                                schedule_timeline, split_module, steps_of, timeline_trace)
from mpgpu_edu.pipeline.executor import run_schedule, split_batch, stage_inputs_like
from mpgpu_edu.pipeline.runner import train_pipeline
from mpgpu_edu.cluster.trace import Trace
from mpgpu_edu.viz.palette import format_bytes, format_seconds
from mpgpu_edu.viz.stages import (message_kind, plot_flow, plot_link_timelines, plot_memory_runs,
                                  plot_stage_costs, plot_timeline_runs, stage_messages)

BATCH_SECONDS = (0.016, 0.032)  # one stage's forward and backward of the whole batch
STEP_SIZES = (16, 64, 64, 64, 64, 64, 64, 64, 8)  # 8 Linear layers: 15 children with the ReLUs
STEP_BATCH = 1024  # large enough that a stage's activations outweigh its parameters
UNEVEN_WIDTHS = (512, 768, 768, 512, 512, 512, 256, 256, 256, 256, 256, 256, 32)


# ---- models to split ---------------------------------------------------------------------------

def seed_model(n_layers: int = 30, width: int = 64) -> nn.Sequential:
    """``n_layers`` blocks of ``Linear(width, width)`` + ReLU, named ``"1" .. "n_layers"``."""
    blocks = ((str(i), nn.Sequential(nn.Linear(width, width), nn.ReLU()))
              for i in range(1, n_layers + 1))
    return nn.Sequential(OrderedDict(blocks))


def uneven_model(widths: Sequence[int] = UNEVEN_WIDTHS) -> nn.Sequential:
    """Linear layers of the given widths, one block each (Linear + ReLU, the last Linear
    alone), named ``"1"``, ``"2"``, ...: the first layers are the widest and hold most of the
    parameters."""
    pairs = list(zip(widths, widths[1:]))
    blocks = [(str(i + 1), nn.Sequential(nn.Linear(a, b), nn.ReLU()) if i < len(pairs) - 1
               else nn.Linear(a, b)) for i, (a, b) in enumerate(pairs)]
    return nn.Sequential(OrderedDict(blocks))


# ---- the package's answers to exercises 4.1-4.3, with the exercises' signatures ---------------

def reference_boundaries(costs: Sequence[float], n_stages: int) -> list[int]:
    """Exercise 4.1's answer from the package (``partition_balanced`` on these costs)."""
    layers = [LayerCost(str(i), n_params=cost, flops=0) for i, cost in enumerate(costs)]
    return [int(stage.layers[0]) for stage in partition_balanced(layers, n_stages).stages[1:]]


def reference_gpipe_orders(n_stages: int, n_microbatches: int) -> list[list[Step]]:
    """Exercise 4.2's answer from the package: each device's steps of ``gpipe``."""
    schedule = gpipe(n_stages, n_microbatches)
    return [steps_of(schedule, device) for device in range(n_stages)]


def reference_one_f_one_b_orders(n_stages: int, n_microbatches: int) -> list[list[Step]]:
    """Exercise 4.3's answer from the package: each device's steps of ``one_f_one_b``."""
    schedule = one_f_one_b(n_stages, n_microbatches)
    return [steps_of(schedule, device) for device in range(n_stages)]


# ---- one training step through the executor --------------------------------------------------

def run_step(schedule: Schedule, cluster: Cluster | str = "4xRTX4090-pcie",
             batch_seconds: tuple[float, float] = BATCH_SECONDS) -> LaunchResult:
    """One training step (plain SGD) of ``make_mlp(STEP_SIZES)`` split into
    ``schedule.n_stages`` balanced stages, run by the package's executor on the simulator.

    Every stage takes ``batch_seconds`` (forward, backward) for the whole batch, so a
    microbatch takes ``batch_seconds / M``: the schedules do the same work, only its order
    differs. Messages carry the real activations and gradients."""
    machine = Cluster.preset(cluster) if isinstance(cluster, str) else cluster
    p, m = schedule.n_stages, schedule.n_microbatches
    machine = machine.with_visible(",".join(str(machine.physical(d)) for d in range(p)))
    model = make_mlp(STEP_SIZES, seed=0)
    seconds = (batch_seconds[0] / m, batch_seconds[1] / m)
    batch = make_batch(STEP_BATCH, STEP_SIZES[0], STEP_SIZES[-1], seed=0)
    return launch(train_pipeline, machine, model, [batch], schedule, partition_balanced(model, p),
                  None, loss_fn, seconds)


def describe_messages(result: LaunchResult) -> str:
    """Every message of the run, in time order: when, from which device to which, what it
    carries (activations go to the next stage, gradients back to the previous one), bytes."""
    lines = []
    for e in stage_messages(result.trace):
        arrow = "->" if e.peer > e.device else "<-"
        pair = (f"dev {e.device} -> dev {e.peer}" if arrow == "->"
                else f"dev {e.peer} <- dev {e.device}")
        lines.append(f"{format_seconds(e.start):>9}  {pair}  {message_kind(e):11} "
                     f"{format_bytes(e.nbytes):>9}, arrives after {format_seconds(e.duration)}")
    return "\n".join(lines)


# ---- the bubble ----------------------------------------------------------------------------------

def bubble_rows(n_stages: int, microbatches: Sequence[int], forward_s: float = 1.0,
                backward_s: float = 2.0) -> list[dict]:
    """For GPipe with each M: the measured idle share (idle / total) and overhead (idle / ideal
    compute) of ``schedule_timeline``, and the two closed forms (P-1)/(M+P-1) and (P-1)/M."""
    rows = []
    for m in microbatches:
        timeline = schedule_timeline(gpipe(n_stages, m), forward_s, backward_s)
        makespan = max(t.end for t in timeline)
        ideal = m * (forward_s + backward_s)
        rows.append({"M": m, "makespan": makespan, "ideal": ideal,
                     "idle_share": (makespan - ideal) / makespan,
                     "idle_formula": (n_stages - 1) / (m + n_stages - 1),
                     "overhead": (makespan - ideal) / ideal,
                     "overhead_formula": (n_stages - 1) / m})
    return rows


def timed_trace(schedule: Schedule, cluster: Cluster | str, forward_s: float, backward_s: float,
                nbytes: int) -> tuple[Trace, float]:
    """``schedule`` on the clock: every step as soon as its device is free and its input has
    arrived, each message taking ``alpha + nbytes / beta`` on the cluster's link between
    devices 0 and 1 (the same link between every pair of stages). Returns (trace, send seconds).
    """
    machine = Cluster.preset(cluster) if isinstance(cluster, str) else cluster
    send_s = machine.route(0, 1).seconds(nbytes)
    timeline = schedule_timeline(schedule, forward_s, backward_s, send_s)
    return timeline_trace(timeline, schedule.n_stages), send_s


# ---- an executor of exercise 4.5 on the clock ---------------------------------------------------

Executor = Callable[..., Any]  # exercise 4.5's signature: execute_schedule


class TrackedStage(nn.Module):
    """A stage that records what autograd saves in its forward (the parameters aside) as
    "activations" memory, from the forward until the executor lets go of that microbatch: the
    record is freed when the tensors the forward handed out (its output and, on a later
    stage, the received input) are collected, not when the schedule says B. So the memory
    timeline shows what the executor really keeps alive. (The package's executor records its
    own, freed at each B.)"""

    def __init__(self, inner: nn.Module, comm: Communicator) -> None:
        super().__init__()
        self.inner, self.comm, self.calls = inner, comm, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        seen = {w.data_ptr() for w in self.inner.parameters()}
        nbytes = 0

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            nonlocal nbytes
            if tensor.data_ptr() not in seen:
                seen.add(tensor.data_ptr())
                nbytes += nbytes_of(tensor)
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            y = self.inner(x)
        token = self.comm.memory.alloc("activations", nbytes,
                                       f"stage {self.comm.rank} forward {self.calls}")
        # a received input requires grad; the caller's microbatches (stage 0) never do
        watched = [y, x] if x.requires_grad else [y]
        _free_when_collected(self.comm, token, watched)
        return y


def _free_when_collected(comm: Communicator, token: int, tensors: Sequence[torch.Tensor]
                         ) -> None:
    """Free ``token`` once every tensor in ``tensors`` has been collected."""
    left = [len(tensors)]

    def one_gone() -> None:
        left[0] -= 1
        if left[0] == 0:
            try:
                comm.memory.free(token)
            except Exception:  # noqa: BLE001 - collected after the run ended: nothing to record
                pass

    for tensor in tensors:
        weakref.finalize(tensor, one_gone)


def reference_executor(comm: Communicator, schedule: Schedule, stage: nn.Module,
                       microbatches: Sequence[torch.Tensor] | None,
                       targets: Sequence[torch.Tensor] | None,
                       recv_shapes: Sequence[tuple[int, ...]] | None,
                       loss_fn: Callable = nn.functional.mse_loss,
                       stage_seconds: tuple[float, float] | None = None) -> float | None:
    """The package's ``run_schedule`` with exercise 4.5's signature and loss convention (the
    mean over microbatches). It records the activations itself, so a ``TrackedStage`` is
    unwrapped rather than counted twice."""
    inner = stage.inner if isinstance(stage, TrackedStage) else stage
    recv_like = [torch.empty(shape) for shape in recv_shapes] if recv_shapes else None
    n_mbs, total = schedule.n_microbatches, sum(len(t) for t in targets or [])

    def mean_over_microbatches(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # run_schedule weighs microbatch m by len(m) / total; this makes it 1 / M
        return loss_fn(output, target) * total / (len(target) * n_mbs)

    return run_schedule(comm, schedule, inner, microbatches, targets, mean_over_microbatches,
                        recv_like=recv_like, stage_seconds=stage_seconds)


def executor_step(comm: Communicator, executor: Executor, stages: Sequence[nn.Module],
                  schedule: Schedule, batch: torch.Tensor, targets: torch.Tensor,
                  stage_seconds: tuple[float, float] | None = None, lr: float = 0.05
                  ) -> float | None:
    """SPMD: one SGD step of pipeline training, rank p training ``stages[p]``, with
    ``executor`` (exercise 4.5's signature) running ``schedule``. Returns the loss on the last
    stage, None elsewhere."""
    rank, last, n_mbs = comm.rank, comm.rank == schedule.n_stages - 1, schedule.n_microbatches
    stage = TrackedStage(copy.deepcopy(stages[rank]), comm)
    track_parameters(comm, stage)
    track_gradients(comm, stage)
    xs, ys = split_batch(batch, n_mbs), split_batch(targets, n_mbs)
    shapes = ([tuple(t.shape) for t in stage_inputs_like(stages[:rank], xs)] if rank > 0
              else None)
    loss = executor(comm, schedule, stage, xs if rank == 0 else None, ys if last else None,
                    shapes, loss_fn, stage_seconds)
    with torch.no_grad():
        for weight in stage.parameters():
            if weight.grad is not None:
                weight -= lr * weight.grad
    return loss


def run_executor_step(executor: Executor, schedule: Schedule,
                      cluster: Cluster | str = "4xRTX4090-pcie",
                      batch_seconds: tuple[float, float] = BATCH_SECONDS) -> LaunchResult:
    """``executor_step`` on the simulator with ``run_step``'s model, batch and timing: every
    stage takes ``batch_seconds`` for the whole batch, shared out over the microbatches."""
    machine = Cluster.preset(cluster) if isinstance(cluster, str) else cluster
    p, m = schedule.n_stages, schedule.n_microbatches
    machine = machine.with_visible(",".join(str(machine.physical(d)) for d in range(p)))
    model = make_mlp(STEP_SIZES, seed=0)
    stages = split_module(model, partition_balanced(model, p))
    batch, targets = make_batch(STEP_BATCH, STEP_SIZES[0], STEP_SIZES[-1], seed=0)
    seconds = (batch_seconds[0] / m, batch_seconds[1] / m)
    return launch(executor_step, machine, executor, stages, schedule, batch, targets, seconds)


def microbatches_held(trace: Trace, device: int) -> int:
    """The most microbatches whose activations ``device`` held at once (records of the
    "activations" category, one label per microbatch's forward)."""
    held: dict[str, int] = {}
    peak = 0
    for m in sorted((m for m in trace.memory if m.device == device
                     and m.category == "activations"), key=lambda m: m.time):
        held[m.label] = held.get(m.label, 0) + m.delta
        peak = max(peak, sum(1 for nbytes in held.values() if nbytes > 0))
    return peak


