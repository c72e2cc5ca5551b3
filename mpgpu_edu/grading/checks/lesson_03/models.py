"""Lesson 03's models and data, built the same way by *compute* and by *judge*."""

from __future__ import annotations

import torch
from torch import nn


def _model(widths: tuple[int, ...], seed: int = 0, norm: bool = False) -> nn.Sequential:
    """An MLP; ``norm`` puts a LayerNorm (two more parameters) after the first layer (the
    grader's secret in the seed, as in ``_batch``)."""
    from mpgpu_edu.grading.checks import _support

    torch.manual_seed(_support.secret_seed(seed))
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(a, b, bias=not (norm and i == 1)))
        if i == 0 and norm:
            layers.append(nn.LayerNorm(b))
        if i < len(widths) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def _batch(n_samples: int, widths: tuple[int, ...], seed: int = 1) -> tuple[torch.Tensor, ...]:
    """Inputs and targets (the grader's secret in the seed: ``checks._support.SECRET``)."""
    from mpgpu_edu.grading.checks import _support

    generator = torch.Generator().manual_seed(_support.secret_seed(seed))
    return (torch.randn(n_samples, widths[0], generator=generator),
            torch.randn(n_samples, widths[-1], generator=generator))


def _local_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def _names(widths: tuple[int, ...], norm: bool = False) -> list[str]:
    return [name for name, _ in _model(widths, norm=norm).named_parameters()]
