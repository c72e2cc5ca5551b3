"""Parameters or gradients as one flat vector, and back.

A message, a DDP bucket or a parameter server's shard is one contiguous tensor, so the
tensors it carries are concatenated (``torch.nn.utils.parameters_to_vector``) and, once it has
arrived, copied back in place. Copied, not rebound: ``vector_to_parameters`` would make every
parameter a view into the message's buffer, which the next message overwrites.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector


def flat_params(model: nn.Module) -> torch.Tensor:
    """The model's parameters, detached and concatenated into one new vector."""
    return parameters_to_vector(p.detach() for p in model.parameters())


def flatten_grads(params: Iterable[torch.Tensor]) -> torch.Tensor:
    """The parameters' gradients (a bucket's, a model's) concatenated into one new vector."""
    return parameters_to_vector(p.grad for p in params)


def _copy_from(flat: torch.Tensor, tensors: Iterable[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        t.copy_(flat[offset: offset + t.numel()].view_as(t))
        offset += t.numel()


def load_flat_params(model: nn.Module, flat: torch.Tensor) -> None:
    """Copy ``flat`` into the model's parameters, in place (not an autograd op)."""
    with torch.no_grad():
        _copy_from(flat, model.parameters())


def unflatten_grads(flat: torch.Tensor, params: Iterable[torch.Tensor]) -> None:
    """Copy ``flat`` back into the parameters' existing gradients, in place."""
    _copy_from(flat, [p.grad for p in params])


def grads_from_flat(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Give every parameter a new gradient: its slice of ``flat``, copied."""
    offset = 0
    for p in params:
        p.grad = flat[offset: offset + p.numel()].view_as(p).clone()
        offset += p.numel()
