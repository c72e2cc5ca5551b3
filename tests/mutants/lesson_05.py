"""Plausible wrong answers for lesson 05 (see tests/mutants/__init__.py)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.nn import functional as F

from mpgpu_edu.collectives import all_gather, all_reduce, reduce_scatter

# ---- 5.1 column-parallel linear -------------------------------------------------------------


def column_cat_on_batch_dim(comm: Any, x: torch.Tensor, weight_shard: torch.Tensor,
                            bias_shard: torch.Tensor | None) -> torch.Tensor:
    """Concatenates the gathered slices along dim 0 (stacks batches, not features)."""
    local = x @ weight_shard.T
    if bias_shard is not None:
        local = local + bias_shard
    return torch.cat(all_gather(comm, local.contiguous()), dim=0)


def column_forgets_bias(comm: Any, x: torch.Tensor, weight_shard: torch.Tensor,
                        bias_shard: torch.Tensor | None) -> torch.Tensor:
    """Never adds the bias slice."""
    return torch.cat(all_gather(comm, (x @ weight_shard.T).contiguous()), dim=-1)


def column_whole_weight_everywhere(comm: Any, x: torch.Tensor, weight_shard: torch.Tensor,
                                   bias_shard: torch.Tensor | None) -> torch.Tensor:
    """Gathers the whole weight and computes every output feature on every rank."""
    weight = torch.cat(all_gather(comm, weight_shard.contiguous()))
    out = x @ weight.T
    if bias_shard is not None:
        out = out + torch.cat(all_gather(comm, bias_shard.contiguous()))
    return out


def column_zeroes_callers_x(comm: Any, x: torch.Tensor, weight_shard: torch.Tensor,
                            bias_shard: torch.Tensor | None) -> torch.Tensor:
    """Right output, but clears x in place afterwards ("to free it"): the caller's input is
    destroyed."""
    local = x @ weight_shard.T
    if bias_shard is not None:
        local = local + bias_shard
    x.zero_()
    return torch.cat(all_gather(comm, local.contiguous()), dim=-1)


def column_casts_to_float32(comm: Any, x: torch.Tensor, weight_shard: torch.Tensor,
                            bias_shard: torch.Tensor | None) -> torch.Tensor:
    """Casts its slice to float32 before gathering: float64 inputs come back as float32."""
    local = x @ weight_shard.T
    if bias_shard is not None:
        local = local + bias_shard
    return torch.cat(all_gather(comm, local.float().contiguous()), dim=-1)


# ---- 5.2 ZeRO-1 ----------------------------------------------------------------------------------

def _adam(param: torch.Tensor, grad: torch.Tensor, state: dict, lr: float) -> None:
    """The solved helper adam_update, as the exercise file has it."""
    if not state:
        state.update(step=0, exp_avg=torch.zeros_like(param),
                     exp_avg_sq=torch.zeros_like(param))
    state["step"] += 1
    state["exp_avg"].mul_(0.9).add_(grad, alpha=0.1)
    state["exp_avg_sq"].mul_(0.999).addcmul_(grad, grad, value=0.001)
    bias1, bias2 = 1 - 0.9 ** state["step"], 1 - 0.999 ** state["step"]
    denom = (state["exp_avg_sq"].sqrt() / math.sqrt(bias2)).add_(1e-8)
    param.addcdiv_(state["exp_avg"], denom, value=-lr / bias1)


def zero1_sums_gradients(comm: Any, params: torch.Tensor, grad: torch.Tensor, state: dict,
                         lr: float = 1e-3) -> None:
    """Reduce-scatters with a sum, not a mean (Adam's step hides the scale; its moments
    do not)."""
    mine = reduce_scatter(comm, grad, op="sum")
    shard = torch.tensor_split(params, comm.world_size)[comm.rank]
    _adam(shard, mine, state, lr)
    params.copy_(torch.cat(all_gather(comm, shard.clone())))


def zero1_replicated_state(comm: Any, params: torch.Tensor, grad: torch.Tensor, state: dict,
                           lr: float = 1e-3) -> None:
    """Plain data parallelism: all-reduces the gradient, keeps Adam's state for everything."""
    grad = grad.clone()
    all_reduce(comm, grad, op="mean")
    _adam(params, grad, state, lr)


def zero1_forgets_all_gather(comm: Any, params: torch.Tensor, grad: torch.Tensor,
                             state: dict, lr: float = 1e-3) -> None:
    """Updates its own shard and never shares it: the other shards go stale."""
    mine = reduce_scatter(comm, grad, op="mean")
    _adam(torch.tensor_split(params, comm.world_size)[comm.rank], mine, state, lr)


