"""Lesson 00's demos: split the work and combine it, and a GPU that waits for its data.

Both are SPMD programs for ``mpgpu_edu.launch`` on the simulator: times are given in seconds
(from the hardware profiles, or from an assumption the notebook states) and tensors are meta
tensors, so the timelines show the *shape* of a run, not a measurement.

- ``split_then_combine``: every rank does 1/N of each step's compute, then the ranks
  all-reduce the gradients (data parallel in one picture; built in lesson 03).
- ``input_pipeline``: ranks 0 .. N-2 are data-loader workers (CPU processes), the last rank
  is the GPU. A worker prepares a batch, then hands it to the GPU; the GPU trains on each
  batch as it arrives. When loading is slower than training, the GPU sits idle.

And, for exercises 0.1 and 0.2, the reference of 0.2 (``device_ids_for``) and a planner
(``data_parallel_plan``) that takes the parser and the ``device_ids`` function as
parameters, so that the notebook can run the learner's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from matplotlib.figure import Figure

from mpgpu_edu.cluster import Cluster, device_ids_to_physical
from mpgpu_edu.collectives import all_reduce
from mpgpu_edu.comm import Communicator, LaunchResult, launch
from mpgpu_edu.cluster.hardware import LINKS
from mpgpu_edu.viz.timeline import plot_timeline

FORWARD_SHARE = 1 / 3  # backward costs about twice the forward: 2 of every 3 FLOPs


def split_then_combine(comm: Communicator, steps: int, step_seconds: float,
                       grad_numel: int) -> None:
    """``steps`` training steps whose compute (``step_seconds`` on one device) is split
    evenly over the ranks; after each step's backward the ranks all-reduce ``grad_numel``
    fp32 gradients (a meta tensor: timed, never allocated).
    Cost per step: step_seconds / N + one ring all-reduce of 4 * grad_numel bytes (none on
    one device: there is nothing to combine)."""
    share = step_seconds / comm.world_size
    grads = torch.empty(grad_numel, dtype=torch.float32, device="meta")
    for step in range(steps):
        with comm.compute("forward", f"F{step}", seconds=share * FORWARD_SHARE):
            pass
        with comm.compute("backward", f"B{step}", seconds=share * (1 - FORWARD_SHARE)):
            pass
        if comm.world_size > 1:
            all_reduce(comm, grads, op="mean", algo="ring")


def input_pipeline(comm: Communicator, steps: int, load_seconds: float,
                   compute_seconds: float, batch_bytes: int) -> None:
    """Ranks ``0 .. N-2`` load batches, the last rank (the GPU) trains on them.

    Loader ``w`` prepares batches ``w, w + W, w + 2W, ...`` (W = N - 1 loaders), each taking
    ``load_seconds``, and sends each (``batch_bytes``, over the host-to-GPU link) to the GPU;
    a blocking send means a loader runs at most one batch ahead. The GPU receives batch i
    from loader ``i % W`` and computes for ``compute_seconds``.
    Steady state: the GPU is busy ``min(1, W * compute_seconds / load_seconds)`` of the time.
    """
    loaders = comm.world_size - 1
    if loaders < 1:
        raise ValueError("input_pipeline needs at least 2 ranks: loaders, then the GPU")
    batch = torch.empty(batch_bytes, dtype=torch.uint8, device="meta")
    gpu = comm.world_size - 1
    if comm.rank == gpu:
        for step in range(steps):
            comm.recv(batch, step % loaders)
            with comm.compute("compute", f"step {step}", seconds=compute_seconds):
                pass
        return
    for step in range(comm.rank, steps, loaders):
        with comm.compute("data", f"batch {step}", seconds=load_seconds):
            pass
        comm.send(batch, gpu)


def pipeline_cluster(loaders: int) -> Cluster:
    """``loaders`` CPU workers and one GPU; each worker reaches the GPU over its own PCIe 4
    x16 link, at the preset link's figures (``LINKS["pcie4-x16"]``: alpha 11 us, 24 GB/s
    effective of 31.5 GB/s peak). A uniform cluster: the workers' copies do not share the
    GPU's uplink or host memory, so the copy time is the single-link lower bound."""
    link = LINKS["pcie4-x16"]
    return Cluster.uniform(loaders + 1, alpha_s=link.alpha_s, beta_Bps=link.beta_Bps,
                           gpu="RTX4090-24GB")


def run_input_pipeline(load_seconds: float, compute_seconds: float, loaders: int = 1,
                       steps: int = 8, batch_bytes: int = 256 * 3 * 224 * 224) -> LaunchResult:
    """Simulate ``steps`` steps of ``input_pipeline`` with ``loaders`` workers. The default
    batch is 256 images of 3 x 224 x 224 bytes (38.5 MB of uint8 pixels)."""
    return launch(input_pipeline, pipeline_cluster(loaders), steps, load_seconds,
                  compute_seconds, batch_bytes)


