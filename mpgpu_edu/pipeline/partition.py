"""Partitioning: which consecutive layers form each pipeline stage, and on which device it runs.

A pipeline runs as fast as its slowest stage, so a good split balances the stages' cost:
parameters (memory) or forward FLOPs (time). ``partition_balanced`` finds the contiguous split
whose most expensive stage is as cheap as possible (the linear-partition problem, solved
exactly by dynamic programming in O(P n^2) for n layers and P stages).

    >>> costs = [LayerCost(f"l{i}", n_params=n, flops=0) for i, n in enumerate([3, 1, 1, 1, 2])]
    >>> [stage.layers for stage in partition_balanced(costs, 2).stages]
    [('l0', 'l1'), ('l2', 'l3', 'l4')]

Stage p runs on logical device p (``cuda:p``). ``Placement.with_devices`` records which
physical GPU that is, e.g. ``[2, 3]`` under ``CUDA_VISIBLE_DEVICES=2,3``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import Literal

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


@dataclass(frozen=True)
class LayerCost:
    """One layer's size and forward FLOPs. ``param_bytes`` defaults to fp32: 4 per parameter."""

    name: str
    n_params: int
    flops: float
    param_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.param_bytes is None:
            object.__setattr__(self, "param_bytes", 4 * self.n_params)


@dataclass(frozen=True)
class StagePlacement:
    """One stage: its layers (by name), what they weigh, and where it runs.

    ``device`` is the logical id (``cuda:<device>``); ``physical_device`` the GPU it maps to.
    """

    stage: int
    device: int
    layers: tuple[str, ...]
    n_params: int
    param_bytes: int
    flops: float
    physical_device: int


@dataclass(frozen=True)
class Placement:
    """All stages of a pipeline, in order; each layer is on exactly one stage."""

    stages: tuple[StagePlacement, ...]

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    @property
    def layers(self) -> list[str]:
        """Every layer's name, in model order."""
        return [name for stage in self.stages for name in stage.layers]

    def stage_of(self, layer: str) -> int:
        """The stage that holds ``layer``."""
        return next(stage.stage for stage in self.stages if layer in stage.layers)

    def with_devices(self, physical_ids: Sequence[int]) -> Placement:
        """The same placement with logical device d on physical GPU ``physical_ids[d]``, as
        ``CUDA_VISIBLE_DEVICES=2,3`` gives ``[2, 3]``: stage 0 on cuda:0, which is GPU 2."""
        needed = max(stage.device for stage in self.stages) + 1
        if len(physical_ids) < needed or len(set(physical_ids)) != len(physical_ids):
            raise ValueError(f"with_devices needs {needed} different physical ids, one per "
                             f"logical device, got {list(physical_ids)}")
        return Placement(tuple(replace(stage, physical_device=physical_ids[stage.device])
                               for stage in self.stages))

    def __str__(self) -> str:
        return "\n".join(
            f"stage {s.stage} on cuda:{s.device} (GPU {s.physical_device}): "
            f"{_span(s.layers)}, {s.n_params:,} params, {s.param_bytes:,} B, {s.flops:,.0f} FLOPs"
            for s in self.stages)


def _span(names: Sequence[str]) -> str:
    return ", ".join(names) if len(names) <= 3 else f"{names[0]} .. {names[-1]} ({len(names)})"


Layers = nn.Sequential | Sequence[LayerCost] | Sequence[str]


def layer_costs(model: nn.Sequential, sample_input: torch.Tensor) -> list[LayerCost]:
    """Each child of ``model``: its parameters, their bytes, and the forward FLOPs it spends on
    ``sample_input`` (counted by torch.utils.flop_counter; elementwise ops count as 0)."""
    costs = []
    x = sample_input
    with torch.no_grad():
        for name, layer in model.named_children():
            with FlopCounterMode(display=False) as counter:
                x = layer(x)
            params = list(layer.parameters())
            costs.append(LayerCost(name, sum(p.numel() for p in params),
                                   counter.get_total_flops(),
                                   sum(p.numel() * p.element_size() for p in params)))
    return costs


def partition_by_list(layers: Layers, boundaries: Sequence[int]) -> Placement:
    """Stages split before each index in ``boundaries``: 10 layers and ``[4, 7]`` give stages
    of layers 0-3, 4-6 and 7-9. ``layers`` is an nn.Sequential, LayerCosts or layer names."""
    costs = _as_costs(layers)
    n = len(costs)
    _check_stage_count(n, len(boundaries) + 1)
    inside = all(0 < b < n for b in boundaries)
    increasing = all(a < b for a, b in zip(boundaries, boundaries[1:]))
    if not (inside and increasing):
        raise ValueError(f"boundaries {list(boundaries)} must increase strictly and lie in "
                         f"1..{n - 1}: each is the index of the first layer of a new stage, "
                         f"e.g. [4, 7] splits 10 layers into 0-3, 4-6 and 7-9")
    edges = [0, *boundaries, n]
    return Placement(tuple(_stage(p, costs[start:stop])
                           for p, (start, stop) in enumerate(zip(edges, edges[1:]))))


