"""Does adding devices pay? DDP step time against world size, on simulated clusters.

Strong scaling: the global batch stays the same, so with N devices each computes 1/N of it,
but every step still all-reduces the whole gradient. A light workload (little compute per
byte of gradient) on consumer PCIe cards, where every GPU-to-GPU copy is staged through the
host memory all the cards share (and, on the two-socket 8-card box, crosses the ~10 GB/s link
between the CPUs), spends more time averaging than it saves computing: more devices make it
*slower* (the seed's first pitfall). A heavy workload on NVSwitch hides the all-reduce behind
compute and scales almost perfectly.

Each point runs the real ``ddp_step_overlapped`` (hooks, buckets, ring all-reduce on the comm
stream) once on the simulator, with *meta* tensors: shapes without data, so FLOPs and bytes
are exact and an 8-rank step of a model with millions of parameters takes a fraction of a
second. The step time is the simulated makespan of that one step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.comm import launch
from mpgpu_edu.comm.base import Communicator
from mpgpu_edu.replica.data import Workload, heavy, light
from mpgpu_edu.dp.ddp import StepFn, ddp_step_overlapped

PRESETS = ("8xRTX4090-pcie", "8xH100-nvswitch")
WORLD_SIZES = (1, 2, 4, 8)


def one_step_on_meta(comm: Communicator, workload: Workload, step_fn: StepFn) -> None:
    """Every rank: a meta replica of the workload's model, one DDP step on a meta batch."""
    model = workload.model("meta")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step_fn(comm, model, optimizer, workload.make_batch("meta"))


def ddp_step_time(workload: Workload, preset: str, world_size: int,
                  step_fn: StepFn = ddp_step_overlapped) -> float:
    """Simulated seconds of one DDP step of ``workload`` on the first ``world_size`` devices
    of the cluster ``preset`` (as ``CUDA_VISIBLE_DEVICES=0,..,N-1`` would pick them)."""
    visible = ",".join(str(d) for d in range(world_size))
    cluster = Cluster.preset(preset, visible=visible)
    return launch(one_step_on_meta, cluster, workload, step_fn).trace.makespan


def scaling_study(workloads: Sequence[Workload] | None = None,
                  presets: Sequence[str] = PRESETS,
                  world_sizes: Sequence[int] = WORLD_SIZES,
                  step_fn: StepFn = ddp_step_overlapped) -> dict[str, dict[int, float]]:
    """``{"light model, 8xRTX4090-pcie": {1: t1, 2: t2, ...}, ...}``: one series per
    workload and cluster, step time in seconds per world size. Pass it to
    ``mpgpu_edu.viz.scaling.plot_scaling``."""
    workloads = list(workloads) if workloads is not None else [light(), heavy()]
    return {f"{w.name} model, {preset}": {n: ddp_step_time(w, preset, n, step_fn)
                                          for n in world_sizes}
            for w in workloads for preset in presets}


def speedup_and_efficiency(step_times: dict[int, float]) -> dict[int, tuple[float, float]]:
    """``{N: (t1 / tN, t1 / (N tN))}``: speedup (ideal N) and efficiency (ideal 1)."""
    t1 = step_times[1]
    return {n: (t1 / t, t1 / (n * t)) for n, t in sorted(step_times.items())}
