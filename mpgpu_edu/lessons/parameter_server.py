"""Lesson 02's demos: a parameter server, its one link, its shards, and stale updates.

- ``run_demo``: ``ps.run_demo`` (the parameter server against one device on the demo model),
  with the signature of every strategy's demo (``mpgpu_edu.cli.runners``).
- ``ps_step_on_meta`` / ``run_ps_step``: one synchronous step of the package's parameter
  server (``mpgpu_edu.ps``, one server or K shards) on meta tensors: shapes without data, so
  a model of millions of parameters costs no memory and the timeline is exact.
- ``ps_program`` / ``run_ps_program``: a whole synchronous parameter server on meta tensors
  with the worker's step and the server's loop passed in (yours, once they pass their
  checks: ``mp.yours("2.1", ...)``, ``mp.yours("2.3", ...)``); ``ps_explorer``: its
  timeline, redrawn as a slider changes the number of workers.
- ``sharded_program`` / ``run_sharded_program``: the parameter server sharded over every
  rank, with the sharded step passed in (exercise 2.4).
- ``link_seconds``: how long a device's link was busy receiving (or sending);
  ``setup_seconds``: a device's compute before its first message (the program's setup);
  ``worker_compute_parts``: where a worker's compute time goes (FLOPs, kernel launches,
  memory-bound work), to see why it does not shrink like its share of the batch.
- from ``mpgpu_edu.ps.staleness`` (see there): the synchronous server with stragglers, the
  asynchronous one with a staleness bound, averaged over seeds, and SSP as an SPMD program;
  from ``mpgpu_edu.viz.server``: the figures; ``one_torch_thread`` (``comm.torch_threads``):
  the context the demos run in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu import ps
from mpgpu_edu.cluster import Cluster, first_devices
from mpgpu_edu.comm import Communicator, LaunchResult, launch
from mpgpu_edu.comm.torch_threads import one_torch_thread
from mpgpu_edu.replica.data import Workload, shard
from mpgpu_edu.replica.flat import flat_params, flatten_grads
from mpgpu_edu.replica.loop import forward_backward
from mpgpu_edu.ps.staleness import (demo_numel, mean_curve, run_async,  # noqa: F401 - for
                                    run_async_seeds, run_ssp, run_sync,  # the notebook
                                    smoothed, sync_with_stragglers, update_times)
from mpgpu_edu.cluster.trace import Trace
from mpgpu_edu.viz.palette import format_seconds
from mpgpu_edu.viz.server import (comm_window, plot_comm_windows,  # noqa: F401 - for the
                                  plot_loss_curves, plot_role_timelines)  # notebook
from mpgpu_edu.viz.timeline import plot_timeline

StepFn = Callable[..., None]

# ---- the synchronous server: against one device, then on meta tensors ---------------------

def run_demo(backend: str, world_size: int, steps: int, optimizer: str,
             **options: Any) -> dict:
    """``ps.run_demo`` on one torch thread: ``world_size - 1`` workers and a server train the
    demo model for ``steps`` steps; the report compares with one device (``train_single``)."""
    with one_torch_thread():
        return ps.run_demo(backend, world_size, steps, optimizer, **options)


def ps_step_on_meta(comm: Communicator, workload: Workload, n_servers: int = 1) -> None:
    """Every rank: one synchronous parameter-server step of ``workload`` on meta tensors.
    The last ``n_servers`` ranks are servers (``ps.ps_step``; sharded with
    ``ps.ps_step_sharded`` when ``n_servers > 1``), the others workers, each on its shard of
    the workload's batch."""
    model = workload.model("meta")
    batch = workload.make_batch("meta")
    servers = ps.servers_of(comm.world_size, n_servers)
    is_server = comm.rank in servers
    if n_servers == 1:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1) if is_server else None
        ps.ps_step(comm, model, optimizer, batch)
        return
    if not is_server:
        ps.ps_step_sharded(comm, model, None, batch, n_servers)
        return
    mine = torch.tensor_split(flat_params(model), n_servers)[servers.index(comm.rank)]
    shard = mine.clone().requires_grad_()
    ps.ps_step_sharded(comm, shard, torch.optim.SGD([shard], lr=0.1), batch, n_servers)


def run_ps_step(workload: Workload, cluster: Cluster | str, world_size: int,
                n_servers: int = 1) -> LaunchResult:
    """``ps_step_on_meta`` on the first ``world_size`` devices of ``cluster``: ranks
    ``world_size - n_servers ..`` are the servers."""
    ps.check_ps_world(world_size, n_servers)
    with one_torch_thread():
        return launch(ps_step_on_meta, first_devices(cluster, world_size), workload, n_servers)


# ---- the course's own answers to exercises 2.1, 2.3 and 2.4 (what demos run until yours pass) --

def reference_worker_step(comm: Communicator, params: torch.Tensor, grad: torch.Tensor,
                          server: int) -> None:
    """Exercise 2.1's contract: the gradient up to ``server``, the parameters back."""
    comm.send(grad, server)
    comm.recv(params, server)


