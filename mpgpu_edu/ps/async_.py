"""Asynchronous parameter server with bounded staleness (SSP), as a deterministic event
simulation (the same protocol as an SPMD program on ``comm.recv_any``: ``ps.ssp``).

In a synchronous step every worker waits for the slowest. Asynchronously, nobody waits: each
worker pulls the parameters, computes a gradient, pushes it, and the server applies it the
moment it arrives. The price is *staleness*: by the time a gradient arrives, the server may
have applied s other updates since the worker pulled, so the gradient was computed at
parameters s versions old. The stale synchronous parallel (SSP) bound keeps it in check
without losing work: a worker's *clock* is the number of its gradients applied, and a worker
more than ``staleness_bound`` clocks ahead of the slowest one is *held*: the server keeps its
parameters back until the slowest catches up. Every gradient is applied; none is dropped.
Bound 0 is lockstep (every worker's k-th gradient before anyone's (k+1)-th), an unbounded
server never holds anybody.

Which gradient arrives first depends on timing, and the simulator's threads have no timing
of their own, so this module is an event simulation at the level of the strategy: each
worker's compute time (given, or from FLOPs on the cluster) and the transfer times over its
route to the server (alpha, beta, and the resources the route shares, as the simulator's
replay does) order the events; the updates themselves are real tensor math, applied in that
order with their real staleness. The result is deterministic and carries a ``Trace``.

Roles: the server is the last device; devices ``0 .. N - 2`` are workers. The k-th gradient
the server hands parameters out for (in simulated time; ties go to the lower worker) uses
``batches[k % len(batches)]`` whole, so runs with different numbers of workers see the same
data in the same order.
Dean et al., "Large Scale Distributed Deep Networks" (Downpour SGD), NeurIPS 2012;
Ho et al., "More Effective Distributed ML via a Stale Synchronous Parallel Parameter Server",
NeurIPS 2013.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from mpgpu_edu.comm.flops import FlopCount
from mpgpu_edu.replica.data import Batch, loss_fn
from mpgpu_edu.replica.reference import make_optimizer, named_params
from mpgpu_edu.replica.flat import flat_params, flatten_grads, grads_from_flat, load_flat_params
from mpgpu_edu.cluster.trace import Event, Trace


@dataclass
class AsyncResult:
    """What an asynchronous run did, update by update."""

    losses: list[float]       # loss of the server's parameters on the eval batch, per update
    staleness: list[int]      # staleness of every applied gradient
    workers: list[int]        # which worker sent every applied gradient
    held: int                 # times a worker was held back for being too far ahead
    held_seconds: float       # simulated seconds workers spent held, all together
    seconds: float            # simulated time at which the last update was applied
    trace: Trace
    params: dict[str, torch.Tensor] = field(repr=False, default_factory=dict)

    @property
    def updates_per_second(self) -> float:
        return len(self.staleness) / self.seconds


class Links:
    """Transfers over a cluster's routes: a transfer holds every resource of its route for
    ``nbytes / beta`` and ends ``alpha`` later. That is the simulator's replay model for a
    port that carries one transfer at a time; where the replay shares a resource fairly among
    the transfers crossing it (an NVSwitch port), this model lets them take turns instead.
    Both move the same bytes in the same total time; with the demo model's messages (a few
    KB, tens of nanoseconds of bytes) the order makes no visible difference."""

    def __init__(self, cluster: Any) -> None:
        self.cluster, self.free_at = cluster, {}
        self.events: list[Event] = []

    def transfer(self, src: int, dst: int, nbytes: int, ready: float, label: str) -> float:
        """Schedule a transfer that can start at ``ready``; returns when it arrives."""
        route = self.cluster.route(src, dst)
        start = max([ready] + [self.free_at.get(r, 0.0) for r in route.resources])
        hold = nbytes / route.beta_Bps
        for r in route.resources:
            self.free_at[r] = start + hold
        end = start + route.alpha_s + hold
        self.events.append(Event(src, "comm", "send", start, end, label, nbytes, peer=dst))
        self.events.append(Event(dst, "comm", "recv", start, end, label, nbytes, peer=src))
        return end


def compute_events(device: int, start: float, seconds: float, label: str) -> list[Event]:
    """A gradient's compute as forward (1/3) then backward (2/3), their FLOP ratio."""
    mid = start + seconds / 3
    return [Event(device, "compute", "forward", start, mid, label),
            Event(device, "compute", "backward", mid, start + seconds, label)]


