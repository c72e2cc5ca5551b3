"""Pipeline training over several steps, and ``mpgpu-edu run pipeline``.

``train_pipeline`` is the SPMD function every rank runs: copy the model, split it into stages
(``partition_balanced`` by parameters unless a placement is given), keep stage ``comm.rank``,
and call ``pipeline_train_step`` once per batch. ``mpgpu_edu.replica.reference.train_single``
trains the unsplit model on the same batches: the pipeline must end with the same parameters and
losses.

    >>> model, batches = make_mlp([8, 32, 32, 2]), make_batches(3, 16)
    >>> result = launch(train_pipeline, 2, model, batches, gpipe(2, 4))
"""

from __future__ import annotations

import copy
import functools
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from mpgpu_edu.comm import Communicator, launch
from mpgpu_edu.comm.launch import DEFAULT_TIMEOUT_S
from mpgpu_edu.replica.data import loss_fn as mse_loss
from mpgpu_edu.replica.data import make_batches, make_mlp
from mpgpu_edu.memory.measure import track_gradients, track_optimizer_state, track_parameters
from mpgpu_edu.pipeline.executor import LossFn, StageSeconds, pipeline_train_step
from mpgpu_edu.pipeline.partition import Placement, partition_balanced, split_module
from mpgpu_edu.pipeline.schedules import gpipe, naive, one_f_one_b
from mpgpu_edu.pipeline.steps import Schedule
from mpgpu_edu.replica.reference import OPTIMIZERS, make_optimizer, train_single

Batches = Sequence[tuple[torch.Tensor, torch.Tensor]]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]

SCHEDULES = ("naive", "gpipe", "1f1b")
DEMO_SIZES = (8, 32, 32, 32, 32, 2)  # 5 Linear layers with 4 ReLUs between: 9 layers


def make_schedule(name: str, n_stages: int, n_microbatches: int = 1) -> Schedule:
    """The schedule called ``name`` ("naive", "gpipe" or "1f1b"). Naive runs the whole batch
    as one microbatch, so it takes ``n_microbatches=1`` only."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}: choose one of {', '.join(SCHEDULES)}")
    if name == "naive":
        if n_microbatches != 1:
            raise ValueError(f"the naive schedule runs the whole batch as one microbatch, got "
                             f"{n_microbatches} microbatches: use 1, or gpipe / 1f1b")
        return naive(n_stages)
    return (gpipe if name == "gpipe" else one_f_one_b)(n_stages, n_microbatches)


def optimizer_factory(name: str, lr: float = 0.05) -> OptimizerFactory:
    """A picklable ``params -> optimizer`` for ``reference.make_optimizer``'s ``name``
    ("sgd" or "adam"): what each rank calls on its own stage's parameters."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}: use one of {', '.join(OPTIMIZERS)}")
    return functools.partial(make_optimizer, name, lr=lr)


def make_stage_optimizer(stage: nn.Module, make_opt: OptimizerFactory | None = None
                         ) -> torch.optim.Optimizer | None:
    """``make_opt(stage.parameters())`` (default plain SGD), or None for a stage without
    parameters (a lone ReLU): there is nothing for it to update."""
    if not any(True for _ in stage.parameters()):
        return None
    return (make_opt or optimizer_factory("sgd"))(stage.parameters())


def train_stage(comm: Communicator, mine: nn.Module, make_opt: OptimizerFactory | None,
                batches: Batches, step: Callable[[torch.Tensor, torch.Tensor,
                                                  torch.optim.Optimizer | None], Any]
                ) -> list[Any]:
    """This rank's part of training: the optimizer of its stage ``mine``, its parameters and
    gradients recorded in ``comm.memory``, then ``step(inputs, targets, optimizer)`` for each
    batch (on ``comm.device``); the optimizer's state is recorded after the first step, when
    it appears. Returns what each step returned (its loss, or None)."""
    optimizer = make_stage_optimizer(mine, make_opt)
    track_parameters(comm, mine)
    track_gradients(comm, mine)
    losses = []
    for inputs, targets in batches:
        inputs, targets = inputs.to(comm.device), targets.to(comm.device)
        losses.append(step(inputs, targets, optimizer))
        if len(losses) == 1 and optimizer is not None:  # state appears in the first step
            track_optimizer_state(comm, optimizer)
    return losses


def stage_state(mine: nn.Module) -> dict[str, torch.Tensor]:
    """The stage's ``state_dict`` on the CPU, with the model's own keys (``"2.weight"``)."""
    return {k: v.detach().cpu() for k, v in mine.state_dict().items()}