def zero1_divides_callers_grad(comm: Any, params: torch.Tensor, grad: torch.Tensor,
                               state: dict, lr: float = 1e-3) -> None:
    """Divides grad by N in place, then reduce-scatters a sum: the update is right, but the
    caller's gradient is changed."""
    grad.div_(comm.world_size)
    mine = reduce_scatter(comm, grad, op="sum")
    shard = torch.tensor_split(params, comm.world_size)[comm.rank]
    _adam(shard, mine, state, lr)
    params.copy_(torch.cat(all_gather(comm, shard.clone())))


# ---- 5.3 the mesh --------------------------------------------------------------------------------

def groups_stage_major(world_size: int, pp_size: int) -> tuple[list, list]:
    """Numbers the ranks stage-major, rank = stage * dp + replica."""
    if pp_size < 1 or world_size < 1 or world_size % pp_size:
        raise ValueError("pp_size must divide world_size")
    dp = world_size // pp_size
    return ([[s * dp + d for s in range(pp_size)] for d in range(dp)],
            [[s * dp + d for d in range(dp)] for s in range(pp_size)])


def groups_swapped(world_size: int, pp_size: int) -> tuple[list, list]:
    """Returns (data groups, pipeline groups): the two lists in the wrong order."""
    if pp_size < 1 or world_size < 1 or world_size % pp_size:
        raise ValueError("pp_size must divide world_size")
    dp = world_size // pp_size
    return ([[d * pp_size + s for d in range(dp)] for s in range(pp_size)],
            [[d * pp_size + s for s in range(pp_size)] for d in range(dp)])


def groups_no_validation(world_size: int, pp_size: int) -> tuple[list, list]:
    """Never raises: a pp_size that does not divide world_size drops ranks silently."""
    dp = world_size // pp_size if pp_size else 0
    return ([[d * pp_size + s for s in range(pp_size)] for d in range(dp)],
            [[d * pp_size + s for d in range(dp)] for s in range(pp_size)])


def groups_checks_pp_size_only(world_size: int, pp_size: int) -> tuple[list, list]:
    """Checks pp_size >= 1 and divisibility, never world_size: hybrid_groups(0, 1) returns
    ([], [[]])."""
    if pp_size < 1 or world_size % pp_size:
        raise ValueError("pp_size must divide world_size")
    dp = world_size // pp_size
    return ([[d * pp_size + s for s in range(pp_size)] for d in range(dp)],
            [[d * pp_size + s for d in range(dp)] for s in range(pp_size)])


def groups_asserts(world_size: int, pp_size: int) -> tuple[list, list]:
    """An assert where the contract asks for ValueError."""
    assert pp_size >= 1 and world_size >= 1 and world_size % pp_size == 0
    dp = world_size // pp_size
    return ([[d * pp_size + s for s in range(pp_size)] for d in range(dp)],
            [[d * pp_size + s for d in range(dp)] for s in range(pp_size)])


# ---- 5.4 Megatron's MLP ------------------------------------------------------------------------

class _F(torch.autograd.Function):
    """f: identity forward, all-reduce of the gradient backward (correct)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Any) -> torch.Tensor:  # noqa: ANN001
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        grad = grad.contiguous().clone()
        all_reduce(ctx.comm, grad)
        return grad, None


class _G(torch.autograd.Function):
    """g: all-reduce forward, identity backward (correct)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Any) -> torch.Tensor:  # noqa: ANN001
        out = x.contiguous().clone()
        all_reduce(comm, out)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        return grad, None


class _AllReduceBothWays(torch.autograd.Function):
    """All-reduce forward and backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Any) -> torch.Tensor:  # noqa: ANN001
        ctx.comm = comm
        out = x.contiguous().clone()
        all_reduce(comm, out)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        grad = grad.contiguous().clone()
        all_reduce(ctx.comm, grad)
        return grad, None


def _partial(comm: Any, x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None,
             w2: torch.Tensor, activation: Any = F.gelu) -> torch.Tensor:
    return F.linear(activation(F.linear(_F.apply(x, comm), w1, b1)), w2)


def megatron_reduces_twice(comm: Any, x: torch.Tensor, w1_shard: torch.Tensor,
                           b1_shard: torch.Tensor | None, w2_shard: torch.Tensor,
                           b2: torch.Tensor | None) -> torch.Tensor:
    """Right numbers, but a second all-reduce (a mean "to keep the ranks in sync") doubles
    the forward's traffic."""
    out = _G.apply(_partial(comm, x, w1_shard, b1_shard, w2_shard), comm)
    synced = out.detach().clone()
    all_reduce(comm, synced, op="mean")
    out = out + (synced - out.detach())
    return out + b2 if b2 is not None else out


