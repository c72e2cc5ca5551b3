"""The SPMD programs of a simulated training step, one per strategy: compute regions of known
seconds (``plan.Plan``) and the course's collectives on meta tensors of the right size."""

from __future__ import annotations

import torch

from mpgpu_edu.collectives import all_gather, all_reduce, reduce_scatter
from mpgpu_edu.comm import Communicator
from mpgpu_edu.estimate.costs import BF16
from mpgpu_edu.estimate.plan import BUCKET_BYTES, Plan
from mpgpu_edu.pipeline.measures import steps_of
from mpgpu_edu.pipeline.schedules import one_f_one_b


def _spend(comm: Communicator, kind: str, label: str, seconds: float) -> None:
    """A compute region of known seconds (a layer that is not run, only timed)."""
    with comm.compute(kind, label, seconds=seconds):
        pass


def _meta(elems: int) -> torch.Tensor:
    return torch.empty(max(int(elems), 1), dtype=torch.bfloat16, device="meta")


def step_program(comm: Communicator, plan: Plan) -> None:
    """One training step of ``plan`` on this rank (the SPMD program)."""
    {"dp": _data_parallel, "zero1": _data_parallel, "zero3": _zero3,
     "pipeline": _pipeline, "tensor": _tensor}[plan.strategy](comm, plan)
    _spend(comm, "optimizer", "Adam", plan.opt_s[comm.rank])
    if plan.strategy == "zero1":
        all_gather(comm, _meta((plan.layer_elems * _n_layers(plan) + plan.head_elems)
                               / plan.n))


def _n_layers(plan: Plan) -> int:
    return plan.layers[0][1] - plan.layers[0][0]


def _forward_layers(comm: Communicator, plan: Plan, count: int, mb: int) -> None:
    _spend(comm, "forward", f"{count} layers, mb {mb}", count * sum(plan.fwd))


def _data_parallel(comm: Communicator, plan: Plan) -> None:
    """dp and zero1: accumulate, then overlap the last backward with bucketed rings."""
    n_layers, works = _n_layers(plan), []
    grain = max(1, -(-BUCKET_BYTES // (BF16 * plan.layer_elems)))  # whole layers per bucket
    sync = all_reduce if plan.strategy == "dp" else reduce_scatter
    for mb in range(plan.k):
        _forward_layers(comm, plan, n_layers, mb)
        _spend(comm, "forward", "output", plan.out_fwd)
        _spend(comm, "backward", "output", plan.out_bwd)
        done = 0
        for start in range(n_layers, 0, -grain):
            count = min(grain, start)
            _spend(comm, "backward", f"layers {start - count}-{start - 1}, mb {mb}",
                   count * (sum(plan.bwd) + sum(plan.rec)))
            done += count
            if mb == plan.k - 1:
                extra = plan.head_elems if done == n_layers else 0
                bucket = _meta(count * plan.layer_elems + extra)
                works.append(comm.run_async(sync, comm, bucket))
    for work in works:
        work.wait()


def _zero3(comm: Communicator, plan: Plan) -> None:
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
            _spend(comm, "forward", f"layer {layer}, mb {mb}", sum(plan.fwd))
        _spend(comm, "forward", "output", plan.out_fwd)
        _spend(comm, "backward", "output", plan.out_bwd)
        pending = comm.run_async(all_gather, comm, shard)
        for layer in reversed(range(n_layers)):
            pending.wait()
            if layer > 0:
                pending = comm.run_async(all_gather, comm, shard)
            _spend(comm, "backward", f"layer {layer}, mb {mb}", sum(plan.bwd) + sum(plan.rec))
            grads.append(comm.run_async(reduce_scatter, comm, _meta(plan.layer_elems)))
    for work in grads:
        work.wait()


def _pipeline(comm: Communicator, plan: Plan) -> None:
    """1F1B over the stages: receive, compute this stage's layers, send on."""
    rank, n = comm.rank, plan.n
    lo, hi = plan.layers[rank]
    count, act, sends = hi - lo, _meta(plan.act_elems), []
    for step in steps_of(one_f_one_b(n, plan.k), rank):
        if step.op == "F":
            if rank > 0:
                comm.recv(act, rank - 1)
            seconds = count * sum(plan.fwd) + (plan.out_fwd if rank == n - 1 else 0.0)
            _spend(comm, "forward", f"mb {step.microbatch}", seconds)
            if rank < n - 1:
                sends.append(comm.isend(act, rank + 1))
        else:
            if rank < n - 1:
                comm.recv(act, rank + 1)
            seconds = (count * (sum(plan.bwd) + sum(plan.rec))
                       + (plan.out_bwd if rank == n - 1 else 0.0))
            _spend(comm, "backward", f"mb {step.microbatch}", seconds)
            if rank > 0:
                sends.append(comm.isend(act, rank - 1))
    for work in sends:
        work.wait()


def _tensor(comm: Communicator, plan: Plan) -> None:
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


def _megatron(comm: Communicator, plan: Plan) -> None:
    """Megatron: an all-reduce of the activations after each half of every layer."""
    act = _meta(plan.act_elems)
    for mb in range(plan.k):
        for layer in range(_n_layers(plan)):
            for half, name in enumerate(("attention", "MLP")):
                _spend(comm, "forward", f"layer {layer} {name}", plan.fwd[half])
                all_reduce(comm, act)
        _spend(comm, "forward", "output", plan.out_fwd)
        _spend(comm, "backward", "output", plan.out_bwd)
        for layer in reversed(range(_n_layers(plan))):
            if plan.rec[1]:  # a full recomputation runs the forward, all-reduces and all
                for half in range(2):
                    _spend(comm, "backward", f"layer {layer} recompute", plan.rec[half])
                    all_reduce(comm, act)
            for half, name in ((1, "MLP"), (0, "attention")):
                # Megatron overlaps the input gradient's all-reduce with the weight gradient
                # (Korthikanti et al. 2022, section 6.2): each is half of backward's FLOPs.
                extra = plan.rec[half] if not plan.rec[1] else 0.0
                _spend(comm, "backward", f"layer {layer} {name} dgrad", plan.bwd[half] / 2 + extra)
                reduced = comm.run_async(all_reduce, comm, act)
                _spend(comm, "backward", f"layer {layer} {name} wgrad", plan.bwd[half] / 2)
                reduced.wait()
