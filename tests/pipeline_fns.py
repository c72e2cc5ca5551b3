"""SPMD functions the pipeline, tensor-parallel and hybrid tests run (on the simulator and in
gloo worker processes, which import them by name, so they live in a module)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from mpgpu_edu.pipeline.runner import train_pipeline
from mpgpu_edu.tensor import (ColumnParallelConv2d, ColumnParallelLinear, ParallelMLP,
                              RowParallelLinear, naive_parallel_mlp)


def train_schedules(comm, model, batches, schedules, placement=None, make_opt=None) -> list:
    """``train_pipeline`` once per schedule, from the same model: one launch, many checks."""
    return [train_pipeline(comm, model, batches, s, placement, make_opt) for s in schedules]


def parallel_layer(comm, kind: str, full: nn.Module) -> nn.Module:
    """This rank's shard of ``full`` as the tensor-parallel layer ``kind``."""
    full = copy.deepcopy(full)
    if kind == "column":
        return ColumnParallelLinear.from_linear(comm, full, gather_output=True)
    if kind == "row":
        return RowParallelLinear.from_linear(comm, full, input_is_parallel=False)
    if kind == "mlp":
        return ParallelMLP.from_mlp(comm, full)
    if kind == "naive_mlp":
        return naive_parallel_mlp(comm, full)
    if kind == "conv":
        return ColumnParallelConv2d.from_conv(comm, full)
    raise ValueError(kind)


def layer_forward_backward(comm, kind: str, full: nn.Module, x: torch.Tensor,
                           weights: torch.Tensor) -> dict:
    """Forward ``x`` through this rank's shard, backward from ``(y * weights).sum()``; returns
    the output, the input's gradient and every parameter's gradient, by name."""
    layer = parallel_layer(comm, kind, full)
    x = x.clone().requires_grad_()
    with comm.compute("forward", kind):
        y = layer(x)
    with comm.compute("backward", kind):
        (y * weights).sum().backward()
    return {"y": y.detach(), "x_grad": x.grad,
            "grads": {name: p.grad for name, p in layer.named_parameters()}}


def layer_checks(comm, cases: list) -> list:
    """``layer_forward_backward`` for every ``(kind, full, x, weights)`` case."""
    return [layer_forward_backward(comm, *case) for case in cases]