def pipeline_names(loaders: int) -> list[str]:
    """Row names for ``input_pipeline``'s ranks: ``loader 0 .. loader W-1``, then ``GPU``."""
    return [f"loader {w}" for w in range(loaders)] + ["GPU"]


def gpu_idle_fraction(result: LaunchResult) -> float:
    """Share of the run during which the GPU (the last rank) computed nothing."""
    return result.trace.idle_fraction(result.trace.n_devices - 1)


def gpu_idle_after_first_batch(result: LaunchResult) -> float:
    """Share of the time from the GPU's first step to the end during which it computed
    nothing: the steady state, without the wait for the very first batch."""
    trace = result.trace
    steps = trace.on(trace.n_devices - 1, "compute")
    if not steps:
        return 0.0
    window = trace.makespan - steps[0].start
    busy = trace.busy(trace.n_devices - 1)
    return 1.0 - busy / window if window > 0 else 0.0


def idle_summary(result: LaunchResult) -> str:
    """The GPU's idle share of the whole run and after its first batch, in one phrase."""
    return (f"GPU idle {gpu_idle_fraction(result):.0%} of the run, "
            f"{gpu_idle_after_first_batch(result):.0%} after the first batch")


def step_seconds_in_steady_state(result: LaunchResult) -> float:
    """Time per training step once the pipeline runs: from the GPU's first step's start to
    the end, divided by the steps after the first."""
    trace = result.trace
    steps = trace.on(trace.n_devices - 1, "compute")
    if len(steps) < 2:
        return trace.makespan
    return (steps[-1].end - steps[0].end) / (len(steps) - 1)


def plot_input_pipeline(result: LaunchResult, title: str | None = None,
                        copies: bool = False) -> Figure:
    """The compute rows of an ``input_pipeline`` run: loaders' ``data`` bars above, the GPU's
    training steps and its idle share below; with ``copies``, each device's comm row too,
    where every batch's copy to the GPU shows as a send and a receive. The title (``title``
    goes before it) states the two numbers ``idle_summary`` prints, so figure and printout
    always agree."""
    loaders = result.trace.n_devices - 1
    workers = f"{loaders} loader worker{'s' if loaders != 1 else ''} feeding one GPU"
    title = f"{title or workers}: {idle_summary(result)}"
    return plot_timeline(result.trace, streams=("compute", "comm") if copies else ("compute",),
                         device_names=pipeline_names(loaders), title=title)


def epoch_seconds(cluster: Cluster, flops: float, devices: Sequence[int],
                  dtype: str = "bf16") -> dict[int, float]:
    """``{N: seconds}`` to do ``flops`` of training split evenly over N devices of
    ``cluster``'s kind, counting compute only (``cluster.compute_seconds(flops / N)``): the
    ideal that communication (lesson 01) then eats into."""
    return {n: cluster.compute_seconds(flops / n, dtype) for n in devices}


def device_ids_for(visible: list[int], physical_gpus: list[int]) -> list[int]:
    """The reference of exercise 0.2: the logical ids (``device_ids``) of the physical GPUs
    ``physical_gpus`` in a process that sees ``visible``; ``ValueError`` for one it cannot
    see."""
    missing = [gpu for gpu in physical_gpus if gpu not in visible]
    if missing:
        raise ValueError(f"GPU {missing[0]} is not visible to this process (visible: {visible})")
    return [visible.index(gpu) for gpu in physical_gpus]


def data_parallel_plan(value: str | None, want: list[int], n_physical: int,
                       parse: Callable[[str | None, int], list[int]],
                       ids_for: Callable[[list[int], list[int]], list[int]]) -> str:
    """One line: under ``CUDA_VISIBLE_DEVICES=value`` on ``n_physical`` GPUs, which
    ``device_ids`` make ``nn.DataParallel`` run on the physical GPUs ``want``. ``parse``
    (exercise 0.1) gives what the process sees, ``ids_for`` (exercise 0.2) the ids; the
    package's ``device_ids_to_physical`` then says where those ids really run."""
    shown = "unset" if value is None else repr(value)
    visible = parse(value, n_physical)
    head = f"CUDA_VISIBLE_DEVICES={shown:11} sees {visible}, want GPUs {want}: "
    try:
        ids = ids_for(visible, want)
    except ValueError as error:
        return head + f"no device_ids will do ({error})"
    line = head + (f"device_ids={ids} -> runs on physical GPUs "
                   f"{device_ids_to_physical(ids, visible)}")
    # device_ids[0] is DataParallel's primary device: the model must be there
    return line + (f", model on cuda:{ids[0]}" if ids and ids[0] != 0 else "")
