"""Parameter server: some ranks keep the parameters, the others compute gradients.

- ``sync``     one server (the last rank); every step waits for every worker
- ``sharded``  K servers (the last K ranks), each owning 1/K of the parameters
- ``async_``   no waiting, or bounded staleness (SSP: a fast worker waits, nothing is dropped):
               an event simulation with real updates
- ``ssp``      the same bounded-staleness protocol as an SPMD program (``ssp_program``)
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.nn.utils import parameters_to_vector

from mpgpu_edu.replica.data import DEMO_BATCH, DEMO_LR, DEMO_SIZES, make_batches, make_mlp
from mpgpu_edu.ps.async_ import AsyncResult, async_ps, sync_ps_step_seconds
from mpgpu_edu.ps.sharded import ps_step_sharded, servers_of, train_ps_sharded
from mpgpu_edu.ps.ssp import ssp_program
from mpgpu_edu.ps.sync import check_ps_world, ps_step, server_step, train_ps, worker_step
from mpgpu_edu.replica.reference import compare_to_reference, train_single

__all__ = ["AsyncResult", "async_ps", "check_ps_world", "ps_step", "ps_step_sharded",
           "run_demo", "server_step", "servers_of", "ssp_program", "sync_ps_step_seconds",
           "train_ps", "train_demo", "train_ps_sharded", "worker_step"]


def run_demo(backend: str, world_size: int, steps: int, optimizer: str, *,
             n_servers: int = 1, batch_size: int = DEMO_BATCH, lr: float = DEMO_LR,
             cluster: Any = None, timeout: float | None = None, **_: Any) -> dict:
    """Train the demo MLP with a synchronous parameter server (``n_servers`` > 1: sharded)
    on ``world_size`` ranks, the last ``n_servers`` of them servers, and compare with
    single-device training. ``timeout``: seconds the ranks get (default launch's).
    Returns the report of ``compare_to_reference`` plus ``n_servers``, ``makespan_s`` and
    ``trace``."""
    from mpgpu_edu.comm import launch
    from mpgpu_edu.comm.launch import DEFAULT_TIMEOUT_S
    from mpgpu_edu.replica.data import check_split

    check_ps_world(world_size, n_servers)
    check_split(batch_size, world_size - n_servers, "workers")
    model_fn = functools.partial(make_mlp, DEMO_SIZES)
    batches = make_batches(steps, batch_size, DEMO_SIZES[0], DEMO_SIZES[-1])
    target = cluster if (cluster is not None and backend == "sim") else world_size
    if n_servers == 1:
        run = launch(train_ps, target, model_fn, batches, optimizer, lr, backend=backend,
                     timeout=timeout or DEFAULT_TIMEOUT_S)
    else:
        run = launch(train_ps_sharded, target, model_fn, batches, n_servers, optimizer, lr,
                     backend=backend, timeout=timeout or DEFAULT_TIMEOUT_S)
    result = run.results[0]  # rank 0 is a worker
    report = compare_to_reference("ps", backend, world_size, optimizer, result["params"],
                                  result["losses"],
                                  train_single(model_fn, batches, optimizer, lr))
    report.update(n_servers=n_servers, makespan_s=run.trace.makespan, trace=run.trace)
    return report


def train_demo(comm: Any, steps: int = 5, optimizer: str = "sgd", n_servers: int = 1) -> dict:
    """SPMD, for ``torchrun -m mpgpu_edu.run mpgpu_edu.ps:train_demo``: the demo MLP on a
    parameter server (the last ``n_servers`` ranks serve), compared with single-device
    training on every rank. Returns the report of ``compare_to_reference`` (a server of the
    sharded parameter server compares its shard with the same slice of the reference)."""
    from mpgpu_edu.replica.data import check_split

    check_ps_world(comm.world_size, n_servers)
    check_split(DEMO_BATCH, comm.world_size - n_servers, "workers")
    model_fn = functools.partial(make_mlp, DEMO_SIZES)
    batches = make_batches(steps, DEMO_BATCH, DEMO_SIZES[0], DEMO_SIZES[-1])
    if n_servers == 1:
        result = train_ps(comm, model_fn, batches, optimizer, DEMO_LR)
    else:
        result = train_ps_sharded(comm, model_fn, batches, n_servers, optimizer, DEMO_LR)
    backend = "nccl" if comm.device.type == "cuda" else "gloo"
    reference = train_single(model_fn, batches, optimizer, DEMO_LR)
    params = result.get("params")
    if params is None:  # a server of the sharded PS: its shard against the same slice
        servers = servers_of(comm.world_size, n_servers)
        flat = parameters_to_vector(reference[0].values())
        ref_shard = torch.tensor_split(flat, n_servers)[servers.index(comm.rank)]
        params, reference = {"shard": result["shard"]}, ({"shard": ref_shard}, reference[1])
    report = compare_to_reference("ps", backend, comm.world_size, optimizer, params,
                                  result["losses"], reference)
    report.update(n_servers=n_servers)
    return report