def reference_server_loop(comm: Communicator, params: torch.Tensor, steps: int,
                          lr: float) -> None:
    """Exercise 2.3's contract: per step, every worker's gradient as it arrives, one SGD
    update with their mean, the parameters back to every worker."""
    workers = [r for r in range(comm.world_size) if r != comm.rank]
    buffer = torch.empty_like(params)
    for _step in range(steps):
        total, waiting = torch.zeros_like(params), list(workers)
        while waiting:
            waiting.remove(comm.recv_any(buffer, waiting))
            total.add_(buffer)
        params.sub_(total / len(workers), alpha=lr)
        for work in [comm.isend(params, w) for w in workers]:
            work.wait()


def reference_sharded_step(comm: Communicator, params: torch.Tensor, grad: torch.Tensor,
                           lr: float) -> None:
    """Exercise 2.4's contract: rank r averages and updates shard r
    (``torch.tensor_split``), then every rank gathers every updated shard."""
    n, me = comm.world_size, comm.rank
    others = [r for r in range(n) if r != me]
    grads, shards = torch.tensor_split(grad, n), torch.tensor_split(params, n)
    inbox = {r: torch.empty_like(grads[me]) for r in others}
    works = [comm.isend(grads[r].contiguous(), r) for r in others]
    works += [comm.irecv(inbox[r], r) for r in others]
    for work in works:
        work.wait()
    shards[me].sub_((grads[me] + sum(inbox.values(), torch.zeros_like(grads[me]))) / n,
                    alpha=lr)
    mine = shards[me].clone()
    got = {r: torch.empty_like(shards[r]) for r in others}
    works = [comm.isend(mine, r) for r in others]
    works += [comm.irecv(got[r], r) for r in others]
    for work in works:
        work.wait()
    for r in others:
        shards[r].copy_(got[r])


# ---- the learner's parameter server, whole: worker step and server loop -----------------------

def ps_program(comm: Communicator, workload: Workload, worker_step: StepFn,
               server_loop: StepFn, steps: int = 2, lr: float = 0.1) -> None:
    """Every rank: ``steps`` synchronous steps of a parameter server on meta tensors. The
    last rank serves with ``server_loop(comm, params, steps, lr)``; every other rank is a
    worker: forward and backward on its shard of the batch, then
    ``worker_step(comm, params, grad, server)`` with the flat gradient."""
    server = comm.world_size - 1
    model = workload.model("meta")
    params = flat_params(model)
    if comm.rank == server:
        server_loop(comm, params, steps, lr)
        return
    (x, y), share = shard(workload.make_batch("meta"), comm.rank, server, who="workers")
    for _step in range(steps):
        forward_backward(comm, model, x, y, share)
        worker_step(comm, params, flatten_grads(list(model.parameters())), server)
        model.zero_grad(set_to_none=False)


def run_ps_program(workload: Workload, cluster: Cluster | str, world_size: int,
                   worker_step: StepFn, server_loop: StepFn, steps: int = 2) -> LaunchResult:
    """``ps_program`` on the first ``world_size`` devices of ``cluster``."""
    ps.check_ps_world(world_size)
    with one_torch_thread():
        return launch(ps_program, first_devices(cluster, world_size), workload, worker_step,
                      server_loop, steps)


def sharded_program(comm: Communicator, workload: Workload, sharded_step: StepFn,
                    steps: int = 1, lr: float = 0.1) -> None:
    """Every rank a worker and the server of one shard: forward and backward on its 1/N of
    the batch, then ``sharded_step(comm, params, grad, lr)``, on meta tensors."""
    model = workload.model("meta")
    params = flat_params(model)
    (x, y), share = shard(workload.make_batch("meta"), comm.rank, comm.world_size)
    for _step in range(steps):
        forward_backward(comm, model, x, y, share)
        sharded_step(comm, params, flatten_grads(list(model.parameters())), lr)
        model.zero_grad(set_to_none=False)


def run_sharded_program(workload: Workload, cluster: Cluster | str, world_size: int,
                        sharded_step: StepFn, steps: int = 1) -> LaunchResult:
    """``sharded_program`` on the first ``world_size`` devices of ``cluster``."""
    with one_torch_thread():
        return launch(sharded_program, first_devices(cluster, world_size), workload,
                      sharded_step, steps)


def ps_view(workers: int = 3, *, workload: Workload, cluster: Cluster | str,
            worker_step: StepFn, server_loop: StepFn, steps: int = 2) -> tuple[Any, dict]:
    """The timeline of ``ps_program`` with ``workers`` workers and a server (the last row),
    titled with whose code ran; ``info``: ``total_s`` (all steps), ``step_s`` (their mean),
    ``first_step_s`` (``first_step_seconds``), ``server_recv_s`` (the server's link
    receiving, per step)."""
    run = run_ps_program(workload, cluster, workers + 1, worker_step, server_loop, steps)
    trace = run.trace
    info = {"workers": workers, "step_s": trace.makespan / steps, "total_s": trace.makespan,
            "first_step_s": first_step_seconds(trace),
            "server_recv_s": link_seconds(trace, workers, "recv") / steps}
    names = [f"worker {w}" for w in range(workers)] + ["server"]
    whose = [getattr(fn, "label", None) for fn in (worker_step, server_loop)]
    title = "\n".join([f"{steps} steps, {workers} worker(s) and a server"]
                      + [w for w in whose if w])
    fig = plot_timeline(trace, device_names=names, title=title)
    return fig, info


