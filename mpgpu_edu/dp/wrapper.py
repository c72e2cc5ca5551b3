"""DDP as a wrapper around a replica (``wrap_ddp``), made of ``dp.ddp``'s pieces: the
package's reference of exercise 3.5, which lesson 03's demos and the side-by-side with torch's
``DistributedDataParallel`` run until the learner's passes its check."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mpgpu_edu.collectives import all_reduce
from mpgpu_edu.comm import Communicator
from mpgpu_edu.dp.ddp import broadcast_parameters, make_buckets
from mpgpu_edu.replica.flat import flatten_grads, unflatten_grads


class DDPWrapper:
    """DDP as a wrapper around a replica, from ``dp.ddp``'s pieces: rank 0's parameters
    broadcast once (``broadcast_parameters``), buckets in reverse parameter order
    (``make_buckets``), and a hook per parameter that starts its bucket's all-reduce (mean)
    on the comm stream the moment the bucket's last gradient is in. ``finish()`` waits for
    every bucket and copies the means back into ``.grad``; call it after each backward.
    Cost: as ``dp.ddp_step_overlapped``, plus the broadcast once."""

    def __init__(self, comm: Communicator, module: nn.Module, bucket_cap_bytes: int) -> None:
        self.comm, self.module = comm, module
        broadcast_parameters(comm, module)
        self.buckets = make_buckets(list(module.parameters()), bucket_cap_bytes)
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.missing = [len(bucket) for bucket in self.buckets]
        self.started: list[tuple[int, torch.Tensor, Any]] = []
        self.hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready)
                      for p in module.parameters()]

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.module(*inputs)

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        i = self.bucket_of[id(param)]
        self.missing[i] -= 1
        if self.missing[i] == 0:
            flat = flatten_grads(self.buckets[i])
            self.started.append((i, flat, self.comm.run_async(all_reduce, self.comm, flat,
                                                              "mean")))

    def finish(self) -> None:
        if len(self.started) != len(self.buckets):
            raise RuntimeError(f"only {len(self.started)} of {len(self.buckets)} buckets got "
                               "all their gradients: does every parameter take part?")
        for i, flat, work in self.started:
            work.wait()
            unflatten_grads(flat, self.buckets[i])
        self.started.clear()
        self.missing = [len(bucket) for bucket in self.buckets]


def wrap_ddp(comm: Communicator, module: nn.Module, bucket_cap_bytes: int) -> DDPWrapper:
    """The reference of exercise 3.5: ``DDPWrapper(comm, module, bucket_cap_bytes)``."""
    return DDPWrapper(comm, module, bucket_cap_bytes)
