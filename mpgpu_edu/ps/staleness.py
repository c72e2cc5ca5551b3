"""Synchronous against asynchronous parameter servers with stragglers, and bounded staleness
(SSP): lesson 02's programs and runs on the demo model, on the simulator.

- ``sync_with_stragglers``: synchronous steps where the workers differ in speed, to set
  beside the asynchronous server (``ps.async_ps``) with the same costs; ``run_sync``.
- ``run_async`` / ``update_times``: the asynchronous server with a staleness bound on the
  demo model, and when each of its updates was applied; ``run_async_seeds``, ``mean_curve``
  and ``smoothed``: the same over several seeds, averaged, for curves that a single noisy run
  cannot give; ``run_ssp``: the same protocol as an SPMD program (``ps.ssp_program``), to see
  who waits.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from mpgpu_edu import ps
from mpgpu_edu.cluster import Cluster, first_devices
from mpgpu_edu.comm import Communicator, LaunchResult, launch
from mpgpu_edu.comm.torch_threads import one_torch_thread
from mpgpu_edu.replica.data import DEMO_BATCH, DEMO_SIZES, make_batches, make_mlp

SEED_STRIDE = 1000  # run_async's seed s uses batch seeds 1000 s, 1000 s + 1, ..: no overlap
FORWARD_SHARE = 1 / 3  # backward costs about twice the forward: 2 of every 3 FLOPs


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
