"""Hybrid parallelism, data x pipeline: ``dp`` replicas, each a ``pp``-stage pipeline.

One train step on every rank (replica d, stage s, see ``Mesh``):

1. replica d takes its shard of the batch (``torch.tensor_split`` by ``dp``),
2. its pipeline runs the schedule on that shard (``pipeline_forward_backward``, row group),
3. stage s's gradients are summed over the replicas (one all-reduce in the column group),
4. every rank steps its optimizer: all replicas of a stage stay identical.

Each microbatch's loss is scaled by its share of the *whole* batch, so the summed gradients
are the full batch's mean gradient, for any shard sizes: the result equals single-device
training on the whole batch.

Cost per step: the pipeline's messages within each row, plus one all-reduce per column of the
stage's gradient bytes (ring: 2(dp-1)/dp of them per rank), at the same time in every column.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from mpgpu_edu.collectives import all_reduce
from mpgpu_edu.comm import Communicator
from mpgpu_edu.replica.data import loss_fn as mse_loss
from mpgpu_edu.hybrid.mesh import Mesh, MeshGroups, make_groups
from mpgpu_edu.pipeline.executor import LossFn, StageSeconds, pipeline_forward_backward
from mpgpu_edu.pipeline.partition import Placement, partition_balanced, split_module
from mpgpu_edu.pipeline.runner import Batches, OptimizerFactory, stage_state, train_stage
from mpgpu_edu.pipeline.steps import Schedule
from mpgpu_edu.replica.flat import flatten_grads, unflatten_grads


def all_reduce_gradients(comm: Communicator, module: nn.Module) -> None:
    """Sum every parameter's ``.grad`` over the ranks of ``comm``, in one flat buffer (one
    all-reduce rather than one per parameter: fewer messages, fewer alphas)."""
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = flatten_grads(params)
    all_reduce(comm, flat)
    unflatten_grads(flat, params)


def hybrid_train_step(groups: MeshGroups, model_stages: Sequence[nn.Module],
                      schedule: Schedule, batch: torch.Tensor, targets: torch.Tensor,
                      optimizer: torch.optim.Optimizer | None, loss_fn: LossFn | None = None, *,
                      stage_seconds: StageSeconds | None = None) -> float | None:
    """One optimizer update of DP x PP training (steps 1-4 above). Returns the whole batch's
    mean loss on the ranks of the last stage, ``None`` on the others."""
    dp = groups.mesh.dp
    if len(batch) < dp * schedule.n_microbatches:
        raise ValueError(f"a batch of {len(batch)} samples cannot feed {dp} replicas x "
                         f"{schedule.n_microbatches} microbatches: use a larger batch")
    inputs = torch.tensor_split(batch, dp)[groups.dp_index]
    labels = torch.tensor_split(targets, dp)[groups.dp_index]
    model_stages[groups.pp_index].zero_grad(set_to_none=True)
    loss = pipeline_forward_backward(groups.pipeline, model_stages, schedule, inputs, labels,
                                 loss_fn, batch_size=len(batch), stage_seconds=stage_seconds)
    all_reduce_gradients(groups.data, model_stages[groups.pp_index])
    if optimizer is not None:  # None: a stage with nothing to train
        with groups.data.compute("optimizer", "step", seconds=0.0 if stage_seconds else None):
            optimizer.step()
    if loss is None:
        return None
    total = torch.tensor([loss], device=groups.data.device)
    all_reduce(groups.data, total)  # each replica's share of the batch's mean loss
    return total.item()


def train_hybrid(comm: Communicator, mesh: Mesh, model: nn.Sequential, batches: Batches,
                 schedule: Schedule, placement: Placement | None = None,
                 make_opt: OptimizerFactory | None = None, loss_fn: LossFn = mse_loss,
                 stage_seconds: StageSeconds | None = None) -> dict[str, Any]:
    """SPMD: DP x PP training of ``model`` on ``mesh`` (``mesh.pp`` must be the schedule's
    stages), one step per batch. Returns ``{"dp_index", "pp_index", "losses" (last stage
    only, else None), "state"}``, the stage's ``state_dict`` with the model's own keys."""
    if schedule.n_stages != mesh.pp:
        raise ValueError(f"schedule {schedule.name!r} has {schedule.n_stages} stages but the "
                         f"mesh has pp={mesh.pp}: they must match")
    groups = make_groups(comm, mesh)
    stages = split_module(copy.deepcopy(model), placement or partition_balanced(model, mesh.pp))
    mine = stages[groups.pp_index].to(comm.device)
    losses = train_stage(comm, mine, make_opt, batches, lambda inputs, targets, optimizer:
                         hybrid_train_step(groups, stages, schedule, inputs, targets, optimizer,
                                           loss_fn, stage_seconds=stage_seconds))
    is_last = groups.pp_index == mesh.pp - 1
    return {"dp_index": groups.dp_index, "pp_index": groups.pp_index,
            "losses": losses if is_last else None, "state": stage_state(mine)}