def role_names(world_size: int, n_servers: int = 1) -> list[str]:
    """Row names for a parameter-server timeline: "worker r", and "server r" for the last
    ``n_servers`` ranks ("server" alone when there is one)."""
    servers = ps.servers_of(world_size, n_servers)
    if n_servers == 1:
        return [f"worker {r}" for r in range(world_size - 1)] + ["server"]
    return [f"server {r}" if r in servers else f"worker {r}" for r in range(world_size)]


def first_step_seconds(trace: Trace) -> float:
    """When the first step of a one-server run ended: the moment the last worker had the
    parameters of step 1 (the end of the server's first N - 1 sends). The workers' own
    elementwise work after that (zeroing their gradients) is not counted, so a one-step run's
    makespan is a little longer. The sends share the server's port and end together, so no
    worker starts its next step early."""
    server = trace.n_devices - 1
    sends = sorted(trace.on(server, "comm", "send"), key=lambda e: e.start)[:server]
    return max((e.end for e in sends), default=trace.makespan)


def ps_explorer(workload: Workload, cluster: Cluster | str, worker_step: StepFn,
                server_loop: StepFn, workers: int = 3) -> Any:
    """A slider over the number of workers (1 .. 7) redrawing ``ps_view``."""
    from mpgpu_edu.explore.live import Explorer, slider

    def describe(info: dict) -> str:
        return (f"<b>{info['workers']} worker(s)</b>: two steps "
                f"{format_seconds(info['total_s'])}, the first ends at "
                f"{format_seconds(info['first_step_s'])}; the server's link receives for "
                f"{format_seconds(info['server_recv_s'])} a step")

    fixed = {"workload": workload, "cluster": cluster, "worker_step": worker_step,
             "server_loop": server_loop}
    return Explorer(ps_view, {"workers": slider("workers", workers, 1, 7)}, describe,
                    fixed=fixed)


def link_seconds(trace: Trace, device: int, kind: str = "recv") -> float:
    """Seconds during which ``device``'s link was busy with ``kind`` ("recv" or "send")
    events; overlapping messages count once."""
    if kind not in ("recv", "send"):
        raise ValueError(f"kind must be 'recv' or 'send', not {kind!r}")
    total, reach = 0.0, 0.0
    for event in trace.on(device, "comm", kind):
        start = max(event.start, reach)
        if event.end > start:
            total += event.end - start
        reach = max(reach, event.end)
    return total


def setup_seconds(trace: Trace, device: int) -> float:
    """Seconds of elementwise work (kind "compute") that ``device`` does before anything
    else (a forward pass or a message): the program's setup. A ``ps_program`` rank writes its
    model's initial weights and copies them into one flat vector; the server also zeroes its
    running sum."""
    others = [e.start for e in trace.events if e.device == device and e.kind != "compute"]
    first = min(others, default=trace.makespan)
    return sum(min(e.end, first) - e.start for e in trace.on(device, "compute", "compute")
               if e.start < first)


def worker_compute_parts(workload: Workload, cluster: Cluster | str, workers: int,
                         worker: int = 0) -> dict[str, float]:
    """Where a ``ps_program`` worker's forward and backward time goes, with ``workers``
    workers sharing ``workload``'s batch. The simulator times every kernel as
    ``max(flops / (peak * efficiency), bytes / memory bandwidth) + launch overhead``, so:

    - ``"flops_s"``: the FLOPs over peak times efficiency; shrinks with the batch share;
    - ``"launch_s"``: ``kernels`` times the launch overhead, whatever the batch size;
    - ``"memory_s"``: what the kernels' bytes took beyond their FLOP time (reading the
      weights is the same for 74 samples as for 512);
    - ``"samples"``, ``"kernels"``: the worker's share of the batch, its kernel count.

    Their sum is the worker's forward and backward time in ``run_ps_program``'s trace.
    Elementwise work on the whole parameter vector (setup, flattening the gradient, zeroing
    it) comes on top, and does not depend on the batch either."""
    from mpgpu_edu.comm.flops import FlopCount
    from mpgpu_edu.replica.data import loss_fn

    machine = first_devices(cluster, workers + 1)
    model = workload.model("meta")
    (x, y), share = shard(workload.make_batch("meta"), worker, workers, who="workers")
    with FlopCount(machine) as counter:
        loss = loss_fn(model(x), y)
        (loss * share).backward()
    launch_s = counter.kernels * machine.launch_overhead_s
    return {"flops_s": machine.flop_seconds(counter.total), "launch_s": launch_s,
            "memory_s": counter.memory_extra_s, "samples": len(x),
            "kernels": counter.kernels}
