"""Lesson 02's demos: a parameter server, its one link, its shards, and stale updates.

- ``run_demo``: ``ps.run_demo`` (the parameter server against one device on the demo model).
- ``ps_step_on_meta`` / ``run_ps_step``: one synchronous step of the package's parameter
  server (``mpgpu_edu.ps``, one server or K shards) on meta tensors: shapes without data, so
  a model of millions of parameters costs no memory and the timeline is exact.
- ``link_seconds``: how long a device's link was busy receiving (or sending).
- ``sync_with_stragglers``: synchronous steps where the workers differ in speed, to set
  beside the asynchronous server (``mpgpu_edu.ps.async_ps``) with the same costs.
- ``run_async`` / ``update_times``: the asynchronous server on the demo model, and when each
  of its updates was applied.
- ``plot_loss_curves``: loss against updates (and against simulated time).
- ``one_torch_thread``: the context the demos run in (why: its docstring).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping, Sequence

import torch
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from mpgpu_edu import ps
from mpgpu_edu.cluster import Cluster
from mpgpu_edu.comm import Communicator, LaunchResult, launch
from mpgpu_edu.data import DEMO_BATCH, DEMO_SIZES, Workload, make_batches, make_mlp
from mpgpu_edu.dp.dataparallel import flat_params
from mpgpu_edu.lessons.l01 import first_devices
from mpgpu_edu.trace import Trace
from mpgpu_edu.viz.palette import FONT_SIZE, format_seconds, new_figure, series_color, style

FORWARD_SHARE = 1 / 3  # backward costs about twice the forward: 2 of every 3 FLOPs
# Solid and thick, then dashed and thin on top: two curves that coincide both stay visible.
LINE_STYLES = (("-", 2.6), ("--", 1.6))


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

def run_demo(world_size: int, steps: int, optimizer: str) -> dict:
    """``ps.run_demo`` on the simulator: ``world_size - 1`` workers and a server train the
    demo model for ``steps`` steps; the report compares with one device (``train_single``)."""
    with one_torch_thread():
        return ps.run_demo("sim", world_size, steps, optimizer)


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
              server_seconds: float = 0.0, n_batches: int = 40) -> ps.AsyncResult:
    """The asynchronous parameter server (``ps.async_ps``) training the demo model on the
    first ``len(worker_seconds) + 1`` devices of ``cluster`` (all of them by default) until
    ``updates`` gradients were applied, each computed on a whole demo batch."""
    n = None if worker_seconds is None else len(worker_seconds) + 1
    batches = make_batches(n_batches, DEMO_BATCH, DEMO_SIZES[0], DEMO_SIZES[-1])
    with one_torch_thread():
        return ps.async_ps(first_devices(cluster, n), functools.partial(make_mlp, DEMO_SIZES),
                           batches, updates, worker_seconds=worker_seconds,
                           staleness_bound=staleness_bound, lr=lr,
                           server_seconds=server_seconds)


def update_times(result: ps.AsyncResult) -> list[float]:
    """The simulated time at which each of the result's updates was applied (the end of
    the server's "apply" events), one per loss in ``result.losses``."""
    server = result.trace.n_devices - 1
    times = [e.end for e in result.trace.on(server, "compute", "optimizer")
             if e.label.startswith("apply")]
    # The trace ends with the last update; an update that takes no time ends there too and
    # is not kept as an event.
    return times + [result.seconds] * (len(result.losses) - len(times))


# ---- loss curves ------------------------------------------------------------------------------

def plot_loss_curves(curves: Mapping[str, Sequence[float]], *,
                     times: Mapping[str, Sequence[float]] | None = None,
                     title: str | None = None, log: bool = True) -> Figure:
    """Loss against update, one line per run (``{label: losses}``); every second line is
    dashed and thinner, so two runs that coincide both stay visible. With ``times``
    (``{label: the time of each update}``, same labels) a second panel shows the loss
    against simulated time."""
    panels = 2 if times else 1
    fig = new_figure(5.2 * panels + 2.2, 3.8)
    axes = fig.subplots(1, panels, sharey=True, squeeze=False)[0]
    for i, (label, losses) in enumerate(curves.items()):
        dashes, width = LINE_STYLES[i % len(LINE_STYLES)]
        look = {"color": series_color(i), "linestyle": dashes, "linewidth": width,
                "label": label}
        axes[0].plot(range(1, len(losses) + 1), losses, **look)
        if times:
            axes[1].plot(times[label], losses, **look)
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_xlabel("update (optimizer steps applied)")
    axes[0].set_ylabel("training loss" + (" (log scale)" if log else ""))
    if times:
        axes[1].set_xlabel("simulated time")
        axes[1].xaxis.set_major_formatter(FuncFormatter(lambda t, _pos: format_seconds(t)))
        axes[1].set_title("against time", loc="left", fontsize=FONT_SIZE)
        axes[0].set_title("against updates", loc="left", fontsize=FONT_SIZE)
    for ax in axes:
        if log:
            ax.set_yscale("log")
        style(ax)
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
                    fontsize=FONT_SIZE - 1)
    fig.suptitle(title or "training loss", x=0.01, ha="left", fontsize=FONT_SIZE + 1)
    return fig