def megatron_bias_before_sum(comm: Any, x: torch.Tensor, w1_shard: torch.Tensor,
                             b1_shard: torch.Tensor | None, w2_shard: torch.Tensor,
                             b2: torch.Tensor | None) -> torch.Tensor:
    """Adds b2 on every rank before the all-reduce: the sum holds N copies of it."""
    partial = _partial(comm, x, w1_shard, b1_shard, w2_shard)
    if b2 is not None:
        partial = partial + b2
    return _G.apply(partial, comm)


def megatron_bias_on_rank_0(comm: Any, x: torch.Tensor, w1_shard: torch.Tensor,
                            b1_shard: torch.Tensor | None, w2_shard: torch.Tensor,
                            b2: torch.Tensor | None) -> torch.Tensor:
    """Adds b2 on rank 0 only, before the all-reduce: the output is right, but only rank 0's
    b2 gets a gradient, so the replicas of b2 drift apart."""
    partial = _partial(comm, x, w1_shard, b1_shard, w2_shard)
    if b2 is not None and comm.rank == 0:
        partial = partial + b2
    return _G.apply(partial, comm)


def megatron_without_f(comm: Any, x: torch.Tensor, w1_shard: torch.Tensor,
                       b1_shard: torch.Tensor | None, w2_shard: torch.Tensor,
                       b2: torch.Tensor | None) -> torch.Tensor:
    """No f before the first linear: x's gradient stays this rank's partial one."""
    hidden = F.gelu(F.linear(x, w1_shard, b1_shard))
    out = _G.apply(F.linear(hidden, w2_shard), comm)
    return out + b2 if b2 is not None else out


def megatron_g_reduces_backward(comm: Any, x: torch.Tensor, w1_shard: torch.Tensor,
                                b1_shard: torch.Tensor | None, w2_shard: torch.Tensor,
                                b2: torch.Tensor | None) -> torch.Tensor:
    """g all-reduces the gradient in backward too: every shard's gradient is N times too
    big (and the backward moves twice the bytes)."""
    out = _AllReduceBothWays.apply(_partial(comm, x, w1_shard, b1_shard, w2_shard), comm)
    return out + b2 if b2 is not None else out


def megatron_relu(comm: Any, x: torch.Tensor, w1_shard: torch.Tensor,
                  b1_shard: torch.Tensor | None, w2_shard: torch.Tensor,
                  b2: torch.Tensor | None) -> torch.Tensor:
    """ReLU where the block has GeLU."""
    out = _G.apply(_partial(comm, x, w1_shard, b1_shard, w2_shard, F.relu), comm)
    return out + b2 if b2 is not None else out


def megatron_plain_all_reduce(comm: Any, x: torch.Tensor, w1_shard: torch.Tensor,
                              b1_shard: torch.Tensor | None, w2_shard: torch.Tensor,
                              b2: torch.Tensor | None) -> torch.Tensor:
    """Sums the partial outputs with a bare all_reduce on a detached copy: the forward is
    right, but autograd never sees the sum, so nothing reaches the weights."""
    partial = F.linear(F.gelu(F.linear(x, w1_shard, b1_shard)), w2_shard).detach().clone()
    all_reduce(comm, partial)
    return partial + b2 if b2 is not None else partial


def megatron_hook_on_x(comm: Any, x: torch.Tensor, w1_shard: torch.Tensor,
                       b1_shard: torch.Tensor | None, w2_shard: torch.Tensor,
                       b2: torch.Tensor | None) -> torch.Tensor:
    """f as a hook on x that all-reduces x's gradient: right while x feeds nothing else, but
    the hook sums all of x's gradient (a residual's share too), and a second call adds a
    second hook."""
    def summed(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()
        all_reduce(comm, grad)
        return grad

    if x.requires_grad:
        x.register_hook(summed)
    hidden = F.gelu(F.linear(x, w1_shard, b1_shard))
    out = _G.apply(F.linear(hidden, w2_shard), comm)
    return out + b2 if b2 is not None else out


MUTANTS: dict[str, list[str]] = {
    "5.1": ["column_cat_on_batch_dim", "column_forgets_bias", "column_whole_weight_everywhere",
            "column_zeroes_callers_x", "column_casts_to_float32"],
    "5.2": ["zero1_sums_gradients", "zero1_replicated_state", "zero1_forgets_all_gather",
            "zero1_divides_callers_grad"],
    "5.3": ["groups_stage_major", "groups_swapped", "groups_no_validation",
            "groups_checks_pp_size_only", "groups_asserts"],
    "5.4": ["megatron_reduces_twice", "megatron_bias_before_sum", "megatron_bias_on_rank_0",
            "megatron_without_f", "megatron_g_reduces_backward", "megatron_relu",
            "megatron_plain_all_reduce", "megatron_hook_on_x"],
}
