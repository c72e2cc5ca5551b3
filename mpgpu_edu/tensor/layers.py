"""Tensor parallelism: one layer's weight split across ranks, each rank computing a slice.

The seed's example: a convolution with 64 output channels computed as 4 devices x 16
channels instead of one device computing all 64. Each rank holds 16 filters, computes its 16
channels from the full input, and an all-gather puts the channels together.

For a linear layer ``Y = X W^T`` (``W`` is ``(out, in)``, as in ``nn.Linear``) there are two
ways to split (Megatron-LM; Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion
Parameter Language Models Using Model Parallelism", section 3):

- by output features, *column parallel*: rank r holds rows ``W_r`` and computes ``Y_r``,
  a slice of the output, from the whole input. Backward: ``dX = sum_r dY_r W_r``, a sum over
  ranks, so the input's gradient needs an all-reduce. That is Megatron's **f**: identity
  forward, all-reduce backward.
- by input features, *row parallel*: rank r holds columns ``W_r`` and a slice ``X_r`` of the
  input, and computes a partial output ``X_r W_r^T``; the output is their sum. That is
  Megatron's **g**: all-reduce forward, identity backward.

Column then row (``ParallelMLP``) needs no communication in between: the column layer's
output slices are exactly the row layer's input slices. One all-reduce forward (g), one
backward (f). The naive split (``naive_parallel_mlp``) gathers the hidden layer and splits it
again: an all-gather more each way.

Shards follow ``torch.tensor_split``: with ``n`` features over N ranks, rank r gets
``n // N + (r < n % N)``, so any N works, even one that does not divide ``n``.

Building: ``from_linear`` / ``from_mlp`` / ``from_conv`` take this rank's slices of an unsplit
layer, so the split layer equals it exactly. The plain constructors initialise like the
unsplit layer and keep their slice, which is the same layer on every rank only if every rank
draws the same random numbers (same seed, separate processes; the simulator's ranks are
threads that share one generator).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from mpgpu_edu.comm import Communicator
from mpgpu_edu.tensor.mappings import (copy_to_parallel, gather_from_parallel,
                                       reduce_from_parallel, scatter_to_parallel, shard,
                                       shard_sizes)


# ---- the layers ---------------------------------------------------------------------------------

class ColumnParallelLinear(nn.Module):
    """``nn.Linear`` split by output features: rank r holds rows ``W_r`` (and ``b_r``) and
    computes output features ``Y_r = f(X) W_r^T + b_r`` from the whole input.

    With ``gather_output`` the slices are all-gathered into the full output, else each rank
    keeps its slice (what a following ``RowParallelLinear`` needs).
    Cost: backward, one all-reduce of the input's gradient (f); forward, an all-gather of the
    output if ``gather_output``. Parameters per rank: 1/N of the layer's.
    """

    def __init__(self, comm: Communicator, in_features: int, out_features: int,
                 bias: bool = True, gather_output: bool = False) -> None:
        super().__init__()
        self.comm, self.gather_output = comm, gather_output
        self.sizes = shard_sizes(out_features, comm.world_size)
        full = nn.Linear(in_features, out_features, bias)  # same init distribution as unsplit
        self.weight = nn.Parameter(shard(full.weight.detach(), comm, 0))
        self.bias = nn.Parameter(shard(full.bias.detach(), comm, 0)) if bias else None

    @classmethod
    def from_linear(cls, comm: Communicator, linear: nn.Linear,
                    gather_output: bool = False) -> ColumnParallelLinear:
        """This rank's shard of ``linear``: the same layer, split."""
        return _split_linear(cls, comm, linear, gather_output, dim=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(copy_to_parallel(x, self.comm), self.weight, self.bias)  # (..., out / N)
        if self.gather_output:
            y = gather_from_parallel(y, self.comm, -1, self.sizes)  # (..., out)
        return y


class RowParallelLinear(nn.Module):
    """``nn.Linear`` split by input features: rank r holds columns ``W_r`` and computes the
    partial output ``X_r W_r^T``; g sums the partials over ranks, then the bias (held whole by
    every rank) is added once.

    ``input_is_parallel``: the input is already this rank's slice ``X_r`` (a column-parallel
    layer's output); otherwise the layer takes its slice of the full input itself.
    Cost: forward, one all-reduce of the output (g); backward, an all-gather of the input's
    gradient if the input was not parallel.
    """

    def __init__(self, comm: Communicator, in_features: int, out_features: int,
                 bias: bool = True, input_is_parallel: bool = True) -> None:
        super().__init__()
        self.comm, self.input_is_parallel = comm, input_is_parallel
        full = nn.Linear(in_features, out_features, bias)
        self.weight = nn.Parameter(shard(full.weight.detach(), comm, 1))
        self.bias = nn.Parameter(full.bias.detach().clone()) if bias else None

    @classmethod
    def from_linear(cls, comm: Communicator, linear: nn.Linear,
                    input_is_parallel: bool = True) -> RowParallelLinear:
        """This rank's shard of ``linear``: the same layer, split."""
        return _split_linear(cls, comm, linear, input_is_parallel, dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = scatter_to_parallel(x, self.comm, -1)  # (..., in / N)
        y = reduce_from_parallel(F.linear(x, self.weight), self.comm)  # (..., out)
        return y + self.bias if self.bias is not None else y


class ParallelMLP(nn.Module):
    """Linear, activation, Linear with the first split by columns and the second by rows
    (Megatron's MLP block): the hidden features never leave their rank.

    forward: ``g(act(f(X) W1_r^T + b1_r) W2_r^T) + b2``.
    Cost: one all-reduce of the output forward (g), one of the input's gradient backward (f).
    """

    def __init__(self, comm: Communicator, in_features: int, hidden_features: int,
                 out_features: int, activation: nn.Module | None = None) -> None:
        super().__init__()
        self.fc1 = ColumnParallelLinear(comm, in_features, hidden_features)
        self.activation = activation if activation is not None else nn.ReLU()
        self.fc2 = RowParallelLinear(comm, hidden_features, out_features)

    @classmethod
    def from_mlp(cls, comm: Communicator, mlp: nn.Sequential) -> ParallelMLP:
        """This rank's shard of ``nn.Sequential(Linear, activation, Linear)``."""
        fc1, activation, fc2 = _mlp_parts(mlp)
        layer = cls(comm, fc1.in_features, fc1.out_features, fc2.out_features, activation)
        layer.fc1 = ColumnParallelLinear.from_linear(comm, fc1)
        layer.fc2 = RowParallelLinear.from_linear(comm, fc2)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation(self.fc1(x)))


def naive_parallel_mlp(comm: Communicator, mlp: nn.Sequential) -> nn.Sequential:
    """The naive split of ``nn.Sequential(Linear, activation, Linear)``: gather the hidden
    layer after the first Linear, split it again before the second. Correct, but it moves the
    hidden activations twice more than ``ParallelMLP`` does.
    Cost: forward, an all-gather of the hidden layer and an all-reduce of the output;
    backward, an all-gather of the hidden gradient and an all-reduce of the input's."""
    fc1, activation, fc2 = _mlp_parts(mlp)
    return nn.Sequential(ColumnParallelLinear.from_linear(comm, fc1, gather_output=True),
                         activation,
                         RowParallelLinear.from_linear(comm, fc2, input_is_parallel=False))


class ColumnParallelConv2d(nn.Module):
    """``nn.Conv2d`` split by output channels: the seed's 64 channels as 4 ranks x 16. Each
    rank convolves the whole input with its filters; the channel slices are all-gathered.

    Cost: forward, an all-gather of the output (each rank receives the other ranks'
    channels); backward, an all-reduce of the input's gradient (f).
    """

    def __init__(self, comm: Communicator, in_channels: int, out_channels: int,
                 kernel_size: int, stride: int = 1, padding: int = 0, bias: bool = True) -> None:
        super().__init__()
        self.comm, self.stride, self.padding = comm, stride, padding
        self.sizes = shard_sizes(out_channels, comm.world_size)
        full = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, bias=bias)
        self.weight = nn.Parameter(shard(full.weight.detach(), comm, 0))
        self.bias = nn.Parameter(shard(full.bias.detach(), comm, 0)) if bias else None

    @classmethod
    def from_conv(cls, comm: Communicator, conv: nn.Conv2d) -> ColumnParallelConv2d:
        """This rank's filters of ``conv`` (square kernel, int stride and padding, groups=1)."""
        if conv.groups != 1 or len(set(conv.kernel_size)) != 1:
            raise ValueError("ColumnParallelConv2d splits plain convolutions: groups=1 and a "
                             f"square kernel, got groups={conv.groups}, "
                             f"kernel_size={conv.kernel_size}")
        layer = cls(comm, conv.in_channels, conv.out_channels, conv.kernel_size[0],
                    conv.stride[0], conv.padding[0], conv.bias is not None)
        _load_shards(layer, conv, comm, dim=0, split_bias=True)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_parallel(x, self.comm)  # (B, C_in, H, W)
        y = F.conv2d(x, self.weight, self.bias, self.stride, self.padding)  # (B, C_out/N, ..)
        return gather_from_parallel(y, self.comm, 1, self.sizes)  # (B, C_out, H', W')