def train_pipeline(comm: Communicator, model: nn.Sequential, batches: Batches,
                   schedule: Schedule, placement: Placement | None = None,
                   make_opt: OptimizerFactory | None = None, loss_fn: LossFn = mse_loss,
                   stage_seconds: StageSeconds | None = None) -> dict[str, Any]:
    """SPMD: train ``model`` split into ``schedule.n_stages`` stages, one per rank, for one
    step per batch. Returns ``{"stage", "losses" (last stage only, else None), "state"}``:
    the stage's ``state_dict``, whose keys are the model's own (``"2.weight"``)."""
    n_virtual = schedule.n_stages * schedule.n_chunks  # P V chunks for an interleaved one
    stages = split_module(copy.deepcopy(model),
                          placement or partition_balanced(model, n_virtual))
    # this rank's chunks (just its stage unless interleaved): virtual stages p, p+P, ...
    mine = nn.Sequential(OrderedDict(
        child for stage in stages[comm.rank::schedule.n_stages]
        for child in stage.named_children())).to(comm.device)
    losses = train_stage(comm, mine, make_opt, batches, lambda inputs, targets, optimizer:
                         pipeline_train_step(comm, stages, schedule, inputs, targets, optimizer,
                                             loss_fn, stage_seconds=stage_seconds))
    is_last = comm.rank == schedule.n_stages - 1
    return {"stage": comm.rank, "losses": losses if is_last else None,
            "state": stage_state(mine)}


def max_abs_diff(state: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between matching entries (every key of ``reference``)."""
    missing = sorted(set(reference) - set(state))
    if missing:
        raise ValueError(f"parameters missing from the trained state: {missing}")
    return max(((state[k] - v).abs().max().item() for k, v in reference.items()), default=0.0)


def run_demo(backend: str, world_size: int, steps: int, optimizer: str,
             **options: Any) -> dict[str, Any]:
    """``mpgpu-edu run pipeline``: train ``make_mlp(sizes)`` as a ``world_size``-stage pipeline
    for ``steps`` steps and compare with single-device training (``reference.train_single``).

    Options: ``schedule`` ("gpipe"), ``microbatches`` (4; 1 for naive), ``batch_size`` (16),
    ``sizes`` (``DEMO_SIZES``: 9 layers), ``lr`` (0.05), ``seed`` (0), ``cluster`` (a preset
    name, simulator only; default a uniform network of ``world_size`` devices), ``timeout``
    (seconds the ranks get; default launch's).
    """
    name = options.get("schedule", "gpipe")
    n_mb = options.get("microbatches", 1 if name == "naive" else 4)
    sizes, seed = tuple(options.get("sizes", DEMO_SIZES)), options.get("seed", 0)
    batch_size, lr = options.get("batch_size", 16), options.get("lr", 0.05)
    _check_demo(world_size, steps, 2 * len(sizes) - 3, batch_size, n_mb)
    schedule = make_schedule(name, world_size, n_mb)
    model_fn = functools.partial(make_mlp, sizes, seed)
    batches = make_batches(steps, batch_size, sizes[0], sizes[-1], seed)
    result = launch(train_pipeline, _launch_target(backend, world_size, options), model_fn(),
                    batches, schedule, None, optimizer_factory(optimizer, lr), backend=backend,
                    timeout=options.get("timeout") or DEFAULT_TIMEOUT_S)
    ref_params, ref_losses = train_single(model_fn, batches, optimizer, lr)
    state = {k: v for r in result.results for k, v in r["state"].items()}
    losses = result.results[-1]["losses"]
    return {"strategy": "pipeline", "backend": backend, "world_size": world_size,
            "steps": steps, "optimizer": optimizer, "schedule": name, "microbatches": n_mb,
            "losses": losses, "reference_losses": ref_losses, "final_loss": losses[-1],
            "reference_final_loss": ref_losses[-1],
            "max_abs_param_diff": max_abs_diff(state, ref_params),
            "makespan_s": result.trace.makespan}


def _launch_target(backend: str, world_size: int, options: dict[str, Any]) -> Any:
    """What ``launch`` runs on: a preset cluster on the simulator if one is named, else the
    number of ranks."""
    cluster = options.get("cluster")
    if cluster is None or backend != "sim":
        return world_size
    from mpgpu_edu.cluster import Cluster

    picked = Cluster.preset(cluster)
    if world_size > picked.world_size:
        raise ValueError(f"cluster {cluster} has {picked.world_size} devices, fewer than "
                         f"world_size {world_size}")
    return Cluster.preset(cluster, visible=",".join(map(str, range(world_size))))


def _check_demo(world_size: int, steps: int, n_layers: int, batch_size: int,
                n_microbatches: int) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if world_size > n_layers:
        raise ValueError(f"cannot split a {n_layers}-layer model into {world_size} stages: "
                         f"use at most {n_layers} ranks, or more layers (sizes=...)")
    if not 1 <= n_microbatches <= batch_size:
        raise ValueError(f"microbatches must be between 1 and the batch size {batch_size}, "
                         f"got {n_microbatches}")
