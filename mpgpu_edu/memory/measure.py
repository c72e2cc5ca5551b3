"""Measure what training really holds, and write it into a rank's memory ledger.

``mpgpu_edu.memory.estimate`` answers on paper (bytes per parameter times parameters). These
helpers count the bytes of the actual tensors of a run and record them with
``comm.memory.alloc``, so a strategy's timeline shows its memory by category, and a test can
check the paper numbers against the real ones:

- ``track_parameters(comm, module)``       "parameters": every parameter's bytes;
- ``track_gradients(comm, module)``        "gradients": one gradient per trainable parameter;
- ``track_optimizer_state(comm, opt)``     "optimizer": the optimizer's state tensors, as they
  are after a step (call ``.update()`` to measure again);
- ``saved_activations(comm, label)``       "activations": what autograd saves for backward;
- bucket buffers are recorded by the DDP code itself as "comm_buffers".

Bytes are ``numel * element_size`` (a meta tensor has the bytes it would have). Optimizer
state counts every tensor in ``optimizer.state``: Adam keeps ``exp_avg`` and ``exp_avg_sq``
(2 x the parameters' bytes) plus a 0-d float32 ``step`` per parameter tensor (4 bytes each).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from mpgpu_edu.comm.base import Communicator, nbytes_of


class Tracked:
    """Bytes recorded under one category for one thing; ``update()`` measures again and
    re-records if the number changed; ``free()`` releases the record."""

    def __init__(self, comm: Communicator, category: str, label: str,
                 measure: Callable[[], int]) -> None:
        self.comm, self.category, self.label, self.measure = comm, category, label, measure
        self.tokens: list[int] = []
        self.nbytes = 0
        self.update()

    def update(self) -> int:
        """Measure again; returns the bytes now recorded."""
        nbytes = self.measure()
        if nbytes != self.nbytes or not self.tokens:
            self.free()
            self.tokens = [self.comm.memory.alloc(self.category, nbytes, self.label)]
            self.nbytes = nbytes
        return self.nbytes

    def free(self) -> None:
        for token in self.tokens:
            self.comm.memory.free(token)
        self.tokens, self.nbytes = [], 0


def parameter_bytes(module: nn.Module) -> int:
    return sum(nbytes_of(p) for p in module.parameters())


def gradient_bytes(module: nn.Module) -> int:
    """Bytes of the gradients: the ``.grad`` where it exists, else the parameter's own size
    (backward allocates a gradient of the parameter's shape and dtype)."""
    return sum(nbytes_of(p.grad if p.grad is not None else p)
               for p in module.parameters() if p.requires_grad)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in ``optimizer.state`` (moments, step counts, ...)."""
    return sum(nbytes_of(value) for state in optimizer.state.values()
               for value in state.values() if isinstance(value, torch.Tensor))


def track_parameters(comm: Communicator, module: nn.Module,
                     label: str = "parameters") -> Tracked:
    """Record the module's parameters: sum of ``p.numel() * p.element_size()``."""
    return Tracked(comm, "parameters", label, lambda: parameter_bytes(module))


def track_gradients(comm: Communicator, module: nn.Module, label: str = "gradients") -> Tracked:
    """Record one gradient per trainable parameter (see ``gradient_bytes``)."""
    return Tracked(comm, "gradients", label, lambda: gradient_bytes(module))


def track_optimizer_state(comm: Communicator, optimizer: torch.optim.Optimizer,
                          label: str = "optimizer state") -> Tracked:
    """Record the optimizer's state tensors as they are now. Most optimizers create their
    state lazily, in the first ``step()``: track after it, or ``update()`` after it."""
    return Tracked(comm, "optimizer", label, lambda: optimizer_state_bytes(optimizer))


def _is_parameter(tensor: torch.Tensor) -> bool:
    """A parameter, or a view of one (``Linear`` saves ``weight.t()``): those bytes are
    already counted under "parameters"."""
    base = tensor._base if tensor._base is not None else tensor
    return base.is_leaf and base.requires_grad


class SavedActivations:
    """What autograd saved for backward inside one ``saved_activations`` block."""

    def __init__(self, comm: Communicator, label: str) -> None:
        self.comm, self.label = comm, label
        self.tokens: list[int] = []
        self.nbytes = 0
        # Keyed by storage: a tensor saved by two ops (a ReLU's output is also the next
        # Linear's input) is one block of memory, counted once. Holding the storages keeps
        # their keys unique until free().
        self._storages: dict[int, torch.UntypedStorage] = {}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if not _is_parameter(tensor):
            storage = tensor.untyped_storage()
            if storage._cdata not in self._storages:
                self._storages[storage._cdata] = storage
                nbytes = storage.nbytes()
                self.tokens.append(self.comm.memory.alloc("activations", nbytes, self.label))
                self.nbytes += nbytes
        return tensor

    def free(self) -> None:
        """Release the records (call it after backward, when autograd let them go)."""
        for token in self.tokens:
            self.comm.memory.free(token)
        self.tokens, self.nbytes = [], 0
        self._storages.clear()


@contextlib.contextmanager
def saved_activations(comm: Communicator, label: str = "activations") -> Iterator[SavedActivations]:
    """Record every tensor autograd saves for backward inside the block as "activations"::

        with saved_activations(comm, "mb 0") as acts:
            loss = loss_fn(model(x), y)
        loss.backward()
        acts.free()

    Counts storage bytes, once per storage (a tensor saved twice, or two views of one
    tensor, count once; a view counts its whole storage, which is what stays alive).
    Parameters and views of them are skipped: they are "parameters". The inputs and targets
    that backward needs are counted: backward keeps them alive."""
    acts = SavedActivations(comm, label)
    with torch.autograd.graph.saved_tensors_hooks(acts.pack, lambda tensor: tensor):
        yield acts
