"""Lesson 02's training cases (2.1, 2.3, 2.4): a small model trained with the learner's side
of the parameter server against training on one device."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mpgpu_edu.grading.checks import Case
from mpgpu_edu.grading.checks._support import (compute_examples, examples, expect_close,
                                               from_scratch, judge_examples, launch_facts,
                                               run_spmd)
from mpgpu_edu.grading.checks.lesson_02.steps import LR, _reference_server, _reference_worker

Impl = Callable[..., Any]
SAMPLES = 3  # samples per worker in the training cases
MODELS = {"linear": (5, 2), "mlp": (4, 6, 3)}


def _model(name: str, seed: int) -> nn.Module:
    torch.manual_seed(1000 + seed)
    sizes = MODELS[name]
    layers: list[nn.Module] = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def _batch(name: str, step: int, samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s batch (the grader's secret in the seed: ``checks._support.SECRET``)."""
    from mpgpu_edu.grading.checks import _support

    generator = torch.Generator().manual_seed(_support.secret_seed(97 * seed + step))
    sizes = MODELS[name]
    return (torch.randn(samples, sizes[0], generator=generator),
            torch.randn(samples, sizes[-1], generator=generator))


def _flat_grad(name: str, seed: int, flat: torch.Tensor, x: torch.Tensor,
               y: torch.Tensor) -> torch.Tensor:
    """Gradient of the mean squared error on (x, y) at the flat parameters ``flat``."""
    model = _model(name, seed)
    nn.utils.vector_to_parameters(flat.detach().clone(), model.parameters())
    nn.functional.mse_loss(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _single_device(name: str, steps: int, n_workers: int, seed: int) -> torch.Tensor:
    flat = nn.utils.parameters_to_vector(_model(name, seed).parameters()).detach()
    for step in range(steps):
        x, y = _batch(name, step, SAMPLES * n_workers, seed)
        flat = flat - LR * _flat_grad(name, seed, flat, x, y)
    return flat


def _train(impl: Impl, exercise: str, n: int, name: str, steps: int, seed: int) -> dict:
    """Train model ``name`` for ``steps`` steps with the learner's exercise: 2.1 (workers,
    reference server), 2.3 (server loop, reference workers), 2.4 (every rank)."""
    start = nn.utils.parameters_to_vector(_model(name, seed).parameters()).detach()
    n_workers = n if exercise == "2.4" else n - 1
    server = None if exercise == "2.4" else n - 1
    batches = [_batch(name, step, SAMPLES * n_workers, seed) for step in range(steps)]
    shards = [[(x[SAMPLES * r:SAMPLES * (r + 1)], y[SAMPLES * r:SAMPLES * (r + 1)])
               for x, y in batches] for r in range(n)]  # each worker's samples of each step

    def program(comm: Any) -> torch.Tensor:
        flat = start.clone()
        if comm.rank == server:
            if exercise == "2.3":
                impl(comm, flat, steps, LR)
            else:
                for _ in range(steps):
                    _reference_server(comm, flat, LR)
            return flat
        for xs, ys in shards[comm.rank]:
            grad = _flat_grad(name, seed, flat, xs, ys)
            if exercise == "2.4":
                impl(comm, flat, grad, LR)
            elif exercise == "2.1":
                impl(comm, flat, grad, server)
            else:
                _reference_worker(comm, flat, grad, server)
        return flat

    with from_scratch(impl, exercise):
        return launch_facts(run_spmd(program, n, hide=[shards]))


def _judge_training(facts: dict, n: int, name: str, steps: int, seed: int,
                    sharded: bool) -> None:
    want = _single_device(name, steps, n if sharded else n - 1, seed)
    for rank, got in enumerate(facts["results"]):
        expect_close(got, want, f"{name} model, N={n}, {steps} steps: rank {rank}'s "
                                "parameters against training on one device", rtol=1e-4,
                     atol=1e-5)


def _training(exercise: str, setups: list[tuple[int, str, int]], seed: int = 0) -> Case:
    sharded = exercise == "2.4"

    def compute(impl: Impl) -> list:
        return [_train(impl, exercise, n, name, steps, seed) for n, name, steps in setups]

    def judge(runs: list) -> None:
        for facts, (n, name, steps) in zip(runs, setups):
            _judge_training(facts, n, name, steps, seed, sharded)
    return compute, judge


def _hidden_training(exercise: str) -> Case:
    sharded = exercise == "2.4"
    low = 1 if sharded else 2
    cases = examples(8, 5, world_size=(low + 1, 6), model=(0, 1), steps=(1, 3), data=(0, 2))
    names = list(MODELS)

    def compute(impl: Impl) -> list:
        def body(world_size: int, model: int, steps: int, data: int) -> dict:
            return _train(impl, exercise, world_size, names[model], steps, data)
        return compute_examples(body, cases)

    def judge(records: list) -> None:
        judge_examples(records, lambda out, world_size, model, steps, data: _judge_training(
            out, world_size, names[model], steps, data, sharded))
    return compute, judge
