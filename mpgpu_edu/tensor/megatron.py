"""Megatron-LM's MLP block as one SPMD function of the ranks' shards (the reference of
exercise 5.4, and what lesson 05's demos run when the learner's is not ready).

``gelu(x W1^T + b1) W2^T + b2`` with W1 split by rows (column-parallel: each rank holds some
hidden features) and W2 by columns (row-parallel: the same hidden features). f before the
first layer, g after the second (Shoeybi et al. 2019, "Megatron-LM", section 3, figure 3a).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from mpgpu_edu.comm import Communicator
from mpgpu_edu.tensor.mappings import copy_to_parallel, reduce_from_parallel


def megatron_mlp(comm: Communicator, x: torch.Tensor, w1_shard: torch.Tensor,
                 b1_shard: torch.Tensor | None, w2_shard: torch.Tensor,
                 b2: torch.Tensor | None) -> torch.Tensor:
    """The MLP block on this rank's hidden features, the full output on every rank.

    ``x`` (..., d_in) is the same on every rank; ``w1_shard`` (h_r, d_in) and ``b1_shard``
    (h_r,) are this rank's rows of W1 and b1; ``w2_shard`` (d_out, h_r) the same hidden
    features' columns of W2; ``b2`` (d_out,) is whole on every rank. Shards follow
    ``torch.tensor_split`` over the hidden features, so h_r may differ by one between ranks.
    Cost: forward, one all-reduce of the output (g); backward, one of x's gradient (f)."""
    hidden = F.gelu(F.linear(copy_to_parallel(x, comm), w1_shard, b1_shard))  # (..., h_r)
    out = reduce_from_parallel(F.linear(hidden, w2_shard), comm)  # (..., d_out), summed
    return out + b2 if b2 is not None else out  # the bias once, after the sum
