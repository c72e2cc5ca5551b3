"""Tensor (intra-layer) parallelism: one layer's weight split across ranks.

- ``mappings``: Megatron's f and g as autograd functions on our collectives, and how a
  dimension is split over ranks.
- ``layers``: the layers built from them: ``ColumnParallelLinear``, ``RowParallelLinear``, ``ParallelMLP`` (column
  then row), ``naive_parallel_mlp`` and the seed's ``ColumnParallelConv2d`` (64 channels as
  4 ranks x 16).
- ``megatron``: ``megatron_mlp``, the same block as one function of the ranks' shards
  (the reference of exercise 5.4).
- ``runner``: training a tensor-parallel MLP against single-device training
  (``mpgpu-edu run tp``).
"""

from mpgpu_edu.tensor.layers import (
    ColumnParallelConv2d,
    ColumnParallelLinear,
    ParallelMLP,
    RowParallelLinear,
    naive_parallel_mlp,
)
from mpgpu_edu.tensor.mappings import (
    copy_to_parallel,
    gather_from_parallel,
    reduce_from_parallel,
    scatter_to_parallel,
    shard,
    shard_sizes,
)
from mpgpu_edu.tensor.megatron import megatron_mlp

__all__ = [
    "ColumnParallelConv2d", "ColumnParallelLinear", "ParallelMLP", "RowParallelLinear",
    "copy_to_parallel", "gather_from_parallel", "megatron_mlp", "naive_parallel_mlp",
    "reduce_from_parallel", "scatter_to_parallel", "shard", "shard_sizes",
]
