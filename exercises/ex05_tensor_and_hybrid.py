"""Lesson 05 exercises: parallelism inside a layer, sharded optimizer state, hybrid meshes.

Tensor parallelism splits one layer's matrix over the ranks: 64 output channels on 4 ranks
are 16 channels each. ZeRO splits the optimizer state instead. A hybrid mesh combines data
and pipeline parallelism. You may use the package's collectives (``all_reduce``,
``all_gather``, ``reduce_scatter``). The function just below is solved for you: read it first.
"""

from __future__ import annotations

import math

import torch

from mpgpu_edu.collectives import all_gather, all_reduce, reduce_scatter
from mpgpu_edu.comm import Communicator


# ---- worked example (solved, not graded) ---------------------------------------------------

def row_parallel_linear(comm: Communicator, x_shard: torch.Tensor,
                        weight_shard: torch.Tensor) -> torch.Tensor:
    """``x @ W.T`` with W split by *columns* (input features) over the ranks: this rank
    holds ``weight_shard`` = its slice of W's columns and ``x_shard`` = the same slice of
    x's features. Each rank's product is a partial sum of the full output; one all-reduce
    adds them (Megatron-LM's "g" operator). Cost: one all-reduce of the output."""
    partial = x_shard @ weight_shard.T  # (B, out): this rank's share of every output
    all_reduce(comm, partial, op="sum")
    return partial


def adam_update(param: torch.Tensor, grad: torch.Tensor, state: dict, lr: float,
                betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
    """One Adam step on ``param``, in place, as ``torch.optim.Adam`` computes it. ``state``
    holds this tensor's step count and two moments; it is filled on the first call.
    A helper for exercise 5.2 (solved)."""
    if not state:
        state.update(step=0, exp_avg=torch.zeros_like(param),
                     exp_avg_sq=torch.zeros_like(param))
    beta1, beta2 = betas
    state["step"] += 1
    state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1)
    state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias1, bias2 = 1 - beta1 ** state["step"], 1 - beta2 ** state["step"]
    denom = (state["exp_avg_sq"].sqrt() / math.sqrt(bias2)).add_(eps)
    param.addcdiv_(state["exp_avg"], denom, value=-lr / bias1)


# ---- exercises ------------------------------------------------------------------------------

def column_parallel_linear(comm: Communicator, x: torch.Tensor, weight_shard: torch.Tensor,
                           bias_shard: torch.Tensor | None) -> torch.Tensor:
    """``x @ W.T + b`` with W split by *rows* (output features) over the ranks, and the full
    output returned on every rank.

    ``x`` (B, in) is the same on every rank. This rank holds ``weight_shard``, rows
    ``rank * k .. (rank + 1) * k - 1`` of W (k = out / N, the same on every rank), and the
    matching ``bias_shard`` (or None). Compute only this rank's k output features, then
    all-gather them and put them side by side: (B, out). Megatron-LM's "f" then gather.
    Cost: 1/N of the layer's FLOPs per rank, then an all-gather of the output.
    """
    # Exercise 5.1 (about 5 lines). Hint: x @ weight_shard.T + bias_shard, all_gather, torch.cat.
    raise NotImplementedError("Exercise 5.1: column_parallel_linear (notebooks/05_tensor_and_hybrid.ipynb)")


def zero1_adam_step(comm: Communicator, params: torch.Tensor, grad: torch.Tensor,
                    state: dict, lr: float = 1e-3) -> None:
    """One data-parallel Adam step with ZeRO-1: the optimizer state is sharded.

    ``params`` (1-D, the same on every rank, numel a multiple of N) is updated in place with
    Adam on the *mean* of every rank's ``grad`` (1-D, this rank's own gradient). This rank
    owns shard ``rank`` of ``torch.tensor_split(params, N)`` and keeps Adam's state for that
    shard only, in ``state`` (pass it to ``adam_update``): 1/N of the state per rank.

    Steps: reduce-scatter the gradients (mean) so each rank gets its shard of the average;
    Adam on its own shard; all-gather the updated shards into ``params``.
    Cost: a reduce-scatter and an all-gather, as much traffic as one all-reduce.
    """
    # Exercise 5.2 (about 5 lines). Hint: reduce_scatter (mean), adam_update, all_gather.
    raise NotImplementedError("Exercise 5.2: zero1_adam_step (notebooks/05_tensor_and_hybrid.ipynb)")


def hybrid_groups(world_size: int, pp_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """The DP x PP mesh: ``world_size`` ranks as ``world_size // pp_size`` pipeline replicas
    of ``pp_size`` stages each, numbered ``rank = replica * pp_size + stage``.

    Return ``(pipeline_groups, data_groups)``: pipeline group d lists the ranks of replica d
    by stage (they pass activations); data group s lists the ranks that run stage s, by
    replica (they average gradients). Raise ``ValueError`` unless ``pp_size`` divides
    ``world_size`` (both at least 1).

    >>> hybrid_groups(4, 2)
    ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    """
    # Exercise 5.3 (about 6 lines). Hint: rank = replica * pp_size + stage.
    raise NotImplementedError("Exercise 5.3: hybrid_groups (notebooks/05_tensor_and_hybrid.ipynb)")
