"""Plausible wrong answers for lesson 03 (see tests/mutants/__init__.py)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mpgpu_edu.collectives import all_reduce, broadcast

# ---- 3.1 ----------------------------------------------------------------------------------


def average_sums(comm: Any, model: nn.Module) -> None:
    """Sums the gradients instead of averaging them: N times too large a step."""
    for p in model.parameters():
        all_reduce(comm, p.grad, op="sum")


def average_weights_only(comm: Any, model: nn.Module) -> None:
    """Averages the weight matrices and forgets the biases (dim() > 1 only)."""
    for p in model.parameters():
        if p.dim() > 1:
            all_reduce(comm, p.grad, op="mean")


def average_through_rank_0(comm: Any, model: nn.Module) -> None:
    """Right numbers, naive pattern: every gradient through rank 0 (too many bytes there)."""
    for p in model.parameters():
        all_reduce(comm, p.grad, op="mean", algo="naive")


# ---- 3.2 ----------------------------------------------------------------------------------

def _greedy(order: list[int], sizes: list[int], bucket_bytes: int,
            strict: bool = False) -> list[list[int]]:
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for index in order:
        full = filled + sizes[index] >= bucket_bytes if strict else (
            filled + sizes[index] > bucket_bytes)
        if current and full:
            buckets.append(current)
            current, filled = [], 0
        current.append(index)
        filled += sizes[index]
    return buckets + ([current] if current else [])


def buckets_in_forward_order(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Fills buckets from the first parameter: the first bucket is the last one ready."""
    return _greedy(list(range(len(sizes))), sizes, bucket_bytes)


