"""Lesson 08, fitting bigger models: sharded training (ZeRO-3 / FSDP) from scratch. (Lesson
09's remedies, recomputation, accumulation, mixed precision and interleaving, are in
``memory_for_time``.)

The sharded demos take a wrapper with lesson 08's contract (``wrap(comm, module, prefetch)``:
the learner's ``wrap_fsdp`` once its check passes, else the package's
``mpgpu_edu.dp.fsdp.wrap_fsdp``) and run it on the simulator. Memory over time comes from the
package's wrapper, which records what it holds in each rank's ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives import all_reduce
from mpgpu_edu.comm import Communicator, LaunchResult, launch
from mpgpu_edu.comm.base import RESERVED_TAG
from mpgpu_edu.replica.data import loss_fn, make_batches, make_mlp, shard
from mpgpu_edu.dp import fsdp
from mpgpu_edu.cluster.trace import Event, Trace

Wrap = Callable[[Communicator, nn.Sequential, bool], Any]

SHARDED_SIZES = (256, 512, 512, 512, 256)  # 4 Linear layers, 0.9 M parameters
SHARDED_BATCH = 256
SHARDED_CLUSTER = "8xA100-nvlink"


def reference_wrap() -> Wrap:
    """The package's sharded wrapper (``dp.fsdp.wrap_fsdp``), for ``mp.yours``."""
    return fsdp.wrap_fsdp


# ---- one sharded step, and training ---------------------------------------------------------

def sharded_step(comm: Communicator, wrap: Wrap, model: nn.Sequential,
                 batch: tuple[torch.Tensor, torch.Tensor], prefetch: bool) -> float:
    """SPMD: wrap ``model``, then one step on this rank's shard of ``batch`` (forward, backward,
    ``finish``, SGD). The wrapping is setup (untimed); a barrier starts the step; the loss is a
    region of its own (``"compute"``, ``"loss"``), which ``step_only`` uses to tell forward
    from backward in any wrapper's timeline."""
    with comm.compute("setup", "wrap the model", seconds=0):  # once, not part of the step
        replica = wrap(comm, model, prefetch)
        optimizer = torch.optim.SGD(list(replica.parameters()), lr=0.01)
        (x, y), part = shard(batch, comm.rank, comm.world_size)
    comm.barrier()  # every rank has its shards: the step starts here
    out = replica(x)
    with comm.compute("compute", LOSS):
        loss = loss_fn(out, y) * part * comm.world_size
    loss.backward()
    replica.finish()
    with comm.compute("optimizer", "step"):
        optimizer.step()
    return loss.item()


def run_sharded_step(wrap: Wrap, prefetch: bool, world_size: int = 4,
                     cluster: str = SHARDED_CLUSTER) -> LaunchResult:
    """One step of the demo MLP on the first ``world_size`` devices of ``cluster``."""
    machine = Cluster.preset(cluster, visible=",".join(map(str, range(world_size))))
    model = make_mlp(SHARDED_SIZES, seed=0)
    batch = make_batches(1, SHARDED_BATCH, SHARDED_SIZES[0], SHARDED_SIZES[-1], seed=1)[0]
    return launch(sharded_step, machine, wrap, model, batch, prefetch)


def step_only(trace: Trace) -> Trace:
    """The trace of ``sharded_step`` from the end of its barrier on (the wrapping and the
    barrier left out; the first layer's gather kept), with its phases named: on the compute
    rows, work outside a named region (a wrapper that names none, a ReLU, the padding of a
    gradient) becomes ``"forward"`` before the loss and ``"backward"`` after it, so every
    wrapper's timeline reads the same."""
    start = _barrier_end(trace)
    events = [replace(_phase_named(e, trace), start=max(e.start, start) - start,
                      end=e.end - start)
              for e in trace.events if e.end > start and not _is_barrier(e)]
    memory = [replace(m, time=max(m.time, start) - start) for m in trace.memory]
    return Trace(trace.n_devices, events, memory, trace.source, dict(trace.meta))


LOSS = "loss"


def _is_barrier(event: Event) -> bool:
    """The barrier's messages are the only ones with reserved tags (``comm.barrier``)."""
    words = event.label.split()
    return (len(words) == 2 and words[0] == "tag" and words[1].isdigit()
            and int(words[1]) >= RESERVED_TAG)


def _barrier_end(trace: Trace) -> float:
    return max((e.end for e in trace.events if _is_barrier(e)), default=0.0)


def _phase_named(event: Event, trace: Trace) -> Event:
    if event.stream != "compute" or event.kind != "compute" or event.label == LOSS:
        return event
    loss = [e for e in trace.on(event.device, "compute") if e.label == LOSS]
    if not loss:
        return event
    return replace(event, kind="forward" if event.end <= loss[0].start else "backward")


def phase_summary(step: Trace, device: int = 0) -> dict[str, float]:
    """Of a ``step_only`` trace, on ``device``: when forward and backward end (seconds from
    the step's start) and how long its compute row idles in each (forward: up to the loss;
    backward: from the loss to backward's end)."""
    compute = sorted(step.on(device, "compute"), key=lambda e: e.start)
    loss = next(e for e in compute if e.label == LOSS)
    forward_end = max(e.end for e in compute if e.kind == "forward")
    backward_end = max(e.end for e in compute if e.kind == "backward")

    def busy(lo: float, hi: float) -> float:
        return sum(max(0.0, min(e.end, hi) - max(e.start, lo)) for e in compute)
    return {"forward_end": forward_end, "backward_end": backward_end,
            "idle_forward": loss.start - busy(0.0, loss.start),
            "idle_backward": (backward_end - loss.end) - busy(loss.end, backward_end)}


def allreduce_bytes(comm: Communicator, model: nn.Sequential) -> int:
    """SPMD: what DDP sends per step for ``model``: one ring all-reduce of every parameter,
    flattened. Returns the bytes this rank sent."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    before = comm.stats.bytes_sent
    all_reduce(comm, flat, "mean")
    return comm.stats.bytes_sent - before
