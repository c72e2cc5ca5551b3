"""Lesson 05 exercises: parallelism inside a layer, sharded optimizer state, hybrid meshes.

Tensor parallelism splits one layer's matrix over the ranks: 64 output channels on 4 ranks
are 16 channels each. ZeRO splits the optimizer state instead. A hybrid mesh combines data
and pipeline parallelism. The capstone, 5.4, is Megatron-LM's MLP block: two split layers
and the f and g operators that make it train like the unsplit block. The functions just
below are solved for you: read them first.

You may use the package's collectives (imported below):

* ``all_reduce(comm, t, op="sum")``: reduces ``t`` over the ranks, in place;
* ``reduce_scatter(comm, t, op="sum")``: returns this rank's chunk ``rank`` of
  ``torch.tensor_split`` of the reduced, flattened ``t`` (a new tensor; ``t`` is unchanged);
* ``all_gather(comm, t)``: returns ``[t of rank 0, ..., t of rank N-1]`` (new tensors).

``op`` is ``"sum"`` (the default) or ``"mean"`` (the sum divided by N; floating point only).
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

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
    matching ``bias_shard`` (or None). Returns (B, out), equal to the unsplit layer's output
    and of its dtype (float64 in, float64 out), on every rank; output features in W's row
    order. The caller's tensors are left unchanged.
    Cost: 1/N of the layer's FLOPs per rank, then an all-gather of the output: each rank
    sends N - 1 slices of (B, k) (on a ring: its own, then the N - 2 it passes on).
    """
    ### BEGIN SOLUTION 5.1
    local = x @ weight_shard.T  # (B, k): my output features
    if bias_shard is not None:
        local = local + bias_shard
    parts = all_gather(comm, local.contiguous())
    return torch.cat(parts, dim=-1)
    ### END SOLUTION


def zero1_adam_step(comm: Communicator, params: torch.Tensor, grad: torch.Tensor,
                    state: dict, lr: float = 1e-3) -> None:
    """One data-parallel Adam step with ZeRO-1: the optimizer state is sharded.

    ``params`` (1-D, the same on every rank, numel a multiple of N) is updated in place with
    Adam on the *mean* of every rank's ``grad`` (1-D, this rank's own gradient). This rank
    owns shard ``rank`` of ``torch.tensor_split(params, N)`` and keeps Adam's state for that
    shard only, in ``state`` (pass it to ``adam_update``): 1/N of the state per rank, and
    exactly the moments ``torch.optim.Adam`` would hold for that shard. ``grad`` is left
    unchanged (the caller may still need it).
    Cost: as much traffic as one all-reduce of the gradient (2 (N - 1) / N of it per rank).
    The collectives this takes: ``reduce_scatter`` (``op`` ``"sum"`` or ``"mean"``) and
    ``all_gather``, as the module's docstring states them.
    """
    ### BEGIN SOLUTION 5.2
    mean_grad = reduce_scatter(comm, grad, op="mean")  # my shard of the averaged gradient
    shard = torch.tensor_split(params, comm.world_size)[comm.rank]
    adam_update(shard, mean_grad, state, lr)
    parts = all_gather(comm, shard.clone())
    params.copy_(torch.cat(parts))
    ### END SOLUTION


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
    ### BEGIN SOLUTION 5.3
    if pp_size < 1 or world_size < 1 or world_size % pp_size:
        raise ValueError(f"pp_size {pp_size} must divide world_size {world_size}")
    replicas = world_size // pp_size
    pipelines = [[d * pp_size + s for s in range(pp_size)] for d in range(replicas)]
    data = [[d * pp_size + s for d in range(replicas)] for s in range(pp_size)]
    return pipelines, data
    ### END SOLUTION


def megatron_mlp(comm: Communicator, x: torch.Tensor, w1_shard: torch.Tensor,
                 b1_shard: torch.Tensor | None, w2_shard: torch.Tensor,
                 b2: torch.Tensor | None) -> torch.Tensor:
    """Megatron-LM's MLP block ``gelu(x @ W1.T + b1) @ W2.T + b2``, split over the ranks by
    its hidden features: the first linear column-parallel, the second row-parallel.

    ``x`` (..., d_in), any number of leading batch dimensions, is the same on every rank.
    This rank holds its hidden features' rows of W1 (``w1_shard``, (h_r, d_in)) and of b1
    (``b1_shard``, (h_r,) or None), and the same features' columns of W2 (``w2_shard``,
    (d_out, h_r)); ``b2`` (d_out,) or None is whole on every rank. Shards follow
    ``torch.tensor_split`` over the hidden features: hidden need not be a multiple of N, h_r
    may differ by one between ranks, and may be 0. GeLU is ``F.gelu`` (exact, erf).

    Returns (..., d_out), the unsplit block's output, on every rank, and differentiable:
    after ``out.backward(g)`` with the same ``g`` on every rank, ``x.grad`` is the unsplit
    block's input gradient on every rank, each shard's ``.grad`` is that shard of the unsplit
    gradient, and ``b2.grad`` is b2's whole gradient on every rank.

    Megatron's two conjugate operators carry all the communication: f (identity forward,
    all-reduce of the gradient backward) before the column-parallel layer, g (all-reduce
    forward, identity backward) after the row-parallel one; the hidden layer never leaves
    its rank. Cost: forward, one all-reduce of the output; backward, one of x's gradient.
    Shoeybi et al. 2019, "Megatron-LM", section 3.
    """
    ### BEGIN SOLUTION 5.4
    class CopyToParallel(torch.autograd.Function):  # f
        @staticmethod
        def forward(ctx, inputs: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
            return inputs.view_as(inputs)

        @staticmethod
        def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
            grad = grad.contiguous().clone()  # every rank's share of dx, summed
            all_reduce(comm, grad)
            return grad

    class ReduceFromParallel(torch.autograd.Function):  # g
        @staticmethod
        def forward(ctx, partial: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
            total = partial.contiguous().clone()
            all_reduce(comm, total)
            return total

        @staticmethod
        def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
            return grad  # every rank's partial contributed to the sum with weight 1

    hidden = F.gelu(F.linear(CopyToParallel.apply(x), w1_shard, b1_shard))  # (..., h_r)
    partial = F.linear(hidden, w2_shard)  # (..., d_out): my hidden features' share
    out = ReduceFromParallel.apply(partial)
    return out + b2 if b2 is not None else out  # once, after the sum: not N times
    ### END SOLUTION
