"""One training step of a real model preset on a cluster preset, simulated: time, tokens/s, MFU.

``simulate_step(StepSetup(model="gpt2-small", cluster="8xA100-nvlink", strategy="dp"))`` runs
one step as an SPMD program on the simulator: each layer's forward and backward is a compute
region whose seconds come from its ops on the GPU's roofline (``estimate.costs``), and every
message is a real call of this package's collectives on *meta* tensors of the right size
(shapes, no data), timed by the simulator on the preset's links. So the step's communication
overlaps (or not) with compute exactly as the program says, and the trace is a timeline.

Strategies, on all N devices of the preset, with mixed-precision Adam:

- ``dp``: every rank a replica; ``accumulate`` micro-batches, the last one's backward starts
  each bucket's ring all-reduce (bf16 gradients, buckets of whole layers, at least 25 MiB) on
  the comm stream as soon as its layers are done (DDP's overlap; earlier micro-batches run
  without communication, as under ``no_sync``); then the optimizer.
- ``zero1``: as ``dp`` with a ring reduce-scatter per bucket; the optimizer updates 1/N of
  the parameters, then a ring all-gather shares the updated bf16 weights.
- ``zero3``: parameters sharded per layer; before a layer's forward and backward its weights
  are all-gathered (the next layer's prefetched on the comm stream while this one computes),
  after its backward its gradients are reduce-scattered; the optimizer updates 1/N.
- ``pipeline``: N stages of consecutive layers (the embedding on the first, the output layer
  on the last), 1F1B over ``accumulate`` micro-batches (``pipeline.schedules``), activations
  and their gradients sent between neighbours.
- ``tensor``: Megatron's split of every layer over N devices (no sequence parallelism): per
  layer an all-reduce of the activations after attention and after the MLP, two more in
  backward, each overlapped with the weight gradient's half of backward as Megatron does
  (and two in a full recomputation); ``accumulate`` micro-batches one after another.
  With ``tp`` below N, groups of ``tp`` consecutive ranks each hold one Megatron split of
  the model and the N / tp groups are data-parallel replicas: rank r's gradients (1/tp of
  the model) are all-reduced with the ranks of the same position in the other groups,
  after the last backward (not overlapped). ``visible`` (CUDA_VISIBLE_DEVICES) orders the
  preset's GPUs, so it places the groups: on 2 nodes of 8, ``tp=8`` keeps each group in a
  node, ``visible="0,1,2,3,8,9,10,11,..."`` spreads each over both.

Collectives are the course's step-by-step rings (``all_reduce_ring``, ``all_gather``,
``reduce_scatter``): at large messages their bus bandwidth is within a few percent of the
pipelined ring's on NVLink presets (docs/fidelity.md). MFU is model FLOPs (``costs.model_flops``)
over step time x N x the GPU's bf16 peak, as Korthikanti et al. 2022 define it.
"""

from __future__ import annotations

from typing import Any

from mpgpu_edu.cluster.trace import merged_intervals
from mpgpu_edu.comm import launch
from mpgpu_edu.estimate.costs import model_flops
from mpgpu_edu.estimate.plan import StepSetup, memory_per_device, plan_step
from mpgpu_edu.estimate.programs import step_program
from mpgpu_edu.memory import get_preset


def _exposed_comm(trace: Any, device: int) -> float:
    """Seconds in which ``device`` communicates while its compute stream is idle."""
    compute = merged_intervals([(e.start, e.end) for e in trace.on(device, "compute")])
    comm = merged_intervals([(e.start, e.end) for e in trace.on(device) if e.stream != "compute"])
    total, i = 0.0, 0
    for start, end in comm:
        total += end - start
        while i < len(compute) and compute[i][1] <= start:
            i += 1
        j = i
        while j < len(compute) and compute[j][0] < end:
            total -= min(end, compute[j][1]) - max(start, compute[j][0])
            j += 1
    return total


def simulate_step(setup: StepSetup) -> tuple[dict, Any]:
    """The step's report (a JSON-ready dict) and its simulated trace."""
    plan, cluster = plan_step(setup)
    trace = launch(step_program, cluster, plan).trace
    spec, n, step = get_preset(setup.model), plan.n, trace.makespan
    replicas = (1 if setup.strategy == "pipeline" else n // plan.tp if setup.strategy == "tensor"
                else n)
    tokens = setup.micro_batch * setup.seq * setup.accumulate * replicas
    peak = cluster.gpu.peak_flops["bf16"]
    memory = memory_per_device(setup, n)
    busy = [trace.busy(d) / step for d in range(n)]
    exposed = [_exposed_comm(trace, d) / step for d in range(n)]
    return {
        **setup.__dict__, "devices": n, "gpu": cluster.gpu.display_name,
        "tokens_per_step": tokens, "step_s": step, "tokens_per_s": tokens / step,
        "model_flops": model_flops(spec, tokens, setup.seq),
        "mfu": model_flops(spec, tokens, setup.seq) / (step * n * peak),
        "compute_fraction": sum(busy) / n, "comm_exposed_fraction": sum(exposed) / n,
        "idle_fraction": max(0.0, 1 - sum(busy) / n - sum(exposed) / n),
        "memory_per_device": memory, "memory_total": sum(memory.values()),
        "capacity": cluster.capacity_bytes(0),
        "fits": sum(memory.values()) <= cluster.capacity_bytes(0),
    }, trace
