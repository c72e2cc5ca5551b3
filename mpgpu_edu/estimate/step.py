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

from dataclasses import dataclass
from typing import Any

import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives import all_gather, all_reduce, reduce_scatter
from mpgpu_edu.comm import Communicator, launch
from mpgpu_edu.estimate.costs import (ADAM_BYTES_PER_PARAM, BF16, layer_cost, model_flops,
                                      output_ops, seconds_of)
from mpgpu_edu.memory import activation_terms, estimate_memory, get_preset
from mpgpu_edu.memory.models import layer_params, param_breakdown, spec_params
from mpgpu_edu.pipeline.measures import steps_of
from mpgpu_edu.pipeline.schedules import one_f_one_b

STRATEGIES = ("dp", "zero1", "zero3", "pipeline", "tensor")
BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class StepSetup:
    """One training step: model and cluster presets, strategy, micro-batch size (sequences
    per device per micro-batch), sequence length, micro-batches per step, attention and
    recomputation (as ``mpgpu-edu memory``)."""

    model: str = "gpt2-small"
    cluster: str = "8xA100-nvlink"
    strategy: str = "dp"
    micro_batch: int = 8
    seq: int = 1024
    accumulate: int = 1
    attention: str = "flash"
    recompute: str = "none"
    tp: int = 0                 # tensor: ranks per Megatron group (0: all of them)
    visible: str | None = None  # CUDA_VISIBLE_DEVICES on the preset (None: all, in order)


@dataclass(frozen=True)
class _Plan:
    """Everything the SPMD program needs, worked out once."""

    strategy: str
    n: int
    k: int
    layers: tuple[tuple[int, int], ...]   # per rank (pipeline: its stage's range of layers)
    fwd: tuple[float, float]
    bwd: tuple[float, float]
    rec: tuple[float, float]
    out_fwd: float
    out_bwd: float
    layer_elems: int                      # bf16 elements of one layer's weights
    head_elems: int                       # embedding (+ output layer)
    act_elems: int                        # one micro-batch's activation at a layer boundary
    opt_s: list[float]                    # optimizer seconds per rank
    tp: int = 1                           # tensor: ranks per Megatron group


