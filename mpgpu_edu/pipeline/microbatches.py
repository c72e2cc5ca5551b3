"""A batch as a pipeline sees it: cut into microbatches (``split_batch``), and the shape of
what each stage receives for each of them (``stage_inputs_like``), found before training by
running zero samples through the earlier stages."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn


def stage_inputs_like(earlier_stages: Sequence[nn.Module],
                      microbatches: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Tensors shaped like what the stage after ``earlier_stages`` receives for each
    microbatch (zero-stride views: they hold one element, not the activation).

    A real pipeline learns these shapes once, before training. Here zero samples of each
    microbatch run through the earlier stages, which finds the feature shape and dtype without
    computing anything; a stage must keep the batch dimension first (Linear, Conv, ReLU do).
    Stages that refuse an empty batch (BatchNorm while training) are probed on the meta
    device instead, which is general but slow the first time."""
    shapes = []
    for batch in microbatches:
        try:
            features = _probe(earlier_stages, batch[:0])
        except (RuntimeError, ValueError):
            features = _probe([_meta_copy(stage) for stage in earlier_stages],
                              torch.empty_like(batch[:0], device="meta"))
        shapes.append(features.new_zeros(()).expand(len(batch), *features.shape[1:]))
    return shapes


def _probe(stages: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        for stage in stages:
            x = stage(x)
    return x


def _meta_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters and buffers are meta tensors. Copying, rather than
    swapping tensors in place, leaves the original untouched for ranks that share it."""
    memo: dict[int, torch.Tensor] = {}
    for t in module.parameters():
        memo[id(t)] = nn.Parameter(torch.empty_like(t, device="meta"), t.requires_grad)
    for t in module.buffers():
        memo[id(t)] = torch.empty_like(t, device="meta")
    return copy.deepcopy(module, memo)


def split_batch(batch: torch.Tensor, n_microbatches: int) -> list[torch.Tensor]:
    """``batch`` cut into ``n_microbatches`` microbatches along dim 0 (``torch.tensor_split``:
    sizes differ by at most one)."""
    if not 1 <= n_microbatches <= len(batch):
        raise ValueError(f"cannot split a batch of {len(batch)} samples into "
                         f"{n_microbatches} microbatches: use 1..{len(batch)} microbatches")
    return list(torch.tensor_split(batch, n_microbatches))
