"""Tiny deterministic data and models: what every strategy in the course trains.

Everything here is a pure function of its arguments and a seed: the same call gives the same
tensors on every rank, in every process, on every run, without touching torch's global random
state. That is what lets a single-device run be the oracle for every parallel one.

- ``make_mlp(sizes)``: Linear layers with a ReLU between them (none after the last);
- ``make_batch(n, in_features, out_features)``: a regression batch ``(x, y)`` whose targets
  come from a fixed "teacher" network, so there is something to learn;
- ``loss_fn``: mean squared error, averaged over the batch;
- ``light()`` and ``heavy()``: two workloads (a model and a global batch) for scaling studies.
  Same model; the heavy one computes 32 times more per step, so its gradient exchange is
  small next to its compute, and the light one's is not (the seed's first pitfall).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs (B, in), targets (B, out))

TEACHER_SEED = 1234  # the function every batch's targets come from
DEMO_SIZES = (8, 32, 32, 2)  # the model of the ``mpgpu-edu run`` demos
DEMO_BATCH = 24  # samples per step in the demos: splits evenly over 1, 2, 3, 4, 6, 8 ranks
DEMO_LR = 0.05


def make_mlp(sizes: Sequence[int], seed: int = 0, device: str | torch.device = "cpu") -> nn.Module:
    """``nn.Sequential`` of ``Linear(sizes[i], sizes[i+1])`` with ``ReLU`` between them.

    Weights and biases are drawn like ``nn.Linear``'s default (uniform in +-1/sqrt(fan_in))
    from a generator seeded with ``seed``. ``device="meta"`` builds the shapes only (no data,
    no memory): enough to count FLOPs and bytes for models too big to run."""
    sizes = list(sizes)
    if len(sizes) < 2 or any(s < 1 for s in sizes):
        raise ValueError(f"an MLP needs at least two positive layer sizes, got {sizes}")
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(fan_in, fan_out, device="meta"))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers)
    if torch.device(device).type == "meta":
        return model
    model = model.to_empty(device=device)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model:
            if isinstance(layer, nn.Linear):
                bound = 1 / math.sqrt(layer.in_features)
                for p in (layer.weight, layer.bias):
                    p.copy_((torch.rand(p.shape, generator=generator) * 2 - 1) * bound)
    return model


def make_batch(n: int, in_features: int = 8, out_features: int = 2, seed: int = 0,
               device: str | torch.device = "cpu") -> Batch:
    """``n`` samples ``(x, y)``: ``x`` standard normal (n, in_features), ``y`` the output of
    a fixed random teacher MLP (n, out_features). Same ``seed``, same batch."""
    if n < 1:
        raise ValueError(f"a batch needs at least 1 sample, got n={n}")
    if torch.device(device).type == "meta":
        return (torch.empty(n, in_features, device="meta"),
                torch.empty(n, out_features, device="meta"))
    x = torch.randn(n, in_features, generator=torch.Generator().manual_seed(seed))
    teacher = make_mlp([in_features, 16, out_features], seed=TEACHER_SEED)
    with torch.no_grad():
        y = teacher(x)
    return x.to(device), y.to(device)


def make_batches(steps: int, n: int, in_features: int = 8, out_features: int = 2,
                 seed: int = 0) -> list[Batch]:
    """One batch per step, seeds ``seed, seed + 1, ...``."""
    return [make_batch(n, in_features, out_features, seed + i) for i in range(steps)]


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error over every element of the batch (``F.mse_loss``)."""
    return F.mse_loss(output, target)


@dataclass(frozen=True)
class Workload:
    """A model (``sizes`` of an MLP) and the global batch one training step processes."""

    name: str
    sizes: tuple[int, ...]
    batch: int

    def model(self, device: str | torch.device = "cpu", seed: int = 0) -> nn.Module:
        return make_mlp(self.sizes, seed, device)

    def make_batch(self, device: str | torch.device = "cpu", seed: int = 0) -> Batch:
        return make_batch(self.batch, self.sizes[0], self.sizes[-1], seed, device)

    @property
    def n_params(self) -> int:
        return sum(a * b + b for a, b in zip(self.sizes, self.sizes[1:]))

    @property
    def step_flops(self) -> int:
        """Forward (2 FLOPs per weight per sample) plus backward (twice that)."""
        return 6 * self.batch * sum(a * b for a, b in zip(self.sizes, self.sizes[1:]))


def light() -> Workload:
    """6.3 M parameters (25 MB of fp32 gradients), 512 samples a step: little compute for
    the bytes each step must exchange."""
    return Workload("light", (512, 2048, 2048, 512), 512)


def heavy() -> Workload:
    """The same model with 16384 samples a step: much compute for the same bytes."""
    return Workload("heavy", (512, 2048, 2048, 512), 16384)


def check_split(n_samples: int, parts: int, who: str = "ranks") -> None:
    """Raise ``ValueError`` unless ``n_samples`` samples can give each of ``parts`` at least
    one."""
    if parts < 1:
        raise ValueError(f"need at least 1 of the {who} to split a batch over, got {parts}")
    if n_samples < parts:
        raise ValueError(f"batch of {n_samples} samples cannot be split over {parts} {who}: "
                         f"use a batch of at least {parts} or fewer {who}")


def shard(batch: Batch, index: int, parts: int, who: str = "ranks") -> tuple[Batch, float]:
    """Shard ``index`` of ``parts`` of ``batch`` and its share of the samples, ``n_i / B``.

    Shards follow ``torch.tensor_split``: when ``parts`` does not divide ``B``, the first
    ``B % parts`` shards get one sample more. The share is what makes uneven shards exact: the
    whole-batch gradient of a mean loss is ``sum_i (n_i / B) * g_i``, where ``g_i`` is the
    gradient of shard i's own mean loss."""
    x, y = batch
    check_split(len(x), parts, who)
    xs, ys = torch.tensor_split(x, parts), torch.tensor_split(y, parts)
    return (xs[index], ys[index]), len(xs[index]) / len(x)