def gradient(model: nn.Module, params: torch.Tensor, batch: Batch) -> torch.Tensor:
    """The flat gradient of the loss on ``batch`` at the flat ``params``."""
    load_flat_params(model, params)
    model.zero_grad(set_to_none=False)
    loss_fn(model(batch[0]), batch[1]).backward()
    return flatten_grads(list(model.parameters()))


def gradient_seconds(cluster: Any, model: nn.Module, batch: Batch) -> float:
    """Time of one gradient on the cluster's device: its forward and backward FLOPs."""
    with FlopCount() as counter:
        loss_fn(model(batch[0]), batch[1]).backward()
    model.zero_grad(set_to_none=False)
    return cluster.compute_seconds(counter.total)


class AsyncRun:
    """The state of one asynchronous run: the server's model and optimizer, one replica per
    worker, the event queue ``(time, worker, gradient number, what, payload)``, the links."""

    def __init__(self, cluster: Any, model_fn: Callable[[], nn.Module],
                 batches: Sequence[Batch], worker_seconds: Sequence[float],
                 staleness_bound: int, optimizer: str, lr: float, server_seconds: float,
                 eval_batch: Batch) -> None:
        self.cluster, self.batches, self.eval_batch = cluster, batches, eval_batch
        self.worker_seconds, self.bound = list(worker_seconds), staleness_bound
        self.server, self.server_seconds = cluster.world_size - 1, server_seconds
        self.master = model_fn()
        self.optimizer = make_optimizer(optimizer, self.master.parameters(), lr)
        self.replicas = [model_fn() for _ in self.worker_seconds]
        flat = flat_params(self.master)
        self.nbytes = flat.numel() * flat.element_size()
        self.links, self.events = Links(cluster), []
        self.queue: list[tuple[float, int, int, str, Any]] = []
        self.version, self.server_free, self.handed_out = 0, 0.0, 0
        self.clock = [0] * len(self.worker_seconds)  # gradients applied, per worker
        self.waiting: dict[int, float] = {}  # held workers -> since when
        self.result = AsyncResult([], [], [], 0, 0.0, 0.0, Trace(cluster.world_size))

    def start_gradient(self, w: int, at: float) -> None:
        """Worker w has the current parameters at ``at``: it computes its next gradient."""
        k = self.handed_out
        grad = gradient(self.replicas[w], flat_params(self.master),
                        self.batches[k % len(self.batches)])
        self.events.extend(compute_events(w, at, self.worker_seconds[w], f"gradient {k}"))
        done = at + self.worker_seconds[w]
        heapq.heappush(self.queue, (done, w, k, "computed", (grad, self.version)))
        self.handed_out += 1

    def step(self) -> None:
        """Handle the next event: a gradient computed (send it) or arrived (apply it, then
        send the parameters back unless the worker is too far ahead of the slowest)."""
        t, w, k, what, (grad, pulled) = heapq.heappop(self.queue)
        if what == "computed":
            arrive = self.links.transfer(w, self.server, self.nbytes, t, f"gradient {k}")
            heapq.heappush(self.queue, (arrive, w, k, "arrived", (grad, pulled)))
            return
        begin = max(t, self.server_free)  # the server applies gradients one at a time
        self.server_free = begin + self.server_seconds
        staleness = self.version - pulled
        self.apply(w, grad, staleness)
        self.clock[w] += 1
        self.events.append(Event(self.server, "compute", "optimizer", begin, self.server_free,
                                 f"apply gradient {k} of worker {w} (staleness {staleness})"))
        self.waiting[w] = self.server_free
        for v in sorted(self.waiting):  # w, and any held worker the slowest now lets go
            if self.clock[v] - min(self.clock) <= self.bound:
                self.release(v)

    def release(self, w: int) -> None:
        """Send worker w the current parameters; it starts its next gradient on arrival."""
        since = self.waiting.pop(w)
        if self.server_free > since:
            self.result.held += 1
            self.result.held_seconds += self.server_free - since
        back = self.links.transfer(self.server, w, self.nbytes, self.server_free,
                                   f"parameters v{self.version}")
        self.start_gradient(w, back)

    def apply(self, w: int, grad: torch.Tensor, staleness: int) -> None:
        apply_gradient(self.master, self.optimizer, grad)
        self.version += 1
        self.result.staleness.append(staleness)
        self.result.workers.append(w)
        self.result.losses.append(evaluate(self.master, self.eval_batch))
        self.result.seconds = self.server_free

    def finish(self) -> AsyncResult:
        """The run ends with its last update: work still in flight is cut off there."""
        end = self.result.seconds
        kept = [replace(e, end=min(e.end, end)) for e in self.events + self.links.events
                if e.start < end]
        self.result.trace = Trace(self.cluster.world_size,
                                  sorted(kept, key=lambda e: (e.start, e.device)),
                                  meta={"cluster": getattr(self.cluster, "name", ""),
                                        "strategy": "async parameter server"})
        self.result.params = named_params(self.master)
        return self.result