def buckets_never_exactly_full(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Closes a bucket when it would *reach* the cap (>= instead of >): one short."""
    return _greedy(list(reversed(range(len(sizes)))), sizes, bucket_bytes, strict=True)


# ---- 3.3 ----------------------------------------------------------------------------------

def overlap_after_backward(comm: Any, model: nn.Module, loss: torch.Tensor) -> None:
    """Averages correctly but only after backward has ended: nothing overlaps."""
    loss.backward()
    for param in model.parameters():
        all_reduce(comm, param.grad, op="mean")


def overlap_blocking_hooks(comm: Any, model: nn.Module, loss: torch.Tensor) -> None:
    """Hooks all-reduce synchronously: backward waits for every message."""
    handles = [p.register_post_accumulate_grad_hook(
        lambda p: all_reduce(comm, p.grad, op="mean")) for p in model.parameters()]
    loss.backward()
    for handle in handles:
        handle.remove()


def overlap_hooks_left_behind(comm: Any, model: nn.Module, loss: torch.Tensor) -> None:
    """Overlaps, but never removes its hooks: a later backward communicates again."""
    works = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(
            lambda p: works.append(comm.run_async(all_reduce, comm, p.grad, "mean")))
    loss.backward()
    for work in works:
        work.wait()


def overlap_never_waits(comm: Any, model: nn.Module, loss: torch.Tensor) -> None:
    """Starts every all-reduce from a hook and removes the hooks, but returns without waiting:
    the gradients are read before their all-reduces have finished."""
    works = []
    handles = [p.register_post_accumulate_grad_hook(
        lambda p: works.append(comm.run_async(all_reduce, comm, p.grad, "mean")))
        for p in model.parameters()]
    loss.backward()
    for handle in handles:
        handle.remove()


# ---- 3.4 ----------------------------------------------------------------------------------

def adam_memory_forgets_frozen(model: nn.Module, precision: str = "fp32") -> dict[str, int]:
    """Counts gradients and Adam state for frozen parameters too."""
    if precision not in ("fp32", "mixed"):
        raise ValueError(precision)
    weight, state = (4, 8) if precision == "fp32" else (2, 12)
    total = sum(p.numel() for p in model.parameters())
    return {"parameters": weight * total, "gradients": weight * total, "optimizer": state * total}


def adam_memory_one_moment(model: nn.Module, precision: str = "fp32") -> dict[str, int]:
    """Adam keeps one moment (4 bytes) instead of two; mixed forgets the master copy."""
    if precision not in ("fp32", "mixed"):
        raise ValueError(precision)
    weight, state = (4, 4) if precision == "fp32" else (2, 8)
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"parameters": weight * total, "gradients": weight * trainable,
            "optimizer": state * trainable}


def adam_memory_never_refuses(model: nn.Module, precision: str = "fp32") -> dict[str, int]:
    """Right for fp32 and mixed, but any other precision is counted as mixed, never refused."""
    weight, state = (4, 8) if precision == "fp32" else (2, 12)
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"parameters": weight * total, "gradients": weight * trainable,
            "optimizer": state * trainable}


# ---- 3.5: one DDP wrapper, each mutant gets one thing wrong ---------------------------------

class _DDP:
    def __init__(self, comm: Any, module: nn.Module, cap: int, *, op: str = "mean",
                 forward_order: bool = False, sync: bool = False, broadcasts: bool = True,
                 per_parameter: bool = False, at_finish: bool = False,
                 resets: bool = True, per_parameter_broadcast: bool = False) -> None:
        self.comm, self.module, self.op = comm, module, op
        self.sync, self.at_finish, self.resets = sync, at_finish, resets
        params = list(module.parameters())
        if broadcasts and per_parameter_broadcast:
            with torch.no_grad():
                for p in params:
                    broadcast(comm, p.data, root=0)
        elif broadcasts:
            with torch.no_grad():
                flat = torch.cat([p.reshape(-1) for p in params])
                broadcast(comm, flat, root=0)
                for p, part in zip(params, flat.split([p.numel() for p in params])):
                    p.copy_(part.view_as(p))
        order = params if forward_order else params[::-1]
        self.buckets: list[list[torch.Tensor]] = []
        filled = 0
        for p in order:
            size = p.numel() * p.element_size()
            if not self.buckets or per_parameter or filled + size > cap:
                self.buckets.append([])
                filled = 0
            self.buckets[-1].append(p)
            filled += size
        self.bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self.missing = [len(b) for b in self.buckets]
        self.started: list[tuple[int, torch.Tensor, Any]] = []
        for p in params:
            p.register_post_accumulate_grad_hook(self._ready)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.module(*inputs)

    def _launch(self, i: int) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])
        if self.sync:
            all_reduce(self.comm, flat, self.op)
            work = self.comm.run_async(lambda: None)
        else:
            work = self.comm.run_async(all_reduce, self.comm, flat, self.op)
        self.started.append((i, flat, work))

    def _ready(self, param: torch.Tensor) -> None:
        i = self.bucket_of[id(param)]
        self.missing[i] -= 1
        if self.missing[i] == 0 and not self.at_finish:
            self._launch(i)

    def finish(self) -> None:
        if self.at_finish:
            for i in range(len(self.buckets)):
                self._launch(i)
        for i, flat, work in self.started:
            work.wait()
            offset = 0
            for p in self.buckets[i]:
                p.grad.copy_(flat[offset: offset + p.numel()].view_as(p.grad))
                offset += p.numel()
        self.started.clear()
        if self.resets:
            self.missing = [len(b) for b in self.buckets]


def ddp_sums(comm: Any, module: nn.Module, bucket_cap_bytes: int) -> _DDP:
    """All-reduces with op="sum": every step is world_size times too large."""
    return _DDP(comm, module, bucket_cap_bytes, op="sum")


def ddp_forward_buckets(comm: Any, module: nn.Module, bucket_cap_bytes: int) -> _DDP:
    """Cuts the buckets in forward parameter order: other buckets than the contract's."""
    return _DDP(comm, module, bucket_cap_bytes, forward_order=True)


def ddp_waits_in_hook(comm: Any, module: nn.Module, bucket_cap_bytes: int) -> _DDP:
    """The hook runs the bucket's all-reduce synchronously: backward waits for it."""
    return _DDP(comm, module, bucket_cap_bytes, sync=True)


def ddp_forgets_broadcast(comm: Any, module: nn.Module, bucket_cap_bytes: int) -> _DDP:
    """Never broadcasts rank 0's parameters: replicas start (and stay) apart."""
    return _DDP(comm, module, bucket_cap_bytes, broadcasts=False)


def ddp_broadcasts_per_parameter(comm: Any, module: nn.Module, bucket_cap_bytes: int) -> _DDP:
    """Right in every step, but builds the replicas with one broadcast per parameter (the
    contract: one broadcast of all of them, as DDP's flat broadcast at construction)."""
    return _DDP(comm, module, bucket_cap_bytes, per_parameter_broadcast=True)


def ddp_no_buckets(comm: Any, module: nn.Module, bucket_cap_bytes: int) -> _DDP:
    """Ignores the cap: one all-reduce per parameter."""
    return _DDP(comm, module, bucket_cap_bytes, per_parameter=True)


def ddp_all_reduce_in_finish(comm: Any, module: nn.Module, bucket_cap_bytes: int) -> _DDP:
    """Launches every bucket from finish(), after backward: right numbers, no overlap."""
    return _DDP(comm, module, bucket_cap_bytes, at_finish=True)


def ddp_only_first_step(comm: Any, module: nn.Module, bucket_cap_bytes: int) -> _DDP:
    """Forgets to reset the bucket counters: from the second step on nothing is averaged."""
    return _DDP(comm, module, bucket_cap_bytes, resets=False)


MUTANTS: dict[str, list[str]] = {
    "3.1": ["average_sums", "average_weights_only", "average_through_rank_0"],
    "3.2": ["buckets_in_forward_order", "buckets_never_exactly_full"],
    "3.3": ["overlap_after_backward", "overlap_blocking_hooks", "overlap_hooks_left_behind",
            "overlap_never_waits"],
    "3.4": ["adam_memory_forgets_frozen", "adam_memory_one_moment", "adam_memory_never_refuses"],
    "3.5": ["ddp_sums", "ddp_forward_buckets", "ddp_waits_in_hook", "ddp_forgets_broadcast",
            "ddp_broadcasts_per_parameter", "ddp_no_buckets", "ddp_all_reduce_in_finish",
            "ddp_only_first_step"],
}
