"""The capstone's cases: the models, batches and examples they train on, and the single-device
reference their judges compare with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.grading.checks._clock import cluster_builder
from mpgpu_edu.grading.checks._support import examples

Impl = Callable[..., Any]


LR = 0.05


WIDTHS = (6, 9, 7, 3)  # layers of 63, 70 and 24 elements: none divides by 3 or 4


def _model(widths: tuple[int, ...], seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _batch(n_samples: int, widths: tuple[int, ...], seed: int) -> tuple[torch.Tensor, ...]:
    from mpgpu_edu.grading.checks import _support

    generator = torch.Generator().manual_seed(_support.secret_seed(seed))
    return (torch.randn(n_samples, widths[0], generator=generator),
            torch.randn(n_samples, widths[-1], generator=generator))


def _layer_flats(model: nn.Sequential) -> list[torch.Tensor]:
    return [torch.cat([p.detach().reshape(-1) for p in layer.parameters()])
            for layer in model if any(True for _ in layer.parameters())]


def _same(tensor: torch.Tensor, want: torch.Tensor) -> bool:
    return (tensor.shape == want.shape and not tensor.is_meta
            and torch.equal(tensor.detach().cpu(), want))


ACCUMULATE = ((0, 1), (2,))  # batches per finish(): two backward passes, then one more


def _reference(widths: tuple[int, ...], n_samples: int, steps: int,
               optimizer: str) -> tuple[list, list, list]:
    """Single-device training: each layer's flat parameters at the start and the end, and
    each step's flat gradients."""
    model = _model(widths)
    start = _layer_flats(model)
    opt = (torch.optim.SGD(model.parameters(), lr=LR) if optimizer == "sgd"
           else torch.optim.Adam(model.parameters(), lr=LR))
    grads = []
    for s in range(steps):
        x, y = _batch(n_samples, widths, seed=10 + s)
        nn.functional.mse_loss(model(x), y).backward()
        grads.append([torch.cat([p.grad.reshape(-1) for p in layer.parameters()])
                      for layer in model if any(True for _ in layer.parameters())])
        opt.step()
        opt.zero_grad()
    return start, _layer_flats(model), grads


@cluster_builder
def _prefetch_cluster() -> Cluster:
    return Cluster.preset("8xA100-nvlink", visible="0,1,2,3")


HIDDEN = examples(5, seed=83, world_size=(2, 5), hidden=(3, 11), prefetch=(0, 1))


def _example(world_size: int, hidden: int, prefetch: int) -> tuple[tuple[int, ...], int, str]:
    return (5, hidden, hidden + 3, 2), 4 * world_size + 1, "adam" if prefetch else "sgd"
