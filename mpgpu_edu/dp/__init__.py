"""Data parallel: a full replica of the model on every device, a shard of every batch.

- ``dataparallel``  ``nn.DataParallel``, simulated: one process, device 0 does the extra work
- ``ddp``           DDP from scratch: ``ddp_step`` (naive), ``ddp_step_bucketed``,
                    ``ddp_step_overlapped``, ``ddp_step_accumulated``; ``train_ddp``
- ``scaling``       step time against world size on simulated clusters (meta tensors)
"""

from __future__ import annotations

import functools
from typing import Any

from mpgpu_edu.replica.data import DEMO_BATCH, DEMO_LR, DEMO_SIZES, make_batches, make_mlp
from mpgpu_edu.dp.dataparallel import dataparallel_step, train_dataparallel
from mpgpu_edu.dp.ddp import (DEFAULT_BUCKET_BYTES, ddp_step, ddp_step_accumulated,
                              ddp_step_bucketed, ddp_step_overlapped, make_buckets, train_ddp)
from mpgpu_edu.replica.reference import compare_to_reference, train_single

__all__ = ["DEFAULT_BUCKET_BYTES", "VARIANTS", "dataparallel_step", "ddp_step",
           "ddp_step_accumulated", "ddp_step_bucketed", "ddp_step_overlapped", "make_buckets",
           "run_demo", "train_dataparallel", "train_ddp", "train_demo"]

DEMO_BUCKET_BYTES = 2048  # small, so that the demo model (5.6 KB of gradients) has 3 buckets
VARIANTS = ("naive", "bucketed", "overlapped", "accumulated", "dataparallel")


def _step_fn(variant: str, bucket_bytes: int, micro_steps: int) -> Any:
    steps = {"naive": ddp_step,
             "bucketed": functools.partial(ddp_step_bucketed, bucket_bytes=bucket_bytes),
             "overlapped": functools.partial(ddp_step_overlapped, bucket_bytes=bucket_bytes),
             "accumulated": functools.partial(ddp_step_accumulated, micro_steps=micro_steps,
                                              bucket_bytes=bucket_bytes)}
    if variant not in steps and variant != "dataparallel":
        raise ValueError(f"unknown DDP variant {variant!r}: choose one of {', '.join(VARIANTS)}")
    return steps.get(variant)


def run_demo(backend: str, world_size: int, steps: int, optimizer: str, *,
             variant: str = "overlapped", batch_size: int = DEMO_BATCH, lr: float = DEMO_LR,
             bucket_bytes: int = DEMO_BUCKET_BYTES, micro_steps: int = 2,
             cluster: Any = None, timeout: float | None = None, **_: Any) -> dict:
    """Train the demo MLP with DDP (``variant``) on ``world_size`` ranks and compare with
    single-device training. ``cluster`` (simulator only) defaults to ``world_size`` devices
    on a uniform network; ``timeout``: seconds the ranks get (default launch's). Returns the
    report of ``compare_to_reference`` plus the ``variant``, ``makespan_s`` and, on the
    simulator, the ``trace``."""
    from mpgpu_edu.comm import launch
    from mpgpu_edu.comm.launch import DEFAULT_TIMEOUT_S
    from mpgpu_edu.replica.data import check_split

    check_split(batch_size, world_size)
    step_fn = _step_fn(variant, bucket_bytes, micro_steps)
    model_fn = functools.partial(make_mlp, DEMO_SIZES)
    batches = make_batches(steps, batch_size, DEMO_SIZES[0], DEMO_SIZES[-1])
    target = cluster if (cluster is not None and backend == "sim") else world_size
    if variant == "dataparallel":
        run = launch(train_dataparallel, target, model_fn, batches, optimizer, lr,
                     backend=backend, timeout=timeout or DEFAULT_TIMEOUT_S)
    else:
        run = launch(train_ddp, target, step_fn, model_fn, batches, optimizer, lr,
                     backend=backend, timeout=timeout or DEFAULT_TIMEOUT_S)
    result = run.results[0]
    report = compare_to_reference("ddp", backend, world_size, optimizer, result["params"],
                                  result["losses"],
                                  train_single(model_fn, batches, optimizer, lr))
    report.update(variant=variant, makespan_s=run.trace.makespan, trace=run.trace)
    return report


def train_demo(comm: Any, steps: int = 5, optimizer: str = "sgd",
               variant: str = "overlapped") -> dict:
    """SPMD, for ``torchrun -m mpgpu_edu.run mpgpu_edu.dp:train_demo``: every rank trains the
    demo MLP with DDP and compares with single-device training (which it runs itself).
    Returns the report of ``compare_to_reference``."""
    from mpgpu_edu.replica.data import check_split

    check_split(DEMO_BATCH, comm.world_size)
    model_fn = functools.partial(make_mlp, DEMO_SIZES)
    batches = make_batches(steps, DEMO_BATCH, DEMO_SIZES[0], DEMO_SIZES[-1])
    step_fn = _step_fn(variant, DEMO_BUCKET_BYTES, 2)
    if step_fn is None:
        result = train_dataparallel(comm, model_fn, batches, optimizer, DEMO_LR)
    else:
        result = train_ddp(comm, step_fn, model_fn, batches, optimizer, DEMO_LR)
    backend = "nccl" if comm.device.type == "cuda" else "gloo"
    report = compare_to_reference("ddp", backend, comm.world_size, optimizer, result["params"],
                                  result["losses"],
                                  train_single(model_fn, batches, optimizer, DEMO_LR))
    report.update(variant=variant)
    return report
