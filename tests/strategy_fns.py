"""SPMD functions the strategy tests run on gloo worker processes (which import functions by
name, so they live in a module, not inside the tests)."""

from __future__ import annotations

import functools

from mpgpu_edu.comm.base import Communicator
from mpgpu_edu.replica.data import make_mlp
from mpgpu_edu.dp.ddp import ddp_step, ddp_step_bucketed, ddp_step_overlapped, train_ddp

SIZES = (8, 16, 16, 2)
BUCKET_BYTES = 300  # several buckets for the small model

model_fn = functools.partial(make_mlp, SIZES)

STEP_FNS = {
    "naive": ddp_step,
    "bucketed": functools.partial(ddp_step_bucketed, bucket_bytes=BUCKET_BYTES),
    "overlapped": functools.partial(ddp_step_overlapped, bucket_bytes=BUCKET_BYTES),
}


def train_every_ddp_variant(comm: Communicator, batches: list, optimizer: str,
                            lr: float) -> dict:
    """``train_ddp`` with every step function in turn, in one launch: {variant: result}."""
    return {name: train_ddp(comm, step_fn, model_fn, batches, optimizer, lr)
            for name, step_fn in STEP_FNS.items()}