def partition_by_sizes(layers: Layers, sizes: Sequence[int]) -> Placement:
    """Stages of ``sizes[p]`` consecutive layers each: ``[4, 3, 3]`` for 10 layers."""
    n = len(_as_costs(layers))
    if any(size < 1 for size in sizes) or sum(sizes) != n:
        raise ValueError(f"sizes {list(sizes)} must be at least 1 each and add up to the "
                         f"{n} layers")
    return partition_by_list(layers, list(accumulate(sizes))[:-1])


def partition_balanced(layers: Layers, n_stages: int, by: Literal["params", "flops"] = "params",
                       flops_per_layer: Sequence[float] | None = None) -> Placement:
    """The contiguous split into ``n_stages`` stages whose largest stage cost is smallest.

    Cost is parameters (``by="params"``) or forward FLOPs (``by="flops"``, from the layers'
    LayerCosts or from ``flops_per_layer``).
    """
    costs = _as_costs(layers)
    if flops_per_layer is not None:
        if len(flops_per_layer) != len(costs):
            raise ValueError(f"flops_per_layer has {len(flops_per_layer)} values for "
                             f"{len(costs)} layers")
        costs = [replace(cost, flops=f) for cost, f in zip(costs, flops_per_layer)]
    _check_stage_count(len(costs), n_stages)
    if by not in ("params", "flops"):
        raise ValueError(f"by={by!r}: balance by 'params' or by 'flops'")
    weights = [cost.n_params if by == "params" else cost.flops for cost in costs]
    if by == "flops" and not any(weights):
        raise ValueError("no FLOPs are known: pass flops_per_layer, or LayerCosts from "
                         "layer_costs(model, sample_input)")
    return partition_by_list(costs, _min_max_boundaries(weights, n_stages))


def _min_max_boundaries(weights: Sequence[float], n_parts: int) -> list[int]:
    """Linear partition: best[k][j] is the smallest possible largest part when the first j
    weights form k parts; cut[k][j] is where that split's last part starts."""
    n = len(weights)
    prefix = [0, *accumulate(weights)]
    best = [[float("inf")] * (n + 1) for _ in range(n_parts + 1)]
    cut = [[0] * (n + 1) for _ in range(n_parts + 1)]
    best[0][0] = 0
    for k in range(1, n_parts + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                largest = max(best[k - 1][i], prefix[j] - prefix[i])
                if largest < best[k][j]:
                    best[k][j], cut[k][j] = largest, i
    boundaries, j = [], n
    for k in range(n_parts, 1, -1):
        j = cut[k][j]
        boundaries.append(j)
    return boundaries[::-1]


def split_module(model: nn.Sequential, placement: Placement) -> list[nn.Sequential]:
    """One nn.Sequential per stage, holding the model's own layers (parameters are shared, not
    copied): moving stage p to its device moves those layers of ``model`` too."""
    names = [name for name, _ in model.named_children()]
    if names != placement.layers:
        raise ValueError(f"the placement covers layers {placement.layers} but the model has "
                         f"{names}: build the placement from this model")
    children = dict(model.named_children())
    return [nn.Sequential(OrderedDict((name, children[name]) for name in stage.layers))
            for stage in placement.stages]


def _as_costs(layers: Layers) -> list[LayerCost]:
    if isinstance(layers, nn.Module):
        return [LayerCost(name, sum(p.numel() for p in layer.parameters()), 0,
                          sum(p.numel() * p.element_size() for p in layer.parameters()))
                for name, layer in layers.named_children()]
    return [LayerCost(item, 0, 0) if isinstance(item, str) else item for item in layers]


def _check_stage_count(n_layers: int, n_stages: int) -> None:
    if n_stages < 1:
        raise ValueError(f"n_stages must be at least 1, got {n_stages}")
    if n_stages > n_layers:
        raise ValueError(f"cannot split {n_layers} layers into {n_stages} stages: each stage "
                         f"needs at least one layer; use at most {n_layers} stages, or split "
                         f"the model into more (smaller) layers")


def _stage(index: int, costs: Sequence[LayerCost]) -> StagePlacement:
    return StagePlacement(stage=index, device=index, layers=tuple(c.name for c in costs),
                          n_params=sum(c.n_params for c in costs),
                          param_bytes=sum(c.param_bytes or 0 for c in costs),
                          flops=sum(c.flops for c in costs), physical_device=index)