def async_ps(cluster: Any, model_fn: Callable[[], nn.Module], batches: Sequence[Batch],
             updates: int, worker_seconds: Sequence[float] | None = None,
             staleness_bound: int = 4, optimizer: str = "sgd", lr: float = 0.05,
             server_seconds: float = 0.0, eval_batch: Batch | None = None) -> AsyncResult:
    """Run the asynchronous parameter server on ``cluster`` until ``updates`` gradients have
    been applied.

    ``worker_seconds[w]`` is worker w's time for one gradient (default: its FLOPs on the
    cluster, the same for all); ``server_seconds`` the server's time to apply one.
    Losses are measured on ``eval_batch`` (default: the first batch) after every update."""
    n_workers = cluster.world_size - 1
    if n_workers < 1:
        raise ValueError("an asynchronous parameter server needs at least 2 devices "
                         f"(a server and a worker), got {cluster.world_size}")
    if worker_seconds is not None and len(worker_seconds) != n_workers:
        raise ValueError(f"worker_seconds needs one time per worker ({n_workers}), "
                         f"got {len(worker_seconds)}")
    if worker_seconds is None:
        worker_seconds = [gradient_seconds(cluster, model_fn(), batches[0])] * n_workers
    run = AsyncRun(cluster, model_fn, batches, worker_seconds, staleness_bound, optimizer, lr,
                   server_seconds, eval_batch if eval_batch is not None else batches[0])
    for w in range(n_workers):
        run.start_gradient(w, 0.0)
    while len(run.result.staleness) < updates:
        run.step()
    return run.finish()


def apply_gradient(model: nn.Module, optimizer: torch.optim.Optimizer,
                   grad: torch.Tensor) -> None:
    grads_from_flat(list(model.parameters()), grad)
    optimizer.step()


def evaluate(model: nn.Module, batch: Batch) -> float:
    with torch.no_grad():
        return loss_fn(model(batch[0]), batch[1]).item()


def sync_ps_step_seconds(cluster: Any, worker_seconds: Sequence[float], nbytes: int,
                         server_seconds: float = 0.0) -> float:
    """Time of one *synchronous* step with the same costs: every worker computes, the
    gradients cross the server's link in turn (``Links``), the server applies their sum once
    all are in, and sends the parameters back to each; the step ends when the last worker
    has them."""
    server, links = cluster.world_size - 1, Links(cluster)
    arrived = [links.transfer(w, server, nbytes, s, "gradient")
               for w, s in enumerate(worker_seconds)]
    applied = max(arrived) + server_seconds
    return max(links.transfer(server, w, nbytes, applied, "parameters")
               for w in range(len(worker_seconds)))
