"""Lesson 02's demos: a parameter server, its one link, its shards, and stale updates.

- ``run_demo``: ``ps.run_demo`` (the parameter server against one device on the demo model),
  with the signature of every strategy's demo (``mpgpu_edu.runners``).
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
- ``sync_with_stragglers``: synchronous steps where the workers differ in speed, to set
  beside the asynchronous server (``mpgpu_edu.ps.async_ps``) with the same costs.
- ``run_async`` / ``update_times``: the asynchronous server with a staleness bound (SSP) on
  the demo model, and when each of its updates was applied; ``run_async_seeds``,
  ``mean_curve`` and ``smoothed``: the same over several seeds, averaged, for curves that a
  single noisy run cannot give; ``run_ssp``: the same protocol as an SPMD program
  (``ps.ssp_program``) on the simulator, to see who waits.
- ``plot_loss_curves``, ``plot_comm_windows``, ``plot_role_timelines``: figures, from
  ``mpgpu_edu.viz.server``.
- ``one_torch_thread``: the context the demos run in (why: its docstring).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from mpgpu_edu import ps
from mpgpu_edu.cluster import Cluster
from mpgpu_edu.comm import Communicator, LaunchResult, launch
from mpgpu_edu.data import DEMO_BATCH, DEMO_SIZES, Workload, make_batches, make_mlp, shard
from mpgpu_edu.dp.dataparallel import flat_params
from mpgpu_edu.dp.ddp import flatten_grads, forward_backward
from mpgpu_edu.lessons.communication import first_devices
from mpgpu_edu.trace import Trace
from mpgpu_edu.viz.palette import format_seconds
from mpgpu_edu.viz.server import (comm_window, plot_comm_windows, plot_loss_curves,
                                  plot_role_timelines)
from mpgpu_edu.viz.timeline import plot_timeline

StepFn = Callable[..., None]

SEED_STRIDE = 1000  # run_async's seed s uses batch seeds 1000 s, 1000 s + 1, ..: no overlap
FORWARD_SHARE = 1 / 3  # backward costs about twice the forward: 2 of every 3 FLOPs


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run torch's kernels on one thread from here on (the count is not raised again).

    The simulator runs every rank as a thread of this process, and the demo tensors are
    small: two OpenMP threads per tiny op, times several ranks, on a laptop's few busy cores
    make every op wait for the others (``torchrun`` sets one thread per process for the same
    reason). Simulated times do not depend on it, only how long you wait for them. The count
    stays at one afterwards: raising it again left OpenMP threads spinning, which slowed every
    later op of the process."""
    torch.set_num_threads(1)
    yield


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
    from mpgpu_edu.data import loss_fn

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


# ---- synchronous against asynchronous, with stragglers ----------------------------------------

def sync_with_stragglers(comm: Communicator, worker_seconds: Sequence[float], numel: int,
                         steps: int, server_seconds: float = 0.0) -> None:
    """Synchronous parameter server, costs given: the last rank is the server, worker ``w``
    computes a gradient in ``worker_seconds[w]`` (a third forward, two thirds backward),
    sends ``numel`` fp32 values, and waits for the parameters; the server waits for every
    gradient, updates in ``server_seconds``, and sends the parameters back.
    Cost per step: the slowest worker, plus the server's link, plus the update."""
    server = comm.world_size - 1
    if len(worker_seconds) != server:
        raise ValueError(f"{server} workers need {server} times, got {len(worker_seconds)}")
    message = torch.empty(numel, dtype=torch.float32, device="meta")
    for step in range(steps):
        if comm.rank == server:
            inbox = [torch.empty_like(message) for _ in range(server)]
            for work in [comm.irecv(buf, w) for w, buf in enumerate(inbox)]:
                work.wait()
            with comm.compute("optimizer", f"update {step}", seconds=server_seconds):
                pass
            for work in [comm.isend(message, w) for w in range(server)]:
                work.wait()
            continue
        seconds = worker_seconds[comm.rank]
        with comm.compute("forward", f"F{step}", seconds=seconds * FORWARD_SHARE):
            pass
        with comm.compute("backward", f"B{step}", seconds=seconds * (1 - FORWARD_SHARE)):
            pass
        comm.send(message, server)
        comm.recv(message, server)