def _check(setup: StepSetup) -> None:
    if setup.strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {setup.strategy!r}: choose one of "
                         f"{', '.join(STRATEGIES)}")
    for name in ("micro_batch", "seq", "accumulate"):
        value = getattr(setup, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**20:
            raise ValueError(f"{name} must be a whole number from 1 to 2**20, got {value!r}")
    activation_terms(setup.model, 1, 1, "mixed", setup.attention, setup.recompute)  # names
    if setup.tp and setup.strategy != "tensor":
        raise ValueError(f"tp (ranks per tensor-parallel group) applies to strategy tensor, "
                         f"not {setup.strategy}: leave it 0")


def _tp(setup: StepSetup, n: int) -> int:
    """Ranks per tensor-parallel group (1 unless the strategy is tensor)."""
    if setup.strategy != "tensor":
        return 1
    t = setup.tp or n
    if isinstance(t, bool) or not isinstance(t, int) or t < 1 or n % t:
        raise ValueError(f"tp must divide the {n} devices, got {setup.tp!r}")
    return t


def plan_step(setup: StepSetup) -> tuple[_Plan, Cluster]:
    _check(setup)
    cluster = Cluster.preset(setup.cluster, visible=setup.visible)
    spec, n = get_preset(setup.model), cluster.world_size
    t = _tp(setup, n)
    b, s = setup.micro_batch, setup.seq
    cost = layer_cost(cluster, spec, b, s, t, setup.attention, setup.recompute)
    out = output_ops(spec, b, s, t)
    parts = param_breakdown(spec)
    head = parts["embedding"] + parts["lm_head"] + parts["final_norm"]
    if setup.strategy == "pipeline":
        if spec.n_layers < n:
            raise ValueError(f"{setup.model} has {spec.n_layers} layers, fewer than the {n} "
                             "pipeline stages: pick a smaller cluster or another strategy")
        bounds = [round(i * spec.n_layers / n) for i in range(n + 1)]
        layers = tuple((bounds[i], bounds[i + 1]) for i in range(n))
        owned = [(hi - lo) * layer_params(spec) + (head if i in (0, n - 1) else 0)
                 for i, (lo, hi) in enumerate(layers)]
    else:
        layers = ((0, spec.n_layers),) * n
        total = spec_params(spec)
        split = t if setup.strategy == "tensor" else n
        owned = [total / split if setup.strategy in ("zero1", "zero3", "tensor") else total] * n
    opt = [cluster.op_seconds(0.0, ADAM_BYTES_PER_PARAM * p, "bf16") for p in owned]
    return _Plan(setup.strategy, n, setup.accumulate, layers, cost.forward, cost.backward,
                 cost.recompute, seconds_of(cluster, out), seconds_of(cluster, out, 2.0),
                 layer_params(spec), head, b * s * spec.d_model, opt, t), cluster


def _meta(elems: int) -> torch.Tensor:
    return torch.empty(max(int(elems), 1), dtype=torch.bfloat16, device="meta")


def _step(comm: Communicator, plan: _Plan) -> None:
    """One training step of ``plan`` on this rank (the SPMD program)."""
    {"dp": _data_parallel, "zero1": _data_parallel, "zero3": _zero3,
     "pipeline": _pipeline, "tensor": _tensor}[plan.strategy](comm, plan)
    with comm.compute("optimizer", "Adam", seconds=plan.opt_s[comm.rank]):
        pass
    if plan.strategy == "zero1":
        all_gather(comm, _meta((plan.layer_elems * _n_layers(plan) + plan.head_elems)
                               / plan.n))


def _n_layers(plan: _Plan) -> int:
    return plan.layers[0][1] - plan.layers[0][0]


def _forward_layers(comm: Communicator, plan: _Plan, count: int, mb: int) -> None:
    with comm.compute("forward", f"{count} layers, mb {mb}",
                      seconds=count * sum(plan.fwd)):
        pass


def _data_parallel(comm: Communicator, plan: _Plan) -> None:
    """dp and zero1: accumulate, then overlap the last backward with bucketed rings."""
    n_layers, works = _n_layers(plan), []
    grain = max(1, -(-BUCKET_BYTES // (BF16 * plan.layer_elems)))  # whole layers per bucket
    sync = all_reduce if plan.strategy == "dp" else reduce_scatter
    for mb in range(plan.k):
        _forward_layers(comm, plan, n_layers, mb)
        with comm.compute("forward", "output", seconds=plan.out_fwd):
            pass
        with comm.compute("backward", "output", seconds=plan.out_bwd):
            pass
        done = 0
        for start in range(n_layers, 0, -grain):
            count = min(grain, start)
            with comm.compute("backward", f"layers {start - count}-{start - 1}, mb {mb}",
                              seconds=count * (sum(plan.bwd) + sum(plan.rec))):
                pass
            done += count
            if mb == plan.k - 1:
                extra = plan.head_elems if done == n_layers else 0
                bucket = _meta(count * plan.layer_elems + extra)
                works.append(comm.run_async(sync, comm, bucket))
    for work in works:
        work.wait()


def _zero3(comm: Communicator, plan: _Plan) -> None:
    """Per layer: all-gather its shard (the next one prefetched), compute, free; after each
    layer's backward, reduce-scatter its gradients."""
    n_layers, shard = _n_layers(plan), _meta(plan.layer_elems / plan.n)
    grads = []
    for mb in range(plan.k):
        pending = comm.run_async(all_gather, comm, shard)
        for layer in range(n_layers):
            pending.wait()
            if layer + 1 < n_layers:
                pending = comm.run_async(all_gather, comm, shard)
            with comm.compute("forward", f"layer {layer}, mb {mb}", seconds=sum(plan.fwd)):
                pass
        with comm.compute("forward", "output", seconds=plan.out_fwd):
            pass
        with comm.compute("backward", "output", seconds=plan.out_bwd):
            pass
        pending = comm.run_async(all_gather, comm, shard)
        for layer in reversed(range(n_layers)):
            pending.wait()
            if layer > 0:
                pending = comm.run_async(all_gather, comm, shard)
            with comm.compute("backward", f"layer {layer}, mb {mb}",
                              seconds=sum(plan.bwd) + sum(plan.rec)):
                pass
            grads.append(comm.run_async(reduce_scatter, comm, _meta(plan.layer_elems)))
    for work in grads:
        work.wait()


def _pipeline(comm: Communicator, plan: _Plan) -> None:
    """1F1B over the stages: receive, compute this stage's layers, send on."""
    rank, n = comm.rank, plan.n
    lo, hi = plan.layers[rank]
    count, act, sends = hi - lo, _meta(plan.act_elems), []
    for step in steps_of(one_f_one_b(n, plan.k), rank):
        if step.op == "F":
            if rank > 0:
                comm.recv(act, rank - 1)
            seconds = count * sum(plan.fwd) + (plan.out_fwd if rank == n - 1 else 0.0)
            with comm.compute("forward", f"mb {step.microbatch}", seconds=seconds):
                pass
            if rank < n - 1:
                sends.append(comm.isend(act, rank + 1))
        else:
            if rank < n - 1:
                comm.recv(act, rank + 1)
            seconds = (count * (sum(plan.bwd) + sum(plan.rec))
                       + (plan.out_bwd if rank == n - 1 else 0.0))
            with comm.compute("backward", f"mb {step.microbatch}", seconds=seconds):
                pass
            if rank > 0:
                sends.append(comm.isend(act, rank - 1))
    for work in sends:
        work.wait()


def _tensor(comm: Communicator, plan: _Plan) -> None:
    """Megatron inside groups of ``plan.tp`` ranks; the groups, if several, average their
    gradients (1/tp of the model per rank) after the last backward."""
    if plan.tp == plan.n:
        _megatron(comm, plan)
        return
    group, position = divmod(comm.rank, plan.tp)
    _megatron(comm.group(range(group * plan.tp, (group + 1) * plan.tp)), plan)
    replicas = comm.group(range(position, plan.n, plan.tp))
    all_reduce(replicas, _meta((plan.layer_elems * _n_layers(plan) + plan.head_elems)
                               / plan.tp))


def _megatron(comm: Communicator, plan: _Plan) -> None:
    """Megatron: an all-reduce of the activations after each half of every layer."""
    act = _meta(plan.act_elems)
    for mb in range(plan.k):
        for layer in range(_n_layers(plan)):
            for half, name in enumerate(("attention", "MLP")):
                with comm.compute("forward", f"layer {layer} {name}", seconds=plan.fwd[half]):
                    pass
                all_reduce(comm, act)
        with comm.compute("forward", "output", seconds=plan.out_fwd):
            pass
        with comm.compute("backward", "output", seconds=plan.out_bwd):
            pass
        for layer in reversed(range(_n_layers(plan))):
            if plan.rec[1]:  # a full recomputation runs the forward, all-reduces and all
                for half in range(2):
                    with comm.compute("backward", f"layer {layer} recompute",
                                      seconds=plan.rec[half]):
                        pass
                    all_reduce(comm, act)
            for half, name in ((1, "MLP"), (0, "attention")):
                # Megatron overlaps the input gradient's all-reduce with the weight gradient
                # (Korthikanti et al. 2022, section 6.2): each is half of backward's FLOPs.
                extra = plan.rec[half] if not plan.rec[1] else 0.0
                with comm.compute("backward", f"layer {layer} {name} dgrad",
                                  seconds=plan.bwd[half] / 2 + extra):
                    pass
                reduced = comm.run_async(all_reduce, comm, act)
                with comm.compute("backward", f"layer {layer} {name} wgrad",
                                  seconds=plan.bwd[half] / 2):
                    pass
                reduced.wait()


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _exposed_comm(trace: Any, device: int) -> float:
    """Seconds in which ``device`` communicates while its compute stream is idle."""
    compute = _merged([(e.start, e.end) for e in trace.on(device, "compute")])
    comm = _merged([(e.start, e.end) for e in trace.on(device) if e.stream != "compute"])
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


def memory_per_device(setup: StepSetup, n: int) -> dict[str, int]:
    """Bytes per device by category (``mpgpu_edu.memory``) for the busiest device."""
    spec = get_preset(setup.model)
    t = _tp(setup, n)
    acts = activation_terms(spec, setup.micro_batch, setup.seq, "mixed", setup.attention,
                            setup.recompute, t)
    one = acts["layers"] + acts["embedding"] + acts["output"]
    if setup.strategy == "pipeline":
        one = min(n, setup.accumulate) * (acts["layers"] // n + acts["embedding"])
    return estimate_memory(spec_params(spec), "adam", "mixed", setup.strategy,
                           t if setup.strategy == "tensor" else n, one).per_device


def simulate_step(setup: StepSetup) -> tuple[dict, Any]:
    """The step's report (a JSON-ready dict) and its simulated trace."""
    plan, cluster = plan_step(setup)
    trace = launch(_step, cluster, plan).trace
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
