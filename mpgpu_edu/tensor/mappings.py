"""Megatron's communication as autograd functions (its ``mappings``): **f**
(``copy_to_parallel``: identity forward, all-reduce backward), **g** (``reduce_from_parallel``:
all-reduce forward, identity backward), and the gather and scatter of a split dimension; and
how features are split over ranks (``shard_sizes``, ``shard``: ``torch.tensor_split``'s)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mpgpu_edu.collectives import all_gather, all_reduce
from mpgpu_edu.comm import Communicator


def shard_sizes(n: int, world_size: int) -> list[int]:
    """Features per rank when ``n`` are split over ``world_size`` ranks (tensor_split's)."""
    return [n // world_size + (1 if r < n % world_size else 0) for r in range(world_size)]


def shard(tensor: torch.Tensor, comm: Communicator, dim: int) -> torch.Tensor:
    """This rank's slice of ``tensor`` along ``dim`` (a copy)."""
    return torch.tensor_split(tensor, comm.world_size, dim)[comm.rank].clone()


class _CopyToParallel(torch.autograd.Function):
    """Megatron's f: identity forward; all-reduce (sum) of the gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator) -> torch.Tensor:  # noqa: ANN001
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        grad = grad.contiguous().clone()
        all_reduce(ctx.comm, grad)
        return grad, None


class _ReduceFromParallel(torch.autograd.Function):
    """Megatron's g: all-reduce (sum) forward; identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator) -> torch.Tensor:  # noqa: ANN001
        out = x.contiguous().clone()
        all_reduce(comm, out)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        return grad, None


class _GatherFromParallel(torch.autograd.Function):
    """All-gather slices along ``dim`` forward; keep this rank's slice of the gradient
    backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator, dim: int,  # noqa: ANN001
                sizes: list[int]) -> torch.Tensor:
        ctx.comm, ctx.dim, ctx.sizes = comm, dim, sizes
        longest = max(sizes)
        if x.shape[dim] < longest:  # all_gather moves equal shapes: pad, then trim
            pad = list(x.shape)
            pad[dim] = longest - x.shape[dim]
            x = torch.cat([x, x.new_zeros(pad)], dim)
        pieces = all_gather(comm, x.contiguous())
        return torch.cat([p.narrow(dim, 0, n) for p, n in zip(pieces, sizes)], dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # noqa: ANN001
        start = sum(ctx.sizes[:ctx.comm.rank])
        mine = grad.narrow(ctx.dim, start, ctx.sizes[ctx.comm.rank]).contiguous()
        return mine, None, None, None


class _ScatterToParallel(torch.autograd.Function):
    """Keep this rank's slice along ``dim`` forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator, dim: int) -> torch.Tensor:  # noqa
        ctx.comm, ctx.dim = comm, dim
        ctx.sizes = shard_sizes(x.shape[dim], comm.world_size)
        return shard(x, comm, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # noqa: ANN001
        return _GatherFromParallel.apply(grad, ctx.comm, ctx.dim, ctx.sizes), None, None


def copy_to_parallel(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Megatron's f: ``x`` unchanged; backward, the gradients of all ranks summed.
    Cost: backward, one all-reduce of ``x``'s size."""
    return _CopyToParallel.apply(x, comm)


def reduce_from_parallel(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Megatron's g: the sum of ``x`` over all ranks; backward, the gradient unchanged.
    Cost: forward, one all-reduce of ``x``'s size."""
    return _ReduceFromParallel.apply(x, comm)


def gather_from_parallel(x: torch.Tensor, comm: Communicator, dim: int = -1,
                         sizes: Sequence[int] | None = None) -> torch.Tensor:
    """Every rank's slice of ``x``, concatenated along ``dim`` in rank order. ``sizes`` are the
    slices' lengths (default: all equal to this rank's). Backward: this rank's slice of the
    gradient. Cost: forward, one all-gather (each rank receives N - 1 slices)."""
    sizes = list(sizes) if sizes is not None else [x.shape[dim]] * comm.world_size
    return _GatherFromParallel.apply(x, comm, dim % x.dim(), sizes)


def scatter_to_parallel(x: torch.Tensor, comm: Communicator, dim: int = -1) -> torch.Tensor:
    """This rank's slice of ``x`` along ``dim`` (tensor_split's); backward, the gradient's
    slices gathered. Cost: backward, one all-gather."""
    return _ScatterToParallel.apply(x, comm, dim % x.dim())