def _split_linear(cls: type, comm: Communicator, linear: nn.Linear, option: bool,
                  dim: int) -> nn.Module:
    """``cls`` (column parallel: ``dim`` 0, row parallel: 1) holding this rank's slices of
    ``linear``; the bias is split with the rows, whole with the columns."""
    layer = cls(comm, linear.in_features, linear.out_features, linear.bias is not None, option)
    _load_shards(layer, linear, comm, dim=dim, split_bias=dim == 0)
    return layer


def _load_shards(layer: nn.Module, full: nn.Module, comm: Communicator, dim: int,
                 split_bias: bool) -> None:
    with torch.no_grad():
        layer.weight.copy_(shard(full.weight, comm, dim))
        if full.bias is not None:
            layer.bias.copy_(shard(full.bias, comm, 0) if split_bias else full.bias)


def _mlp_parts(mlp: nn.Sequential) -> tuple[nn.Linear, nn.Module, nn.Linear]:
    parts = list(mlp)
    linear_ends = len(parts) == 3 and all(isinstance(parts[i], nn.Linear) for i in (0, 2))
    if not linear_ends:
        raise ValueError("expected nn.Sequential(Linear, activation, Linear), got "
                         f"{[type(p).__name__ for p in parts]}")
    return parts[0], parts[1], parts[2]