def demo_numel() -> int:
    """Parameters of the demo model (``data.DEMO_SIZES``): what every message carries."""
    return sum(a * b + b for a, b in zip(DEMO_SIZES, DEMO_SIZES[1:]))


def run_sync(cluster: Cluster | str, worker_seconds: Sequence[float], steps: int,
             server_seconds: float = 0.0) -> LaunchResult:
    """``sync_with_stragglers`` for the demo model on ``len(worker_seconds) + 1`` devices."""
    machine = first_devices(cluster, len(worker_seconds) + 1)
    with one_torch_thread():
        return launch(sync_with_stragglers, machine, list(worker_seconds), demo_numel(),
                      steps, server_seconds)


def run_async(cluster: Cluster | str, staleness_bound: int, updates: int, *,
              worker_seconds: Sequence[float] | None = None, lr: float = 0.05,
              server_seconds: float = 0.0, n_batches: int = 40,
              seed: int = 0) -> ps.AsyncResult:
    """The asynchronous parameter server (``ps.async_ps``) training the demo model on the
    first ``len(worker_seconds) + 1`` devices of ``cluster`` (all of them by default) until
    ``updates`` gradients were applied, each computed on a whole demo batch. ``seed`` picks
    the model's initial weights and the batches (seed 0: the course's usual ones)."""
    n = None if worker_seconds is None else len(worker_seconds) + 1
    batches = make_batches(n_batches, DEMO_BATCH, DEMO_SIZES[0], DEMO_SIZES[-1],
                           seed=SEED_STRIDE * seed)
    with one_torch_thread():
        return ps.async_ps(first_devices(cluster, n),
                           functools.partial(make_mlp, DEMO_SIZES, seed), batches, updates,
                           worker_seconds=worker_seconds, staleness_bound=staleness_bound,
                           lr=lr, server_seconds=server_seconds)


def run_async_seeds(cluster: Cluster | str, staleness_bound: int, updates: int,
                    seeds: Sequence[int], **kwargs: Any) -> list[ps.AsyncResult]:
    """``run_async`` once per seed, with the same settings (``kwargs``)."""
    return [run_async(cluster, staleness_bound, updates, seed=seed, **kwargs)
            for seed in seeds]


def smoothed(values: Sequence[float], window: int) -> list[float]:
    """The trailing moving average of ``values`` over ``window`` of them (fewer at the
    start): update k's value is the mean of updates k - window + 1 .. k."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    out, total = [], 0.0
    for k, v in enumerate(values):
        total += v
        if k >= window:
            total -= values[k - window]
        out.append(total / min(k + 1, window))
    return out


def mean_curve(runs: Sequence[ps.AsyncResult]) -> tuple[list[float], list[float]]:
    """Update by update, the mean over ``runs`` of the time it was applied
    (``update_times``) and of the loss after it; as long as the shortest run."""
    if not runs:
        raise ValueError("mean_curve needs at least one run")
    n = min(len(run.losses) for run in runs)
    times = [update_times(run)[:n] for run in runs]
    mean = lambda columns: [sum(c) / len(c) for c in zip(*columns)]  # noqa: E731
    return mean(times), mean([run.losses[:n] for run in runs])


def run_ssp(cluster: Cluster | str, worker_seconds: Sequence[float], steps: int,
            staleness_bound: int, server_seconds: float | None = None) -> LaunchResult:
    """``ps.ssp_program`` (SSP as SPMD, on ``comm.recv_any``) on the first
    ``len(worker_seconds) + 1`` devices, with messages the size of the demo model's; the
    server spends ``server_seconds`` on each update (``None``: what the simulator measures
    for it)."""
    machine = first_devices(cluster, len(worker_seconds) + 1)
    with one_torch_thread():
        return launch(ps.ssp_program, machine, list(worker_seconds), demo_numel(), steps,
                      staleness_bound, 0.1, server_seconds)


def update_times(result: ps.AsyncResult) -> list[float]:
    """The simulated time at which each of the result's updates was applied (the end of
    the server's "apply" events), one per loss in ``result.losses``."""
    server = result.trace.n_devices - 1
    times = [e.end for e in result.trace.on(server, "compute", "optimizer")
             if e.label.startswith("apply")]
    # The trace ends with the last update; an update that takes no time ends there too and
    # is not kept as an event.
    return times + [result.seconds] * (len(result.losses) - len(times))
