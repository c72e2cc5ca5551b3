"""Training a tensor-parallel MLP, checked against single-device training (``mpgpu-edu run tp``).

Every rank sees the whole batch and holds 1/N of each weight (``ParallelMLP``): the 64 hidden
features of the default model are 4 ranks x 16 on four ranks. The loss is computed on every
rank from the same all-reduced output, so every rank's gradients are its shard of the full
model's gradients, and each rank's optimizer updates its shard alone.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
from torch import nn

from mpgpu_edu.comm import Communicator, launch
from mpgpu_edu.comm.launch import DEFAULT_TIMEOUT_S
from mpgpu_edu.replica.data import loss_fn as mse_loss
from mpgpu_edu.replica.data import make_batches, make_mlp
from mpgpu_edu.memory.measure import track_gradients, track_optimizer_state, track_parameters
from mpgpu_edu.pipeline.executor import LossFn
from mpgpu_edu.pipeline.runner import Batches, OptimizerFactory, optimizer_factory
from mpgpu_edu.replica.reference import train_single
from mpgpu_edu.tensor.layers import ParallelMLP

DEMO_SIZES = (8, 64, 2)  # Linear(8, 64), ReLU, Linear(64, 2): 64 hidden = 4 ranks x 16


def train_tensor_parallel(comm: Communicator, mlp: nn.Sequential, batches: Batches,
                          make_opt: OptimizerFactory | None = None,
                          loss_fn: LossFn = mse_loss) -> dict[str, Any]:
    """SPMD: train this rank's shard of ``mlp`` (a ``ParallelMLP``) for one step per batch.
    Returns ``{"losses", "shard"}``, the shard's ``state_dict`` (``fc1.weight``, ...)."""
    model = ParallelMLP.from_mlp(comm, copy.deepcopy(mlp)).to(comm.device)
    optimizer = (make_opt or optimizer_factory("sgd"))(model.parameters())
    track_parameters(comm, model)
    track_gradients(comm, model)
    losses = []
    for inputs, targets in batches:
        inputs, targets = inputs.to(comm.device), targets.to(comm.device)
        optimizer.zero_grad(set_to_none=True)
        with comm.compute("forward", "forward"):
            loss = loss_fn(model(inputs), targets)
        with comm.compute("backward", "backward"):
            loss.backward()
        with comm.compute("optimizer", "step"):
            optimizer.step()
        losses.append(loss.item())
        if len(losses) == 1:  # optimizers make their state in the first step
            track_optimizer_state(comm, optimizer)
    return {"losses": losses,
            "shard": {k: v.detach().cpu() for k, v in model.state_dict().items()}}


def reference_shard(state: dict[str, torch.Tensor], rank: int,
                    world_size: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s ``ParallelMLP`` shard of an unsplit MLP's ``state_dict``."""
    def part(tensor: torch.Tensor, dim: int) -> torch.Tensor:
        return torch.tensor_split(tensor, world_size, dim)[rank]

    return {"fc1.weight": part(state["0.weight"], 0), "fc1.bias": part(state["0.bias"], 0),
            "fc2.weight": part(state["2.weight"], 1), "fc2.bias": state["2.bias"]}


def run_demo(backend: str, world_size: int, steps: int, optimizer: str,
             **options: Any) -> dict[str, Any]:
    """``mpgpu-edu run tp``: train ``make_mlp(sizes)`` (Linear, ReLU, Linear) split over
    ``world_size`` ranks for ``steps`` steps and compare with single-device training.

    Options: ``sizes`` (``DEMO_SIZES``), ``batch_size`` (16), ``lr`` (0.05), ``seed`` (0),
    ``timeout`` (seconds the ranks get; default launch's).
    """
    sizes, seed = tuple(options.get("sizes", DEMO_SIZES)), options.get("seed", 0)
    batch_size, lr = options.get("batch_size", 16), options.get("lr", 0.05)
    if world_size < 1 or steps < 1:
        raise ValueError(f"world_size and steps must be at least 1, got {world_size} and "
                         f"{steps}")
    if len(sizes) != 3:
        raise ValueError(f"the tensor-parallel demo trains Linear, ReLU, Linear: give three "
                         f"sizes (in, hidden, out), got {list(sizes)}")
    if world_size > sizes[1]:
        raise ValueError(f"cannot split {sizes[1]} hidden features over {world_size} ranks: "
                         f"use at most {sizes[1]} ranks")
    model_fn = functools.partial(make_mlp, sizes, seed)
    batches = make_batches(steps, batch_size, sizes[0], sizes[-1], seed)
    result = launch(train_tensor_parallel, world_size, model_fn(), batches,
                    optimizer_factory(optimizer, lr), backend=backend,
                    timeout=options.get("timeout") or DEFAULT_TIMEOUT_S)
    ref_params, ref_losses = train_single(model_fn, batches, optimizer, lr)
    diff = 0.0
    for rank, r in enumerate(result.results):
        expected = reference_shard(ref_params, rank, world_size)
        diff = max([diff, *((r["shard"][k] - v).abs().max().item()
                            for k, v in expected.items())])
    losses = result.results[0]["losses"]
    return {"strategy": "tp", "backend": backend, "world_size": world_size, "steps": steps,
            "optimizer": optimizer, "sizes": list(sizes), "losses": losses,
            "reference_losses": ref_losses, "final_loss": losses[-1],
            "reference_final_loss": ref_losses[-1], "max_abs_param_diff": diff,
            "bytes_sent_per_rank": result.bytes_sent_per_rank,
            "makespan_s": result.trace.makespan}
